package migrations_test

// Behaviour of upstream duroxide-pg's migration 0020 (kv_delta and the
// two-table KV semantics, and what it changes in the functions that
// read and write the KV store), proved on the real provider and on every pack version
// from the port of upstream 20 on. Each subtest proves one claim of the
// checklist in section 5; the comment above it gives the claim's number.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/packfacts"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// TestKVDelta proves the claims of 0020 on one database per target (the
// subtests run one after another on emptied tables).
func TestKVDelta(t *testing.T) {
	t.Parallel()
	eachLaterTarget(t, 20, 0, func(t *testing.T, tg laterTarget) {
		fresh := sharedSuite(t, tg.open(t))
		kvDeltaCatalogClaims(t, fresh)
		kvDeltaAckClaims(t, fresh)
		kvDeltaMergeClaims(t, fresh)
		kvDeltaReadClaims(t, fresh)
		kvDeltaDeleteClaims(t, fresh)
	})
}

func kvDeltaCatalogClaims(t *testing.T, fresh func(t *testing.T) *schemaDB) {
	// Claim 1.
	t.Run("kv_delta has exactly instance_id, key, value, last_updated_at_ms and only its primary key", func(t *testing.T) {
		h := fresh(t)
		require.Equal(t, []string{
			"instance_id text not null",
			"key text not null",
			"value text null",
			"last_updated_at_ms bigint not null",
		}, h.texts(`SELECT a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod)
					|| CASE WHEN a.attnotnull THEN ' not null' ELSE ' null' END
					|| COALESCE(' default ' || pg_catalog.pg_get_expr(d.adbin, d.adrelid), '')
				FROM pg_catalog.pg_attribute a
				LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
				WHERE a.attrelid = 'duroxide.kv_delta'::regclass AND a.attnum > 0 AND NOT a.attisdropped
				ORDER BY a.attnum`), "columns, in order, with no default")
		require.Equal(t, []string{"kv_delta_pkey p PRIMARY KEY (instance_id, key)"},
			h.texts(`SELECT conname || ' ' || contype::text || ' ' || pg_catalog.pg_get_constraintdef(oid)
					FROM pg_catalog.pg_constraint WHERE conrelid = 'duroxide.kv_delta'::regclass
						AND contype <> 'n' -- PostgreSQL 18 records NOT NULL here too; the columns prove those
					ORDER BY 1`),
			"the primary key is the only constraint (no foreign key, no CHECK)")
		require.Equal(t, []string{"CREATE UNIQUE INDEX kv_delta_pkey ON duroxide.kv_delta USING btree (instance_id, key)"},
			h.texts(`SELECT pg_catalog.pg_get_indexdef(indexrelid) FROM pg_catalog.pg_index
					WHERE indrelid = 'duroxide.kv_delta'::regclass ORDER BY 1`), "no index but the primary key's")
		var triggers int64
		h.scan(`SELECT count(*) FROM pg_catalog.pg_trigger WHERE tgrelid = 'duroxide.kv_delta'::regclass`, nil, &triggers)
		require.Zero(t, triggers, "no trigger")
	})
}

// kvUpgrade is one way of applying upstream 0020 to a database at the
// state before it.
type kvUpgrade struct {
	name string
	// before gives t a database at the state 0020 is applied to.
	before func(t *testing.T) *schemaDB
	// apply applies 0020 (and, for the real provider, whatever its runner
	// applies with it).
	apply func(t *testing.T, h *schemaDB)
}

