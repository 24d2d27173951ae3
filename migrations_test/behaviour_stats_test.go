package migrations_test

// Behaviour of upstream duroxide-pg's migration 0021 (get_instance_stats)
// and of cleanup_schema at 0020 and 0021, proved on the real provider and on every pack
// version from the port of upstream 20 (cleanup_schema at 20) or 21 on.
// Each subtest proves one claim of the checklist in section 5; the comment
// above it gives the claim's number.

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// TestInstanceStats proves the claims of get_instance_stats (from the port
// of upstream 21 on) and then, as the last subtest since it empties the
// schema, those of cleanup_schema at 20 or 21, on one database per target.
func TestInstanceStats(t *testing.T) {
	t.Parallel()
	eachLaterTarget(t, 20, 0, func(t *testing.T, tg laterTarget) {
		fresh := sharedSuite(t, tg.open(t))
		if tg.level >= 21 {
			instanceStatsClaims(t, fresh)
			cleanupSchemaAt21Claims(t, fresh)
		} else {
			cleanupSchemaAt20Claims(t, fresh)
		}
	})
}

func instanceStatsClaims(t *testing.T, fresh func(t *testing.T) *schemaDB) {
	// Claim 27.
	t.Run("get_instance_stats of an unknown instance or NULL returns (false,0,0,0,0,0), which the provider maps to None", func(t *testing.T) {
		h := fresh(t)
		// ghost has history, an execution and KV, but no instances row.
		h.enqueueOrch("ghost", queueMessageItem("ghost", "m"), clock0)
		it := h.mustFetchOrch(clock0, "ghost")
		h.ack(it.Token, clock0+1, turn{History: historyDelta(t, startedEvent("ghost", 1, "P", "1.0.0")),
			Meta: kvMeta(t, nil, kvSet("k", "v", 1))})
		h.seedStore("ghost", 1, 5, "s", "v")
		require.EqualValues(t, 1, h.count("history", "instance_id = 'ghost'"))
		require.Zero(t, h.count("instances", "true"))

		for _, id := range []any{"nobody", nil, "ghost"} {
			rows, err := h.instanceStatsErr(id)
			require.NoError(t, err)
			require.Equal(t, []instanceStats{{}}, rows, "one row (false, 0, 0, 0, 0, 0) for %v", id)
			require.Nil(t, systemStats(rows), "None for %v", id)
		}
	})

	// Claim 28.
	t.Run("an instance with no history returns (true,0,0,0,...); history counts and bytes cover only the current execution", func(t *testing.T) {
		h := fresh(t)
		h.instanceWith("empty", clock0)
		require.Zero(t, h.count("history", "instance_id = 'empty'"))
		rows, err := h.instanceStatsErr("empty")
		require.NoError(t, err)
		require.Equal(t, []instanceStats{{Found: true}}, rows)
		require.Equal(t, &instanceStats{Found: true}, systemStats(rows), "Some, all zero")

		e1 := []hist{{1, startedEvent("multi", 1, "P", "1.0.0")}, {2, eventJSON("multi", 1, 2, "ActivityScheduled", `"name":"A"`)}, {3, `{"pad":"` + strings.Repeat("x", 500) + `"}`}}
		e2 := hist{1, startedEvent("multi", 2, "P", "1.0.0")}
		h.instanceWith("multi", clock0+100, e1...)
		require.Equal(t, instanceStats{Found: true, Events: 3, HistoryBytes: int64(len(e1[0].Data) + len(e1[1].Data) + len(e1[2].Data))}, h.stats("multi"))

		h.nextTurn("multi", clock0+200, turn{ExecutionID: 2, History: histDelta(t, e2), Meta: kvMeta(t, "Running")})
		require.Equal(t, instanceStats{Found: true, Events: 1, HistoryBytes: int64(len(e2.Data))}, h.stats("multi"),
			"execution 1's events are excluded once execution 2 is current")
	})

	// Claim 29.
	t.Run("history_size_bytes is the UTF-8 byte length of event_data: 17 + 76 = 93", func(t *testing.T) {
		h := fresh(t)
		unicode := `{"x":"é€😀"}`
		ascii := `{"pad":"` + strings.Repeat("a", 66) + `"}`
		require.Equal(t, 17, len(unicode))
		require.Equal(t, 11, utf8.RuneCountInString(unicode))
		require.Equal(t, 76, len(ascii))
		h.instanceWith("i1", clock0, hist{1, unicode}, hist{2, ascii})
		require.Equal(t, []string{unicode, ascii}, h.texts(`SELECT event_data FROM duroxide.history WHERE instance_id = 'i1' ORDER BY event_id`),
			"stored verbatim")
		got := h.stats("i1")
		require.EqualValues(t, 2, got.Events)
		require.EqualValues(t, 93, got.HistoryBytes, "bytes, not characters (which would be 87)")
	})

	// Claim 30.
	t.Run("kv_user_key_count counts a kv_store key even when kv_delta tombstones it, and not a tombstone of an unknown key", func(t *testing.T) {
		h := fresh(t)
		h.instanceWith("i1", clock0)
		h.seedStore("i1", 1, 5, "k1", "abc", "k2", "é")
		h.seedDelta("i1", "k2", nil, 10)
		h.seedDelta("i1", "k4", nil, 11)
		require.EqualValues(t, 2, h.stats("i1").KVKeys, "k1, and k2 despite its tombstone; not k4")

		h.seedDelta("i1", "k1", live("abcd"), 12)
		require.EqualValues(t, 2, h.stats("i1").KVKeys, "a key in both tables counts once")
		h.seedDelta("i1", "k3", live(""), 13)
		require.EqualValues(t, 3, h.stats("i1").KVKeys, "an empty value is live")
		require.Equal(t, map[string]string{"k1": "abcd", "k3": ""}, h.getKVAll("i1"), "(the live view has only 2 keys)")

		h.instanceWith("i2", clock0+100)
		h.seedStore("i2", 1, 5, "s1", "1", "s2", "2", "s3", "3")
		for _, k := range []string{"a", "b", "d", "s1"} {
			h.seedDelta("i2", k, live("v"), 20)
		}
		for _, k := range []string{"s2", "c", "zz"} {
			h.seedDelta("i2", k, nil, 21)
		}
		require.EqualValues(t, 6, h.stats("i2").KVKeys, "s1, s2, s3, a, b, d")
	})

	// Claim 31.
	t.Run("kv_total_value_bytes adds the kv_store and kv_delta byte sums: a key in both counts twice, tombstones add 0", func(t *testing.T) {
		h := fresh(t)
		h.instanceWith("i1", clock0)
		h.seedStore("i1", 1, 5, "k1", "abc", "k2", "é")
		h.seedDelta("i1", "k1", live("abcd"), 10)
		h.seedDelta("i1", "k2", nil, 11)
		h.seedDelta("i1", "k3", live(""), 12)
		h.seedDelta("i1", "k4", nil, 13)
		got := h.stats("i1")
		require.EqualValues(t, 9, got.KVBytes, "3 (k1 store) + 2 (é) + 4 (k1 delta) + 0")
		require.EqualValues(t, 3, got.KVKeys)

		h.instanceWith("i2", clock0+100)
		require.Zero(t, h.stats("i2").KVBytes, "no KV rows: 0")
		h.seedDelta("i2", "t", nil, 14)
		require.Zero(t, h.stats("i2").KVBytes, "tombstones only: 0")
	})

	// Claim 32.
	t.Run("queue_pending_count is the length of event 1's top-level carry_forward_events array, 0 otherwise", func(t *testing.T) {
		h := fresh(t)
		started := func(extra string) string {
			return `{"event_id":1,"type":"OrchestrationStarted","name":"P"` + extra + `}`
		}
		cases := []struct {
			instance string
			events   []hist
			want     int64
		}{
			{"array", []hist{{1, started(`,"carry_forward_events":[["inbox","m1"],["inbox","m2"],["inbox","m3"]]`)}}, 3},
			{"empty-array", []hist{{1, started(`,"carry_forward_events":[]`)}}, 0},
			{"missing", []hist{{1, started("")}}, 0},
			{"null", []hist{{1, started(`,"carry_forward_events":null`)}}, 0},
			{"object", []hist{{1, started(`,"carry_forward_events":{"a":1,"b":2}`)}}, 0},
			{"string", []hist{{1, started(`,"carry_forward_events":"[1,2]"`)}}, 0},
			{"nested-under-kind", []hist{{1, `{"event_id":1,"kind":{"carry_forward_events":[1,2]}}`}}, 0},
			{"top-level-array", []hist{{1, `[{"carry_forward_events":[1,2]}]`}}, 0},
			{"no-event-1", []hist{{2, started(`,"carry_forward_events":[1,2]`)}}, 0},
		}
		for i, c := range cases {
			h.instanceWith(c.instance, clock0+int64(i)*100, c.events...)
		}
		// Pending messages in orchestrator_queue are not what is counted.
		h.enqueueOrch("missing", externalItem("missing", "a"), clock0+5_000)
		h.enqueueOrch("missing", externalItem("missing", "b"), clock0+5_000)
		for _, c := range cases {
			require.Equal(t, c.want, h.stats(c.instance).QueuePending, c.instance)
		}
	})

	// Claim 33.
	t.Run("invalid JSON in event 1 makes get_instance_stats fail with 22P02; invalid JSON elsewhere does not", func(t *testing.T) {
		h := fresh(t)
		h.instanceWith("bad-1", clock0, hist{1, `not json`}, hist{2, `{}`})
		_, err := h.instanceStatsErr("bad-1")
		requirePgError(t, err, "22P02", "invalid input syntax for type json")

		good, broken := `{"carry_forward_events":[1]}`, `{broken`
		h.instanceWith("bad-2", clock0+100, hist{1, good}, hist{2, broken})
		require.Equal(t, instanceStats{Found: true, Events: 2, HistoryBytes: int64(len(good) + len(broken)), QueuePending: 1}, h.stats("bad-2"),
			"the other rows are only counted and measured")
	})
}

