package migrations_test

// Behaviour at version 19 and every later pack version of the state an ack
// leaves behind and the read helpers over it: custom status, the KV
// store and its snapshot (the kv_store table itself before the port of
// upstream 20), fetch_history & co, and the upstream quirks kept at 1..19.

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
)

// nextTurn enqueues a message for instance at now, fetches it and acks the
// turn at now+1 with tr.
func (h *schemaDB) nextTurn(instance string, now int64, tr turn) {
	h.t.Helper()
	h.enqueueOrch(instance, externalItem(instance, "tick"), now)
	it := h.mustFetchOrch(now, instance)
	h.ack(it.Token, now+1, tr)
}

// customStatus is get_custom_status' row, or nil when it returns none.
type customStatus struct {
	Status  *string
	Version int64
}

func (h *schemaDB) getCustomStatus(instance string, lastSeen int64) *customStatus {
	h.t.Helper()
	rows, err := h.pool.Query(h.ctx(), `SELECT out_custom_status, out_custom_status_version FROM duroxide.get_custom_status($1, $2)`, instance, lastSeen)
	require.NoError(h.t, err)
	defer rows.Close()
	var out []customStatus
	for rows.Next() {
		var cs customStatus
		require.NoError(h.t, rows.Scan(&cs.Status, &cs.Version))
		out = append(out, cs)
	}
	require.NoError(h.t, rows.Err())
	require.LessOrEqual(h.t, len(out), 1)
	if len(out) == 0 {
		return nil
	}
	return &out[0]
}

func TestCustomStatus(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {

		t.Run("'set' on the ack that creates the instance stores the value at version 1", func(t *testing.T) {
			h := fresh(t)
			h.startInstance("order-1", "P", "1.0.0", clock0, "custom_status_action", "set", "custom_status_value", "stage-1")
			require.Equal(t, &customStatus{Status: ptrTo("stage-1"), Version: 1}, h.getCustomStatus("order-1", 0))
		})

		t.Run("get_custom_status returns a row only when the version is newer than the one last seen", func(t *testing.T) {
			h := fresh(t)
			h.startInstance("order-1", "P", "1.0.0", clock0, "custom_status_action", "set", "custom_status_value", "stage-1")
			require.Nil(t, h.getCustomStatus("order-1", 1))
			require.Nil(t, h.getCustomStatus("order-1", 5))
			require.NotNil(t, h.getCustomStatus("order-1", -1))
		})

		t.Run("'set' replaces and 'clear' empties the status, each bumping the version; no action changes nothing", func(t *testing.T) {
			h := fresh(t)
			h.startInstance("order-1", "P", "1.0.0", clock0, "custom_status_action", "set", "custom_status_value", "stage-1")
			h.nextTurn("order-1", clock0+10, turn{Meta: ackMeta(t, "custom_status_action", "set", "custom_status_value", "stage-2")})
			require.Equal(t, &customStatus{Status: ptrTo("stage-2"), Version: 2}, h.getCustomStatus("order-1", 1))

			h.nextTurn("order-1", clock0+20, turn{Meta: ackMeta(t, "custom_status_action", "clear")})
			require.Equal(t, &customStatus{Status: nil, Version: 3}, h.getCustomStatus("order-1", 2))

			h.nextTurn("order-1", clock0+30, turn{Meta: ackMeta(t, "custom_status_action", nil, "custom_status_value", "ignored")})
			h.nextTurn("order-1", clock0+40, turn{Meta: ackMeta(t, "custom_status_action", "bogus", "custom_status_value", "ignored")})
			require.Nil(t, h.getCustomStatus("order-1", 3))
			require.Equal(t, &customStatus{Status: nil, Version: 3}, h.getCustomStatus("order-1", 0))
		})

		t.Run("'set' without a value stores NULL and still bumps the version", func(t *testing.T) {
			h := fresh(t)
			h.startInstance("order-1", "P", "1.0.0", clock0)
			h.nextTurn("order-1", clock0+10, turn{Meta: ackMeta(t, "custom_status_action", "set")})
			require.Equal(t, &customStatus{Status: nil, Version: 1}, h.getCustomStatus("order-1", 0))
		})

		t.Run("an unknown instance has no custom status", func(t *testing.T) {
			h := fresh(t)
			require.Nil(t, h.getCustomStatus("nobody", -1))
		})
	})
}