// kvUpgrades are the real provider's runner adopting a pack database at
// version 19 (upstream's 1..19, recorded in _duroxide_migrations as
// upstream records them) and applying its own 20, 21 and 23 there; and,
// once it exists, the pack's port of 20 applied to the version before it.
func kvUpgrades() []kvUpgrade {
	_, version, _ := strings.Cut(upstream.AddonPackage, "@")
	out := []kvUpgrade{{
		name: fmt.Sprintf("upstream %s over pack %04d", version, packfacts.LastContiguousPort()),
		before: func(t *testing.T) *schemaDB {
			upstream.Require(t)
			return newAtVersion(t, packfacts.LastContiguousPort())
		},
		apply: func(t *testing.T, h *schemaDB) {
			require.NoError(t, upstream.Require(t).Migrate(context.Background(), h.db.Source, h.db.Schema))
			require.Equal(t, []string{"20", "21", "23"},
				h.texts(`SELECT version::text FROM duroxide._duroxide_migrations WHERE version > 19 ORDER BY version`),
				"the runner applied its own 20, 21 and 23")
		},
	}}
	port, ok := migrations.PortOf(20)
	if !ok {
		return out
	}
	var prev int64
	for _, m := range migrations.MustPack() {
		if m.Version < port.Version {
			prev = m.Version
		}
	}
	return append(out, kvUpgrade{
		name:   fmt.Sprintf("pack %04d over %04d", port.Version, prev),
		before: func(t *testing.T) *schemaDB { return newAtVersion(t, prev) },
		apply: func(t *testing.T, h *schemaDB) {
			_, err := h.db.Runner(t).UpTo(context.Background(), port.Version)
			require.NoError(t, err)
		},
	})
}

func TestKVDeltaMigrationLeavesTheRestAlone(t *testing.T) {
	t.Parallel()
	for _, up := range kvUpgrades() {
		t.Run(up.name, func(t *testing.T) {
			t.Parallel()
			// Claim 2.
			t.Run("0020 redefines neither fetch_orchestration_item nor prune_executions and leaves kv_store, its execution_id, its index and its rows unchanged", func(t *testing.T) {
				h := up.before(t)
				// KV written at the state before: two instances, two executions.
				h.startInstance("i1", "P", "1.0.0", clock0, "kv_mutations", []any{kvSet("a", "1", clock0+5), kvSet("b", "2", clock0+6)})
				h.startInstance("i2", "P", "1.0.0", clock0+10, "kv_mutations", []any{kvSet("x", "y", clock0+11)})
				h.nextTurn("i2", clock0+20, turn{ExecutionID: 2, Meta: ackMeta(t, "kv_mutations", []any{kvSet("z", "w", clock0+21)})})

				functions := func() []string {
					// oid: not dropped and re-created; xmin: the pg_proc row
					// was not rewritten (CREATE OR REPLACE, ALTER); the text.
					return h.texts(`SELECT p.proname || ' ' || p.oid::text || ' ' || p.xmin::text || ' ' || pg_catalog.pg_get_functiondef(p.oid)
						FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
						WHERE n.nspname = 'duroxide' AND p.proname IN ('fetch_orchestration_item', 'prune_executions') ORDER BY 1`)
				}
				kvStoreShape := func() []string {
					return h.texts(`SELECT a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull::text
						FROM pg_catalog.pg_attribute a WHERE a.attrelid = 'duroxide.kv_store'::regclass AND a.attnum > 0 AND NOT a.attisdropped
						UNION ALL
						SELECT pg_catalog.pg_get_indexdef(indexrelid) FROM pg_catalog.pg_index WHERE indrelid = 'duroxide.kv_store'::regclass
						ORDER BY 1`)
				}
				kvStoreRows := func() []string {
					return h.texts(`SELECT concat_ws(' ', instance_id, key, value, execution_id, last_updated_at_ms)
						FROM duroxide.kv_store ORDER BY instance_id, key`)
				}
				fnBefore, shapeBefore, rowsBefore := functions(), kvStoreShape(), kvStoreRows()
				require.Len(t, fnBefore, 2)
				require.Contains(t, shapeBefore, "execution_id bigint true")
				require.Contains(t, shapeBefore, "CREATE INDEX idx_kv_store_execution ON duroxide.kv_store USING btree (instance_id, execution_id)")
				require.Equal(t, []string{"i1 a 1 1 4100000000005", "i1 b 2 1 4100000000006", "i2 x y 1 4100000000011", "i2 z w 2 4100000000021"}, rowsBefore)

				up.apply(t, h)

				require.Equal(t, fnBefore, functions(), "fetch_orchestration_item and prune_executions are not redefined")
				require.Equal(t, shapeBefore, kvStoreShape(), "kv_store keeps its columns (execution_id included) and indexes (idx_kv_store_execution included)")
				require.Equal(t, rowsBefore, kvStoreRows(), "kv_store rows are neither moved nor rewritten")
				require.Zero(t, h.count("kv_delta", "true"), "kv_delta starts empty")
			})
		})
	}
}