// populateForCleanup leaves rows in every KV table.
func populateForCleanup(h *schemaDB) {
	h.startInstance("i1", "P", "1.0.0", clock0, "kv_mutations", []any{kvSet("a", "1", clock0)})
	h.nextTurn("i1", clock0+10, turn{Meta: kvMeta(h.t, "Completed")})
	h.startInstance("i2", "P", "1.0.0", clock0+20)
	h.nextTurn("i2", clock0+30, turn{Meta: kvMeta(h.t, nil, kvSet("k", "v", 1), kvClearKey("a"))})
	require.EqualValues(h.t, 1, h.count("kv_store", "true"))
	require.EqualValues(h.t, 2, h.count("kv_delta", "true"))
}

// cleanupSchemaAt21Claims empties the schema: it must come last.
func cleanupSchemaAt21Claims(t *testing.T, fresh func(t *testing.T) *schemaDB) {
	// Claim 35 (at 21).
	t.Run("cleanup_schema at 21 leaves only the four legacy functions and no relations", func(t *testing.T) {
		h := fresh(t)
		populateForCleanup(h)
		require.Contains(t, h.schemaFunctions(), "get_instance_stats(text)")

		h.exec(`SELECT duroxide.cleanup_schema()`)
		require.Empty(t, h.schemaRelations(), "no table, index or sequence of duroxide-pg is left")
		require.Equal(t, legacyFunctions, h.schemaFunctions())
		require.Equal(t, []string{"duroxide"}, h.texts(`SELECT nspname::text FROM pg_catalog.pg_namespace WHERE nspname = 'duroxide'`),
			"the schema itself is not dropped")
	})
}

// cleanupSchemaAt20Claims empties the schema: it must come last.
func cleanupSchemaAt20Claims(t *testing.T, fresh func(t *testing.T) *schemaDB) {
	// Claim 35 (at 20).
	t.Run("cleanup_schema at 20 drops kv_delta, get_kv_value and get_kv_all_values", func(t *testing.T) {
		h := fresh(t)
		populateForCleanup(h)
		before := h.schemaFunctions()
		require.Contains(t, before, "get_kv_value(text,text)")
		require.Contains(t, before, "get_kv_all_values(text)")
		require.NotContains(t, before, "get_instance_stats(text)", "a target at 20 has no get_instance_stats")

		h.exec(`SELECT duroxide.cleanup_schema()`)
		require.Empty(t, h.texts(`SELECT relname::text FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = 'duroxide' AND relname LIKE 'kv\_delta%'`), "kv_delta and its key are dropped")
		after := h.schemaFunctions()
		require.NotContains(t, after, "get_kv_value(text,text)")
		require.NotContains(t, after, "get_kv_all_values(text)")
		require.Empty(t, h.schemaRelations(), "no relation of duroxide-pg is left")
		require.Equal(t, legacyFunctions, after)
	})
}