// atEveryVersionBefore is atEveryVersion restricted to the versions before
// the pack's port of upstream version upstream (every version when the pack
// has no such port): the claims about a behaviour upstream itself changed
// in that version, whose new behaviour has a suite of its own.
func atEveryVersionBefore(t *testing.T, upstream int64, body func(t *testing.T, fresh func(*testing.T) *schemaDB)) {
	t.Helper()
	port, ported := migrations.PortOf(upstream)
	var versions []int64
	for _, v := range behaviourVersions() {
		if !ported || v < port.Version {
			versions = append(versions, v)
		}
	}
	atVersions(t, versions, body)
}

// kvList is kv_mutations m as the JSON array the provider sends.
func kvList(m ...map[string]any) []any {
	list := make([]any, len(m))
	for i := range m {
		list[i] = m[i]
	}
	return list
}

// kvMutations is p_metadata carrying kv_mutations m, every other key null.
func kvMutations(t *testing.T, m ...map[string]any) json.RawMessage {
	t.Helper()
	return ackMeta(t, "kv_mutations", kvList(m...))
}

// kvRow is one kv_store row of an instance.
type kvRow struct {
	Key         string
	Value       string
	ExecutionID int64
	UpdatedAt   int64
}

func (h *schemaDB) kvRows(instance string) []kvRow {
	h.t.Helper()
	rows, err := h.pool.Query(h.ctx(), `SELECT key, value, execution_id, last_updated_at_ms FROM duroxide.kv_store
		WHERE instance_id = $1 ORDER BY key`, instance)
	require.NoError(h.t, err)
	defer rows.Close()
	out := []kvRow{}
	for rows.Next() {
		var r kvRow
		require.NoError(h.t, rows.Scan(&r.Key, &r.Value, &r.ExecutionID, &r.UpdatedAt))
		out = append(out, r)
	}
	require.NoError(h.t, rows.Err())
	return out
}