func kvDeltaAckClaims(t *testing.T, fresh func(t *testing.T) *schemaDB) {
	now := clock0 + 1_000
	ackTs := now + 1 // turnErr acks at now+1

	// Claim 4.
	t.Run("a set with last_updated_at_ms 123 on a non-terminal turn writes kv_delta (I, k, v, 123) and leaves kv_store unchanged", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		h.seedStore("i1", 1, 5, "k", "old")
		_, err := h.turnErr("i1", now, turn{Meta: kvMeta(t, "Running", kvSet("k", "v", 123))})
		require.NoError(t, err)
		require.Equal(t, []deltaRow{{"k", live("v"), 123}}, h.kvDelta("i1"))
		require.Equal(t, []storeRow{{"k", "old", 1, 5}}, h.kvStore("i1"))
		require.Zero(t, h.count("kv_delta", "instance_id <> 'i1'"), "the row belongs to the leased instance I")
	})

	// Claim 5.
	t.Run("a set without last_updated_at_ms or with JSON null stores p_now_ms; a set with 0 stores 0", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		_, err := h.turnErr("i1", now, turn{Meta: kvMeta(t, nil,
			map[string]any{"action": "set", "key": "missing", "value": "1"},
			map[string]any{"action": "set", "key": "null", "value": "2", "last_updated_at_ms": nil},
			kvSet("zero", "3", 0),
		)})
		require.NoError(t, err)
		require.Equal(t, []deltaRow{{"missing", live("1"), ackTs}, {"null", live("2"), ackTs}, {"zero", live("3"), 0}}, h.kvDelta("i1"))
	})

	// Claim 6.
	t.Run("a set whose value is missing or JSON null writes a tombstone without error", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		h.seedStore("i1", 1, 5, "b", "stored")
		_, err := h.turnErr("i1", now, turn{Meta: kvMeta(t, nil,
			map[string]any{"action": "set", "key": "a", "last_updated_at_ms": 42},
			map[string]any{"action": "set", "key": "b", "value": nil},
		)})
		require.NoError(t, err)
		require.Equal(t, []deltaRow{{"a", nil, 42}, {"b", nil, ackTs}}, h.kvDelta("i1"))
		require.Equal(t, []storeRow{{"b", "stored", 1, 5}}, h.kvStore("i1"))
	})

	// Claim 7.
	t.Run("a set or clear_key without key fails with 23502 on kv_delta.key and the whole ack rolls back", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		for i, bad := range []map[string]any{
			{"action": "set", "value": "v", "last_updated_at_ms": 1},
			{"action": "clear_key"},
			{"action": "clear_key", "key": nil},
		} {
			at := now + int64(i)*100
			h.enqueueOrch("i1", externalItem("i1", "tick"), at)
			it := h.mustFetchOrch(at, "i1")
			err := h.ackErr(it.Token, at+1, turn{
				History: historyDelta(t, eventJSON("i1", 1, 2, "ExternalEvent")),
				Orch:    rawArray(externalItem("i1", "next")),
				Meta:    kvMeta(t, "Completed", kvSet("before", "x", 1), bad),
			})
			requirePgError(t, err, "23502", `null value in column "key" of relation "kv_delta" violates not-null constraint`)
			require.Equal(t, it.Token, h.instanceLock("i1").Token, "the lease row is still there")
			require.EqualValues(t, 1, h.count("orchestrator_queue", "lock_token = $1", it.Token), "the claimed message is still there")
			require.EqualValues(t, 1, h.count("orchestrator_queue", "true"), "no orchestrator item was enqueued")
			require.EqualValues(t, 1, h.count("history", "instance_id = 'i1'"), "no history was appended")
			require.Equal(t, "Running", h.texts(`SELECT status FROM duroxide.executions WHERE instance_id = 'i1'`)[0])
			require.Empty(t, h.kvDelta("i1"), "the earlier element's write is rolled back")
			require.Empty(t, h.kvStore("i1"))
			h.exec(`DELETE FROM duroxide.instance_locks`)
			h.exec(`DELETE FROM duroxide.orchestrator_queue`)
		}
	})

	// Claim 8.
	t.Run("last_updated_at_ms \"abc\" or 1.5 fails with 22P02; the string \"77\" stores 77", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		for i, c := range []struct {
			ts   any
			text string
		}{{"abc", "abc"}, {1.5, "1.5"}} {
			_, err := h.turnErr("i1", now+int64(i)*100, turn{Meta: kvMeta(t, nil,
				map[string]any{"action": "set", "key": "k", "value": "v", "last_updated_at_ms": c.ts})})
			requirePgError(t, err, "22P02", fmt.Sprintf(`invalid input syntax for type bigint: "%s"`, c.text))
			require.Empty(t, h.kvDelta("i1"))
			h.exec(`DELETE FROM duroxide.instance_locks`)
			h.exec(`DELETE FROM duroxide.orchestrator_queue`)
		}
		_, err := h.turnErr("i1", now+1_000, turn{Meta: kvMeta(t, nil,
			map[string]any{"action": "set", "key": "k", "value": "v", "last_updated_at_ms": "77"})})
		require.NoError(t, err)
		require.Equal(t, []deltaRow{{"k", live("v"), 77}}, h.kvDelta("i1"))
	})

	// Claim 9.
	t.Run("clear_key on a key only in kv_store writes a tombstone at p_now_ms and leaves the kv_store row unchanged", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		h.seedStore("i1", 1, 5, "k", "stored")
		_, err := h.turnErr("i1", now, turn{Meta: kvMeta(t, nil, kvClearKey("k"))})
		require.NoError(t, err)
		require.Equal(t, []deltaRow{{"k", nil, ackTs}}, h.kvDelta("i1"))
		require.Equal(t, []storeRow{{"k", "stored", 1, 5}}, h.kvStore("i1"))
	})

	// Claim 10.
	t.Run("clear_key on a key that exists nowhere still creates a tombstone", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		_, err := h.turnErr("i1", now, turn{Meta: kvMeta(t, nil, kvClearKey("ghost"))})
		require.NoError(t, err)
		require.Equal(t, []deltaRow{{"ghost", nil, ackTs}}, h.kvDelta("i1"))
		require.Empty(t, h.kvStore("i1"))
	})

	// Claim 11.
	t.Run("clear_key on a key with a live delta row turns it into a tombstone at p_now_ms", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		h.nextTurn("i1", now, turn{Meta: kvMeta(t, nil, kvSet("k", "v", 10))})
		require.Equal(t, []deltaRow{{"k", live("v"), 10}}, h.kvDelta("i1"))
		_, err := h.turnErr("i1", now+100, turn{Meta: kvMeta(t, nil, kvClearKey("k"))})
		require.NoError(t, err)
		require.Equal(t, []deltaRow{{"k", nil, now + 101}}, h.kvDelta("i1"))
	})

	// Claim 12.
	t.Run("clear_all tombstones every delta row of I, tombstones included, at p_now_ms and adds a tombstone per kv_store key without a delta row", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		h.seedStore("i1", 1, 5, "both", "s", "s1", "s", "s2", "s")
		h.nextTurn("i1", now, turn{Meta: kvMeta(t, nil, kvSet("both", "d", 10), kvSet("d1", "d", 11), kvClearKey("t1"))})
		require.Equal(t, []deltaRow{{"both", live("d"), 10}, {"d1", live("d"), 11}, {"t1", nil, now + 1}}, h.kvDelta("i1"))

		_, err := h.turnErr("i1", now+100, turn{Meta: kvMeta(t, nil, kvClearAll())})
		require.NoError(t, err)
		at := now + 101
		require.Equal(t, []deltaRow{{"both", nil, at}, {"d1", nil, at}, {"s1", nil, at}, {"s2", nil, at}, {"t1", nil, at}}, h.kvDelta("i1"))
	})

	// Claim 13.
	t.Run("clear_all never touches kv_store nor another instance's rows", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		h.startInstance("i2", "P", "1.0.0", clock0+10)
		h.seedStore("i1", 1, 5, "a", "1", "b", "2")
		h.seedStore("i2", 3, 6, "a", "x", "c", "y")
		h.nextTurn("i2", now, turn{Meta: kvMeta(t, nil, kvSet("d", "z", 12), kvClearKey("c"))})
		i2Delta := h.kvDelta("i2")

		_, err := h.turnErr("i1", now+100, turn{Meta: kvMeta(t, nil, kvClearAll())})
		require.NoError(t, err)
		require.Equal(t, []storeRow{{"a", "1", 1, 5}, {"b", "2", 1, 5}}, h.kvStore("i1"))
		require.Equal(t, []storeRow{{"a", "x", 3, 6}, {"c", "y", 3, 6}}, h.kvStore("i2"))
		require.Equal(t, i2Delta, h.kvDelta("i2"))
		require.Equal(t, []deltaRow{{"a", nil, now + 101}, {"b", nil, now + 101}}, h.kvDelta("i1"))
	})

	// Claim 14.
	t.Run("[clear_all, set e] leaves e live; [set z, clear_all, set y] leaves z tombstoned and y live", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		h.startInstance("i2", "P", "1.0.0", clock0+10)
		h.seedStore("i1", 1, 5, "s", "1")
		h.seedStore("i2", 1, 5, "s", "1")

		_, err := h.turnErr("i1", now, turn{Meta: kvMeta(t, nil, kvClearAll(), kvSet("e", "E", 20))})
		require.NoError(t, err)
		require.Equal(t, []deltaRow{{"e", live("E"), 20}, {"s", nil, now + 1}}, h.kvDelta("i1"))

		_, err = h.turnErr("i2", now+100, turn{Meta: kvMeta(t, nil, kvSet("z", "Z", 30), kvClearAll(), kvSet("y", "Y", 31))})
		require.NoError(t, err)
		require.Equal(t, []deltaRow{{"s", nil, now + 101}, {"y", live("Y"), 31}, {"z", nil, now + 101}}, h.kvDelta("i2"))
	})

	// Claim 15.
	t.Run("unknown actions and non-object elements are ignored; kv_mutations JSON null or {} fails with 22023", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		_, err := h.turnErr("i1", now, turn{Meta: kvMeta(t, nil,
			map[string]any{"action": "bogus", "key": "u1", "value": "v"},
			map[string]any{"action": "SET", "key": "u2", "value": "v"},
			map[string]any{"action": nil, "key": "u3", "value": "v"},
			map[string]any{"key": "u4", "value": "v"},
			"set",
			[]any{"set", "u5", "v"},
			kvSet("ok", "v", 1),
		)})
		require.NoError(t, err)
		require.Equal(t, []deltaRow{{"ok", live("v"), 1}}, h.kvDelta("i1"), "only the valid set is written")
		h.exec(`TRUNCATE duroxide.kv_delta`)

		for i, c := range []struct {
			mutations any
			message   string
		}{
			{nil, "cannot get array length of a scalar"},
			{map[string]any{}, "cannot get array length of a non-array"},
		} {
			token, err := h.turnErr("i1", now+100*int64(i+1), turn{Meta: ackMeta(t, "status", "Completed", "kv_mutations", c.mutations)})
			requirePgError(t, err, "22023", c.message)
			require.Equal(t, token, h.instanceLock("i1").Token, "the ack rolled back")
			require.Empty(t, h.kvDelta("i1"))
			h.exec(`DELETE FROM duroxide.instance_locks`)
			h.exec(`DELETE FROM duroxide.orchestrator_queue`)
		}
	})
}

func kvDeltaMergeClaims(t *testing.T, fresh func(t *testing.T) *schemaDB) {
	now := clock0 + 1_000

	// Claim 16.
	t.Run("status Running, completed, JSON null or absent triggers no merge", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		h.seedStore("i1", 1, 5, "s", "stored", "t", "kept")
		h.nextTurn("i1", now, turn{Meta: kvMeta(t, nil, kvSet("k", "v", 10), kvClearKey("s"))})
		delta, store := h.kvDelta("i1"), h.kvStore("i1")
		require.Len(t, delta, 2)

		for i, meta := range []json.RawMessage{
			kvMeta(t, "Running"),
			kvMeta(t, "completed"),
			kvMeta(t, nil),
			json.RawMessage(`{"kv_mutations":[]}`),
			json.RawMessage(`{}`),
		} {
			_, err := h.turnErr("i1", now+100*int64(i+1), turn{Meta: meta})
			require.NoError(t, err, "%s", meta)
			require.Equal(t, delta, h.kvDelta("i1"), "kv_delta keeps its rows after %s", meta)
			require.Equal(t, store, h.kvStore("i1"), "kv_store is unchanged after %s", meta)
		}
	})

	// Claim 17.
	t.Run("status Completed, ContinuedAsNew or Failed upserts every live delta row into kv_store with p_execution_id and the delta's timestamp", func(t *testing.T) {
		h := fresh(t)
		for i, status := range []string{"Completed", "ContinuedAsNew", "Failed"} {
			at := now + int64(i)*1_000
			h.startInstance(status, "P", "1.0.0", at)
			h.seedStore(status, 1, 5, "k", "old")
			h.nextTurn(status, at+10, turn{Meta: kvMeta(t, nil, kvSet("k", "v1", 11), kvSet("j", "v2", 12))})
			require.Equal(t, []storeRow{{"k", "old", 1, 5}}, h.kvStore(status), "not merged before the terminal turn")

			_, err := h.turnErr(status, at+20, turn{ExecutionID: 2, Meta: kvMeta(t, status)})
			require.NoError(t, err)
			require.Equal(t, []storeRow{{"j", "v2", 2, 12}, {"k", "v1", 2, 11}}, h.kvStore(status), status)
		}
	})

	// Claim 18.
	t.Run("the terminal merge deletes the kv_store rows of tombstoned keys, then every kv_delta row of I", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		h.startInstance("i2", "P", "1.0.0", clock0+10)
		h.seedStore("i1", 1, 5, "a", "sa", "b", "sb", "c", "sc")
		h.seedStore("i2", 1, 5, "a", "other")
		h.nextTurn("i1", now, turn{Meta: kvMeta(t, nil, kvClearKey("a"), kvSet("b", "nb", 20), kvClearKey("x"))})
		h.nextTurn("i2", now+10, turn{Meta: kvMeta(t, nil, kvClearKey("a"), kvSet("n", "v", 21))})
		i2Delta := h.kvDelta("i2")

		_, err := h.turnErr("i1", now+100, turn{Meta: kvMeta(t, "Completed")})
		require.NoError(t, err)
		require.Equal(t, []storeRow{{"b", "nb", 1, 20}, {"c", "sc", 1, 5}}, h.kvStore("i1"),
			"a is deleted, b merged, c kept; the tombstone of x (not in kv_store) has no effect")
		require.Empty(t, h.kvDelta("i1"))
		require.Equal(t, i2Delta, h.kvDelta("i2"), "another instance's delta is untouched")
		require.Equal(t, []storeRow{{"a", "other", 1, 5}}, h.kvStore("i2"), "another instance's store is untouched")
	})

	// Claim 19.
	t.Run("a terminal ack with no kv_mutations still folds in delta rows written by earlier turns", func(t *testing.T) {
		h := fresh(t)
		for i, meta := range []json.RawMessage{
			kvMeta(t, "Completed"),
			json.RawMessage(`{"status":"Completed"}`),
		} {
			instance := fmt.Sprintf("i%d", i)
			at := now + int64(i)*1_000
			h.startInstance(instance, "P", "1.0.0", at)
			h.nextTurn(instance, at+10, turn{Meta: kvMeta(t, nil, kvSet("k", "v", 15))})
			_, err := h.turnErr(instance, at+20, turn{Meta: meta})
			require.NoError(t, err)
			require.Equal(t, []storeRow{{"k", "v", 1, 15}}, h.kvStore(instance), "%s", meta)
			require.Empty(t, h.kvDelta(instance))
		}
	})

	// Claim 20.
	t.Run("kv_store rows without a delta row keep their execution_id and timestamp through a merge", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		h.seedStore("i1", 7, 77, "keep", "x")
		h.nextTurn("i1", now, turn{Meta: kvMeta(t, nil, kvSet("k", "v", 15))})
		_, err := h.turnErr("i1", now+100, turn{ExecutionID: 9, Meta: kvMeta(t, "Completed")})
		require.NoError(t, err)
		require.Equal(t, []storeRow{{"k", "v", 9, 15}, {"keep", "x", 7, 77}}, h.kvStore("i1"))
	})

	// Claim 21.
	t.Run("a ContinuedAsNew ack merges KV but leaves executions.completed_at NULL", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		h.nextTurn("i1", now, turn{Meta: kvMeta(t, nil, kvSet("k", "v", 15))})
		_, err := h.turnErr("i1", now+100, turn{Meta: kvMeta(t, "ContinuedAsNew", kvSet("m", "w", 16))})
		require.NoError(t, err)
		require.Equal(t, []storeRow{{"k", "v", 1, 15}, {"m", "w", 1, 16}}, h.kvStore("i1"))
		require.Empty(t, h.kvDelta("i1"))
		require.EqualValues(t, 1, h.count("executions", "instance_id = 'i1' AND execution_id = 1 AND status = 'ContinuedAsNew' AND completed_at IS NULL"))
	})

	// Claim 22.
	t.Run("a terminal ack that fails at step 8 (bad worker-item cast) leaves kv_delta and kv_store unchanged", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		h.seedStore("i1", 1, 5, "s", "stored", "t", "kept")
		h.nextTurn("i1", now, turn{Meta: kvMeta(t, nil, kvSet("k", "v", 10), kvClearKey("s"))})
		delta, store := h.kvDelta("i1"), h.kvStore("i1")

		token, err := h.turnErr("i1", now+100, turn{
			Worker: rawArray(`{"ActivityExecute":{"instance":"i1","execution_id":"abc","id":2,"name":"A","input":"x"}}`),
			Meta:   kvMeta(t, "Completed", kvSet("n", "new", 20), kvClearKey("t")),
		})
		requirePgError(t, err, "22P02", `invalid input syntax for type bigint: "abc"`)
		require.Equal(t, delta, h.kvDelta("i1"))
		require.Equal(t, store, h.kvStore("i1"))
		require.Equal(t, token, h.instanceLock("i1").Token)
	})

	// Claim 23.
	t.Run("fetch_orchestration_item's out_kv_snapshot ignores kv_delta", func(t *testing.T) {
		h := fresh(t)
		h.startInstance("i1", "P", "1.0.0", clock0)
		h.exec(`INSERT INTO duroxide.kv_store (instance_id, key, value, execution_id, last_updated_at_ms)
				VALUES ('i1', 'a', 'storeA', 1, 1), ('i1', 'b', 'storeB', 1, 2)`)
		h.nextTurn("i1", now, turn{Meta: kvMeta(t, nil, kvSet("a", "deltaA", 10), kvClearKey("b"), kvSet("c", "deltaC", 11))})
		require.Len(t, h.kvDelta("i1"), 3)

		h.enqueueOrch("i1", externalItem("i1", "x"), now+100)
		it := h.mustFetchOrch(now+100, "i1")
		require.JSONEq(t, `{"a":{"value":"storeA","last_updated_at_ms":1},"b":{"value":"storeB","last_updated_at_ms":2}}`, string(it.KVRaw),
			"live delta values are absent and the tombstoned store key is still present")
	})
}