// TestKVStore: what an ack's kv_mutations leave for the next fetch's
// snapshot, at every version, and the kv_store table itself at the versions
// before the port of upstream 20, which moved a non-terminal turn's writes to
// kv_delta, folded into kv_store on a terminal turn (TestKVDelta proves that
// behaviour).
func TestKVStore(t *testing.T) {
	t.Parallel()

	t.Run("the next fetch's snapshot", func(t *testing.T) {
		atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {
			// terminalTurn runs one turn of instance at now, acked as the end
			// of execution executionID (ContinuedAsNew, a terminal status)
			// with the mutations m, and returns what its fetch saw.
			terminalTurn := func(h *schemaDB, instance string, now, executionID int64, m ...map[string]any) *orchItem {
				h.enqueueOrch(instance, externalItem(instance, "tick"), now)
				it := h.mustFetchOrch(now, instance)
				h.ack(it.Token, now+1, turn{ExecutionID: executionID, Meta: ackMeta(t, "status", "ContinuedAsNew", "kv_mutations", kvList(m...))})
				return it
			}

			t.Run("a terminal turn's 'set's are in the next fetch's snapshot, each value a JSON string, each timestamp a JSON number", func(t *testing.T) {
				h := fresh(t)
				h.startInstance("order-1", "P", "1.0.0", clock0)
				terminalTurn(h, "order-1", clock0+10, 1, kvSet("a", "1", clock0+5), kvSet("b", `{"n":2}`, clock0+6))

				next := terminalTurn(h, "order-1", clock0+20, 2)
				require.JSONEq(t, `{"a":{"value":"1","last_updated_at_ms":4100000000005},"b":{"value":"{\"n\":2}","last_updated_at_ms":4100000000006}}`,
					string(next.KVRaw))
			})

			t.Run("a terminal turn's 'clear_key' and 'clear_all' take keys out of the next fetch's snapshot of the acking instance only", func(t *testing.T) {
				h := fresh(t)
				h.startInstance("order-1", "P", "1.0.0", clock0)
				h.startInstance("order-2", "P", "1.0.0", clock0+1)
				terminalTurn(h, "order-1", clock0+10, 1, kvSet("a", "1", clock0), kvSet("b", "2", clock0), kvSet("c", "3", clock0))
				terminalTurn(h, "order-2", clock0+10, 1, kvSet("a", "x", clock0))

				seen := terminalTurn(h, "order-1", clock0+20, 2, kvClearKey("b"), kvClearKey("missing"))
				require.Equal(t, map[string]kvEntry{"a": {"1", clock0}, "b": {"2", clock0}, "c": {"3", clock0}}, seen.KV)
				seen = terminalTurn(h, "order-1", clock0+30, 3, kvClearAll())
				require.Equal(t, map[string]kvEntry{"a": {"1", clock0}, "c": {"3", clock0}}, seen.KV)
				require.Empty(t, terminalTurn(h, "order-1", clock0+40, 4).KV)
				require.Equal(t, map[string]kvEntry{"a": {"x", clock0}}, terminalTurn(h, "order-2", clock0+40, 2).KV, "another instance's keys survive")
			})
		})
	})

	t.Run("kv_store, before the port of upstream 20", func(t *testing.T) {
		atEveryVersionBefore(t, 20, func(t *testing.T, fresh func(*testing.T) *schemaDB) {
			t.Run("'set' stores value, execution and last_updated_at_ms, and the next fetch's snapshot has them", func(t *testing.T) {
				h := fresh(t)
				h.startInstance("order-1", "P", "1.0.0", clock0, "kv_mutations", []any{kvSet("a", "1", clock0+5), kvSet("b", `{"n":2}`, clock0+6)})
				require.Equal(t, []kvRow{{"a", "1", 1, clock0 + 5}, {"b", `{"n":2}`, 1, clock0 + 6}}, h.kvRows("order-1"))

				h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0+10)
				it := h.mustFetchOrch(clock0+10, "order-1")
				require.JSONEq(t, `{"a":{"value":"1","last_updated_at_ms":4100000000005},"b":{"value":"{\"n\":2}","last_updated_at_ms":4100000000006}}`,
					string(it.KVRaw), "each value is a JSON string, each timestamp a JSON number")
			})

			t.Run("a later 'set' replaces value, execution and timestamp", func(t *testing.T) {
				h := fresh(t)
				h.startInstance("order-1", "P", "1.0.0", clock0, "kv_mutations", []any{kvSet("a", "1", clock0+5)})
				h.nextTurn("order-1", clock0+10, turn{ExecutionID: 2, Meta: kvMutations(t, kvSet("a", "2", clock0+11))})
				require.Equal(t, []kvRow{{"a", "2", 2, clock0 + 11}}, h.kvRows("order-1"))
			})

			t.Run("'clear_key' removes one key and 'clear_all' every key of the acking instance only", func(t *testing.T) {
				h := fresh(t)
				h.startInstance("order-1", "P", "1.0.0", clock0, "kv_mutations", []any{kvSet("a", "1", clock0), kvSet("b", "2", clock0), kvSet("c", "3", clock0)})
				h.startInstance("order-2", "P", "1.0.0", clock0+1, "kv_mutations", []any{kvSet("a", "x", clock0)})

				h.nextTurn("order-1", clock0+10, turn{Meta: kvMutations(t, kvClearKey("b"), kvClearKey("missing"))})
				require.Equal(t, []kvRow{{"a", "1", 1, clock0}, {"c", "3", 1, clock0}}, h.kvRows("order-1"))

				h.nextTurn("order-1", clock0+20, turn{Meta: kvMutations(t, kvClearAll())})
				require.Empty(t, h.kvRows("order-1"))
				require.Len(t, h.kvRows("order-2"), 1, "another instance's keys survive")

				h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0+30)
				require.JSONEq(t, `{}`, string(h.mustFetchOrch(clock0+30, "order-1").KVRaw))
			})

			t.Run("mutations apply in order: a set before clear_all is lost, one after it survives", func(t *testing.T) {
				h := fresh(t)
				h.startInstance("order-1", "P", "1.0.0", clock0,
					"kv_mutations", []any{kvSet("x", "1", clock0), kvClearAll(), kvSet("y", "2", clock0+1), kvSet("y", "3", clock0+2), map[string]any{"action": "bogus", "key": "z"}})
				require.Equal(t, []kvRow{{"y", "3", 1, clock0 + 2}}, h.kvRows("order-1"))
			})

			t.Run("KV is written even when the ack creates no instances row", func(t *testing.T) {
				h := fresh(t)
				h.enqueueOrch("ghost", queueMessageItem("ghost", "m"), clock0)
				it := h.mustFetchOrch(clock0, "ghost")
				h.ack(it.Token, clock0+1, turn{Meta: kvMutations(t, kvSet("k", "v", clock0))})
				require.Zero(t, h.count("instances", "true"))
				require.Equal(t, []kvRow{{"k", "v", 1, clock0}}, h.kvRows("ghost"))
			})

			t.Run("a 'set' without last_updated_at_ms fails with 23502 and rolls the turn back (kept quirk)", func(t *testing.T) {
				h := fresh(t)
				h.enqueueOrch("order-1", startItem("order-1", "P", "1.0.0", 1), clock0)
				it := h.mustFetchOrch(clock0, "order-1")
				err := h.ackErr(it.Token, clock0+1, turn{
					History: historyDelta(t, startedEvent("order-1", 1, "P", "1.0.0")),
					Meta: ackMeta(t, "orchestration_name", "P", "orchestration_version", "1.0.0",
						"kv_mutations", []any{map[string]any{"action": "set", "key": "k", "value": "v"}}),
				})
				requirePgError(t, err, "23502", "")
				require.Zero(t, h.count("kv_store", "true"))
				require.Zero(t, h.count("history", "true"))
				require.Equal(t, it.Token, h.instanceLock("order-1").Token)
			})
		})
	})
}