func kvDeltaReadClaims(t *testing.T, fresh func(t *testing.T) *schemaDB) {
	// Claim 24.
	t.Run("get_kv_value reads the delta first: live (v, true), tombstone (NULL, false) over the store, store (v, true), else (NULL, false), always one row", func(t *testing.T) {
		h := fresh(t)
		h.seedStore("i1", 1, 5, "a", "storeA", "b", "storeB", "s", "storeS")
		h.seedDelta("i1", "a", live("deltaA"), 10)
		h.seedDelta("i1", "b", nil, 11)
		h.seedDelta("i1", "d", live("deltaD"), 12)
		h.seedDelta("i1", "t", nil, 13)
		h.seedStore("i2", 1, 5, "zz", "other")
		for _, c := range []struct {
			instance, key string
			want          kvValue
		}{
			{"i1", "a", kvValue{live("deltaA"), true}},
			{"i1", "b", kvValue{nil, false}},
			{"i1", "s", kvValue{live("storeS"), true}},
			{"i1", "d", kvValue{live("deltaD"), true}},
			{"i1", "t", kvValue{nil, false}},
			{"i1", "zz", kvValue{nil, false}},
			{"nobody", "a", kvValue{nil, false}},
		} {
			require.Equal(t, []kvValue{c.want}, h.getKVValue(c.instance, c.key), "%s/%s", c.instance, c.key)
		}
		require.Zero(t, h.count("instances", "true"), "the instances table is not consulted")
	})

	// Claim 25.
	t.Run("get_kv_value returns ('', true) for an empty value and (NULL, false) for NULL arguments", func(t *testing.T) {
		h := fresh(t)
		h.seedDelta("i1", "e", live(""), 10)
		h.seedStore("i1", 1, 5, "s", "", "a", "x")
		require.Equal(t, []kvValue{{live(""), true}}, h.getKVValue("i1", "e"))
		require.Equal(t, []kvValue{{live(""), true}}, h.getKVValue("i1", "s"))
		require.Equal(t, []kvValue{{nil, false}}, h.getKVValue(nil, "a"))
		require.Equal(t, []kvValue{{nil, false}}, h.getKVValue("i1", nil))
		require.Equal(t, []kvValue{{nil, false}}, h.getKVValue(nil, nil))
	})

	// Claim 26.
	t.Run("get_kv_all_values returns the delta value over the store value, omits tombstones, is scoped to one instance, and is empty for NULL or unknown", func(t *testing.T) {
		h := fresh(t)
		h.seedStore("i1", 1, 5, "a", "storeA", "b", "storeB", "s", "storeS")
		h.seedDelta("i1", "a", live("deltaA"), 10)
		h.seedDelta("i1", "b", nil, 11)
		h.seedDelta("i1", "c", live("deltaC"), 12)
		h.seedDelta("i1", "t", nil, 13)
		h.seedStore("i2", 1, 5, "a", "otherA", "o", "otherO")
		h.seedDelta("i2", "p", live("otherP"), 14)
		h.seedDelta("i2", "s", nil, 15)

		require.Equal(t, map[string]string{"a": "deltaA", "c": "deltaC", "s": "storeS"}, h.getKVAll("i1"))
		require.Equal(t, map[string]string{"a": "otherA", "o": "otherO", "p": "otherP"}, h.getKVAll("i2"))
		require.Empty(t, h.getKVAll(nil))
		require.Empty(t, h.getKVAll("nobody"))
	})
}

func kvDeltaDeleteClaims(t *testing.T, fresh func(t *testing.T) *schemaDB) {
	// Claim 34.
	t.Run("delete_instances_atomic removes the listed instances' kv_delta rows without changing any returned count", func(t *testing.T) {
		h := fresh(t)
		type counts struct{ Instances, Executions, Events, Queue int64 }
		del := func(ids ...string) counts {
			var c counts
			h.scan(`SELECT instances_deleted, executions_deleted, events_deleted, queue_messages_deleted
					FROM duroxide.delete_instances_atomic($1, true)`, []any{ids}, &c.Instances, &c.Executions, &c.Events, &c.Queue)
			return c
		}
		// kv: like bare, plus live and tombstoned delta rows and a store row.
		for i, id := range []string{"kv", "bare", "other"} {
			h.startInstance(id, "P", "1.0.0", clock0+int64(i)*100)
		}
		h.seedStore("kv", 1, 5, "s", "stored")
		h.nextTurn("kv", clock0+1_000, turn{Meta: kvMeta(t, nil, kvSet("k", "v", 10), kvClearKey("s"), kvClearKey("ghost"))})
		h.nextTurn("bare", clock0+1_100, turn{})
		h.seedStore("other", 1, 5, "s", "o")
		h.nextTurn("other", clock0+1_200, turn{Meta: kvMeta(t, nil, kvSet("k", "o", 11))})
		require.EqualValues(t, 3, h.count("kv_delta", "instance_id = 'kv'"))
		otherDelta, otherStore := h.kvDelta("other"), h.kvStore("other")

		withKV, without := del("kv"), del("bare")
		require.Equal(t, counts{Instances: 1, Executions: 1, Events: 1}, without)
		require.Equal(t, without, withKV, "KV rows add to no count")
		require.Empty(t, h.kvDelta("kv"))
		require.Empty(t, h.kvStore("kv"))
		require.Equal(t, otherDelta, h.kvDelta("other"), "another instance's kv_delta survives")
		require.Equal(t, otherStore, h.kvStore("other"))
	})
}