func TestReadHelpers(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {

		// setup: order-1 ran execution 1 (events 1, 2), continued as new, and
		// execution 2 has events 1, 2 (acked in reverse order).
		e1 := []string{startedEvent("order-1", 1, "P", "1.0.0"), eventJSON("order-1", 1, 2, "OrchestrationContinuedAsNew", `"input":"{}"`)}
		e2 := []string{startedEvent("order-1", 2, "P", "1.0.0"), eventJSON("order-1", 2, 2, "ActivityScheduled", `"name":"A"`, `"input":"1"`)}
		setup := func(t *testing.T) *schemaDB {
			h := fresh(t)
			h.startInstance("order-1", "P", "1.0.0", clock0)
			h.nextTurn("order-1", clock0+10, turn{History: historyDelta(t, e1[1]), Meta: ackMeta(t, "status", "ContinuedAsNew")})
			h.nextTurn("order-1", clock0+20, turn{ExecutionID: 2, History: historyDelta(t, e2[1], e2[0]),
				Meta: ackMeta(t, "orchestration_name", "P", "orchestration_version", "1.0.0", "status", "Running")})
			return h
		}

		t.Run("fetch_history returns the events of the highest execution in executions, in event_id order", func(t *testing.T) {
			h := setup(t)
			require.Equal(t, e2, h.texts(`SELECT out_event_data FROM duroxide.fetch_history('order-1')`))

			h.exec(`UPDATE duroxide.instances SET current_execution_id = 1 WHERE instance_id = 'order-1'`)
			require.Equal(t, e2, h.texts(`SELECT out_event_data FROM duroxide.fetch_history('order-1')`),
				"the executions table decides, not instances.current_execution_id")
		})

		t.Run("fetch_history of an unknown instance returns no rows", func(t *testing.T) {
			h := setup(t)
			require.Empty(t, h.texts(`SELECT out_event_data FROM duroxide.fetch_history('nobody')`))
		})

		t.Run("fetch_history_with_execution returns exactly that execution, in event_id order", func(t *testing.T) {
			h := setup(t)
			require.Equal(t, e1, h.texts(`SELECT out_event_data FROM duroxide.fetch_history_with_execution('order-1', 1)`))
			require.Equal(t, e2, h.texts(`SELECT out_event_data FROM duroxide.fetch_history_with_execution('order-1', 2)`))
			require.Empty(t, h.texts(`SELECT out_event_data FROM duroxide.fetch_history_with_execution('order-1', 3)`))
		})

		t.Run("latest_execution_id is the current execution, and NULL for an unknown instance (kept quirk)", func(t *testing.T) {
			h := setup(t)
			var latest *int64
			h.scan(`SELECT duroxide.latest_execution_id('order-1')`, nil, &latest)
			require.Equal(t, ptrTo(int64(2)), latest)

			h.scan(`SELECT duroxide.latest_execution_id('nobody')`, nil, &latest)
			require.Nil(t, latest, "one row holding NULL, not an error")
		})

		t.Run("list_executions lists every execution id in ascending order", func(t *testing.T) {
			h := setup(t)
			require.Equal(t, []string{"1", "2"}, h.texts(`SELECT execution_id::text FROM duroxide.list_executions('order-1')`))
			require.Empty(t, h.texts(`SELECT execution_id::text FROM duroxide.list_executions('nobody')`))
		})
	})
}

func TestAppendHistoryQuirk(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {
		appendHistory := func(h *schemaDB, events json.RawMessage) error {
			return h.try(`SELECT duroxide.append_history('order-1', 1, $1)`, events)
		}

		t.Run("an empty or NULL event list is accepted and writes nothing", func(t *testing.T) {
			h := fresh(t)
			require.NoError(t, appendHistory(h, json.RawMessage(`[]`)))
			require.NoError(t, h.try(`SELECT duroxide.append_history('order-1', 1, NULL)`))
			require.Zero(t, h.count("history", "true"))
		})

		t.Run("an event_id that is missing or not positive fails with 'Invalid event_id in append_history'", func(t *testing.T) {
			h := fresh(t)
			for _, events := range []string{
				`[{"event_id":0,"event_type":"Event","event_data":"{}"}]`,
				`[{"event_id":1,"event_type":"Event","event_data":"{}"},{"event_id":-3,"event_type":"Event","event_data":"{}"}]`,
				`[{"event_type":"Event","event_data":"{}"}]`,
			} {
				requirePgError(t, appendHistory(h, json.RawMessage(events)), "P0001", "Invalid event_id in append_history")
			}
			requirePgError(t, appendHistory(h, json.RawMessage(`[{"event_id":"x","event_type":"Event","event_data":"{}"}]`)), "22P02", "")
		})

		t.Run("every valid call fails on history.created_at from version 12 on (kept quirk)", func(t *testing.T) {
			h := fresh(t)
			err := appendHistory(h, historyDelta(t, eventJSON("order-1", 1, 1, "OrchestrationStarted")))
			requirePgError(t, err, "23502", `null value in column "created_at" of relation "history" violates not-null constraint`)
			require.Zero(t, h.count("history", "true"))
		})

		t.Run("it fails even when every event already exists", func(t *testing.T) {
			h := fresh(t)
			h.startInstance("order-1", "P", "1.0.0", clock0)
			err := appendHistory(h, historyDelta(t, startedEvent("order-1", 1, "P", "1.0.0")))
			requirePgError(t, err, "23502", `null value in column "created_at" of relation "history" violates not-null constraint`)
		})
	})
}

func TestLegacyAckOrchestrationQuirk(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {
		legacyAck := func(h *schemaDB, token string) error {
			return h.try(`SELECT duroxide.ack_orchestration($1, '{}'::jsonb, $2)`, token, clock0+1)
		}

		t.Run("an unknown token fails with Invalid lock token", func(t *testing.T) {
			h := fresh(t)
			requirePgError(t, legacyAck(h, "lock_nope"), "P0001", "Invalid lock token")
		})

		t.Run("a known token always fails with 42703 and changes nothing", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("ghost", externalItem("ghost", "x"), clock0)
			it := h.mustFetchOrch(clock0, "ghost")
			requirePgError(t, legacyAck(h, it.Token), "42703", `column "status" of relation "instances" does not exist`)

			h.startInstance("order-1", "P", "1.0.0", clock0+10)
			h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0+20)
			it = h.mustFetchOrch(clock0+20, "order-1")
			requirePgError(t, legacyAck(h, it.Token), "42703", `column "completed_at" does not exist`)
			require.Equal(t, it.Token, h.instanceLock("order-1").Token)
			require.Len(t, h.orchRows(), 2)
		})
	})
}

func TestLegacyEnqueueFunctions(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {

		t.Run("the 0006 enqueue functions insert one verbatim message on the caller's clock", func(t *testing.T) {
			h := fresh(t)
			item := `{"ExternalRaised": {"instance":"order-1","name":"x","data":"{}"}}`
			h.exec(`SELECT duroxide.enqueue_orchestration_work('order-1', $1, $2)`, item, clock0)
			h.exec(`SELECT duroxide.enqueue_completion('order-2', $1, $2)`, item, clock0+1)
			h.exec(`SELECT duroxide.enqueue_message('order-3', $1, $2, $3)`, item, clock0+60_000, clock0+2)

			rows := h.orchRows()
			require.Len(t, rows, 3)
			want := []struct {
				instance           string
				visible, createdAt int64
			}{{"order-1", clock0, clock0}, {"order-2", clock0 + 1, clock0 + 1}, {"order-3", clock0 + 60_000, clock0 + 2}}
			for i, r := range rows {
				require.Equal(t, want[i].instance, r.Instance)
				require.Equal(t, item, r.WorkItem)
				require.Equal(t, msTime(want[i].visible), r.VisibleAt.UTC())
				require.Equal(t, msTime(want[i].createdAt), r.CreatedAt.UTC())
				require.Nil(t, r.Token)
				require.Zero(t, r.Attempts)
			}
			require.Zero(t, h.count("instances", "true"))
		})
	})
}
