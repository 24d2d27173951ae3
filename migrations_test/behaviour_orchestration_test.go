package migrations_test

// Behaviour of the orchestration path at version 19 and every later pack
// version: fetch, ack,
// abandon, renew and enqueue of orchestration items. Where a fix changes a
// lease by the time the call ran, or makes a renewal never shorten one, the
// claim says so (behaviour_leases_test.go).

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFetchOrchestrationItem(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {

		t.Run("an empty queue gives no row", func(t *testing.T) {
			h := fresh(t)
			require.Nil(t, h.fetchOrch(clock0))
			require.Zero(t, h.count("instance_locks", "true"))
		})

		t.Run("a new instance is named after its StartOrchestration message", func(t *testing.T) {
			h := fresh(t)
			start := startItem("order-1", "ProcessOrder", "1.0.0", 1)
			h.enqueueOrch("order-1", start, clock0)

			it := h.mustFetchOrch(clock0, "order-1")
			require.Equal(t, ptrTo("ProcessOrder"), it.Name)
			require.Equal(t, ptrTo("1.0.0"), it.Version)
			require.EqualValues(t, 1, it.ExecutionID)
			require.Empty(t, it.History)
			require.Len(t, it.Messages, 1)
			require.JSONEq(t, start, string(it.Messages[0]))
			require.Regexp(t, lockTokenRE, it.Token)
			require.EqualValues(t, 1, it.Attempts)
			require.JSONEq(t, `{}`, string(it.KVRaw))
		})

		t.Run("a StartOrchestration without a version reports 'unknown' and its own execution id", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("order-1", startItem("order-1", "ProcessOrder", nil, 3), clock0)

			it := h.mustFetchOrch(clock0, "order-1")
			require.Equal(t, ptrTo("ProcessOrder"), it.Name)
			require.Equal(t, ptrTo("unknown"), it.Version)
			require.EqualValues(t, 3, it.ExecutionID)
		})

		t.Run("a ContinueAsNew first message names a new instance, at execution 1", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("order-1", continueAsNewItem("order-1", "Loop", "2.0.0"), clock0)

			it := h.mustFetchOrch(clock0, "order-1")
			require.Equal(t, ptrTo("Loop"), it.Name)
			require.Equal(t, ptrTo("2.0.0"), it.Version)
			require.EqualValues(t, 1, it.ExecutionID)
		})

		t.Run("a new instance whose first message is neither start nor continue is Unknown/unknown", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("ghost", queueMessageItem("ghost", "m1"), clock0)

			it := h.mustFetchOrch(clock0, "ghost")
			require.Equal(t, ptrTo("Unknown"), it.Name)
			require.Equal(t, ptrTo("unknown"), it.Version)
			require.EqualValues(t, 1, it.ExecutionID)
		})

		t.Run("only the first message by id names a new instance, even if a later one is visible earlier", func(t *testing.T) {
			h := fresh(t)
			ext := externalItem("order-1", "Approval")
			start := startItem("order-1", "ProcessOrder", "1.0.0", 1)
			h.enqueueOrch("order-1", ext, clock0)
			h.enqueueOrch("order-1", start, clock0-1_000)

			it := h.mustFetchOrch(clock0, "order-1")
			require.Equal(t, ptrTo("Unknown"), it.Name)
			require.Equal(t, ptrTo("unknown"), it.Version)
			require.Len(t, it.Messages, 2)
			require.JSONEq(t, ext, string(it.Messages[0]), "messages are in id order")
			require.JSONEq(t, start, string(it.Messages[1]))
		})

		t.Run("without an instances row a legacy OrchestrationStarted history names the instance and may give NULL", func(t *testing.T) {
			h := fresh(t)
			// Branch B rule 1: history of every execution, first element with
			// top-level key OrchestrationStarted; its version is taken as is (NULL).
			h.exec(`INSERT INTO duroxide.history (instance_id, execution_id, event_id, event_type, event_data, created_at) VALUES
			('legacy', 2, 1, 'Event', '{"late":true}', now()),
			('legacy', 1, 2, 'Event', '{"second":true}', now()),
			('legacy', 1, 1, 'Event', '{"OrchestrationStarted":{"name":"Old","version":null}}', now())`)
			h.enqueueOrch("legacy", externalItem("legacy", "x"), clock0)

			it := h.mustFetchOrch(clock0, "legacy")
			require.Equal(t, ptrTo("Old"), it.Name)
			require.Nil(t, it.Version, "rule 1 has no 'unknown' default")
			require.EqualValues(t, 1, it.ExecutionID)
			require.Len(t, it.History, 3)
			require.JSONEq(t, `{"OrchestrationStarted":{"name":"Old","version":null}}`, string(it.History[0]))
			require.JSONEq(t, `{"second":true}`, string(it.History[1]))
			require.JSONEq(t, `{"late":true}`, string(it.History[2]), "ordered by (execution_id, event_id)")
		})

		t.Run("fetch leases the instance for now+timeout and claims every visible message of it", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("order-1", startItem("order-1", "P", "1.0.0", 1), clock0)
			h.enqueueOrch("order-1", externalItem("order-1", "a"), clock0+10)
			h.enqueueOrch("order-1", externalItem("order-1", "later"), clock0+60_000)
			h.enqueueOrch("other", externalItem("other", "b"), clock0+20)

			now := clock0 + 100
			it := h.mustFetchOrch(now, "order-1")
			require.Len(t, it.Messages, 2, "the future message is not part of the batch")

			lock := h.instanceLock("order-1")
			require.NotNil(t, lock)
			require.Equal(t, it.Token, lock.Token)
			requireLeaseFrom(t, h, "fetch_orchestration_item", now+lockMs, lock.LockedUntil, "the lease ends at now+timeout")
			requireStampFrom(t, h, "fetch_orchestration_item", now, lock.LockedAt, "the lease starts at now")

			rows := h.orchRows()
			require.Len(t, rows, 4)
			for _, r := range rows[:2] {
				require.Equal(t, ptrTo(it.Token), r.Token)
				require.Equal(t, ptrTo(lock.LockedUntil), r.LockedUntil, "a claimed message carries the instance's lease")
				require.EqualValues(t, 1, r.Attempts)
			}
			require.Nil(t, rows[2].Token, "a message not yet visible is not claimed")
			require.Zero(t, rows[2].Attempts)
			require.Nil(t, rows[3].Token, "another instance's message is not claimed")
			require.Nil(t, h.instanceLock("other"))
		})

		t.Run("a leased instance is not fetched again until its locked_until is reached", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("order-1", startItem("order-1", "P", "1.0.0", 1), clock0)
			first := h.mustFetchOrch(clock0, "order-1")
			until := h.instanceLock("order-1").LockedUntil
			requireLeaseFrom(t, h, "fetch_orchestration_item", clock0+lockMs, until)

			require.Nil(t, h.fetchOrch(h.justBefore("fetch_orchestration_item", until)), "the lease is live just before locked_until")

			second := h.mustFetchOrch(until, "order-1")
			require.NotEqual(t, first.Token, second.Token)
			require.EqualValues(t, 2, second.Attempts)
			lock := h.instanceLock("order-1")
			require.Equal(t, second.Token, lock.Token)
			requireLeaseFrom(t, h, "fetch_orchestration_item", until+lockMs, lock.LockedUntil)
			requireStampFrom(t, h, "fetch_orchestration_item", until, lock.LockedAt)
		})

		t.Run("the oldest visible message by (visible_at, id) picks the instance", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("late", externalItem("late", "x"), clock0)
			h.enqueueOrch("early", externalItem("early", "x"), clock0-500)
			h.enqueueOrch("tie", externalItem("tie", "x"), clock0-500)

			require.Equal(t, "early", h.fetchOrch(clock0).Instance)
			require.Equal(t, "tie", h.fetchOrch(clock0).Instance)
			require.Equal(t, "late", h.fetchOrch(clock0).Instance)
			require.Nil(t, h.fetchOrch(clock0))
		})

		t.Run("messages that arrive during the lease wait for the next turn", func(t *testing.T) {
			h := fresh(t)
			first := externalItem("order-1", "first")
			late := externalItem("order-1", "late")
			h.enqueueOrch("order-1", first, clock0)
			it := h.mustFetchOrch(clock0, "order-1")
			h.enqueueOrch("order-1", late, clock0+10)
			require.Nil(t, h.fetchOrch(clock0+20), "the instance is leased")

			h.ack(it.Token, clock0+30, turn{})
			rows := h.orchRows()
			require.Len(t, rows, 1, "ack deletes only the claimed message")
			require.Equal(t, late, rows[0].WorkItem)
			require.Nil(t, rows[0].Token)

			next := h.mustFetchOrch(clock0+40, "order-1")
			require.Len(t, next.Messages, 1)
			require.JSONEq(t, late, string(next.Messages[0]))
			require.EqualValues(t, 1, next.Attempts)
		})

		t.Run("the attempt count is the maximum over the batch", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("order-1", externalItem("order-1", "old"), clock0)
			for i := int64(0); i < 2; i++ {
				it := h.mustFetchOrch(clock0+i, "order-1")
				require.EqualValues(t, i+1, it.Attempts)
				h.exec(`SELECT duroxide.abandon_orchestration_item($1, $2, NULL, false)`, it.Token, clock0+i)
			}
			h.enqueueOrch("order-1", externalItem("order-1", "new"), clock0)

			it := h.mustFetchOrch(clock0+10, "order-1")
			require.Len(t, it.Messages, 2)
			require.EqualValues(t, 3, it.Attempts)
			rows := h.orchRows()
			require.EqualValues(t, 3, rows[0].Attempts)
			require.EqualValues(t, 1, rows[1].Attempts)
		})

		t.Run("an existing instance reports its stored metadata and its current execution's history in event_id order", func(t *testing.T) {
			h := fresh(t)
			h.startInstance("order-1", "ProcessOrder", "1.0.0", clock0)

			h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0+10)
			it := h.mustFetchOrch(clock0+10, "order-1")
			require.Equal(t, ptrTo("ProcessOrder"), it.Name)
			require.Equal(t, ptrTo("1.0.0"), it.Version)
			require.EqualValues(t, 1, it.ExecutionID)
			require.Len(t, it.History, 1)
			e3 := eventJSON("order-1", 1, 3, "TimerCreated", `"fire_at_ms":1`)
			e2 := eventJSON("order-1", 1, 2, "ExternalEvent", `"name":"x"`, `"data":"{}"`)
			h.ack(it.Token, clock0+11, turn{History: historyDelta(t, e3, e2)})

			h.enqueueOrch("order-1", externalItem("order-1", "y"), clock0+20)
			it = h.mustFetchOrch(clock0+20, "order-1")
			require.Len(t, it.History, 3)
			require.JSONEq(t, startedEvent("order-1", 1, "ProcessOrder", "1.0.0"), string(it.History[0]))
			require.JSONEq(t, e2, string(it.History[1]))
			require.JSONEq(t, e3, string(it.History[2]))

			// Continue as new: execution 2 becomes current; its history alone is returned.
			h.ack(it.Token, clock0+21, turn{ExecutionID: 2, History: historyDelta(t, startedEvent("order-1", 2, "ProcessOrder", "1.0.0")),
				Meta: ackMeta(t, "orchestration_name", "ProcessOrder", "orchestration_version", "1.0.0", "status", "Running")})
			h.enqueueOrch("order-1", externalItem("order-1", "z"), clock0+30)
			it = h.mustFetchOrch(clock0+30, "order-1")
			require.EqualValues(t, 2, it.ExecutionID)
			require.Len(t, it.History, 1)
			require.JSONEq(t, startedEvent("order-1", 2, "ProcessOrder", "1.0.0"), string(it.History[0]))
		})

		t.Run("an instance row with a NULL version reports 'unknown'", func(t *testing.T) {
			h := fresh(t)
			h.exec(`INSERT INTO duroxide.instances (instance_id, orchestration_name, orchestration_version, current_execution_id, created_at, updated_at)
			VALUES ('order-1', 'Stored', NULL, 4, now(), now())`)
			h.enqueueOrch("order-1", startItem("order-1", "FromMessage", "9.9.9", 1), clock0)

			it := h.mustFetchOrch(clock0, "order-1")
			require.Equal(t, ptrTo("Stored"), it.Name, "the instances row wins over the message")
			require.Equal(t, ptrTo("unknown"), it.Version)
			require.EqualValues(t, 4, it.ExecutionID)
		})

		t.Run("a work item that is not JSON fails the fetch with 22P02 and claims nothing", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("bad", "not json", clock0)

			it, err := h.fetchOrchErr(clock0, lockMs, nil, nil)
			require.Nil(t, it)
			requirePgError(t, err, "22P02", "")
			require.Nil(t, h.instanceLock("bad"), "the lease is rolled back")
			rows := h.orchRows()
			require.Nil(t, rows[0].Token)
			require.Zero(t, rows[0].Attempts)
		})
	})
}

func TestFetchVersionFilter(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {
		const packed = 1_002_003 // 1.2.3
		now := clock0 + 1_000

		// setup: "pinned" runs on duroxide 1.2.3, "free" was never pinned; each
		// has one message waiting, pinned's being the older.
		setup := func(t *testing.T) *schemaDB {
			h := fresh(t)
			h.startInstance("pinned", "P", "1.0.0", clock0, "pinned_duroxide_version", pinVersion(1, 2, 3))
			h.startInstance("free", "F", "1.0.0", clock0+10)
			h.enqueueOrch("pinned", externalItem("pinned", "go"), clock0+100)
			h.enqueueOrch("free", externalItem("free", "go"), clock0+200)
			return h
		}

		t.Run("a pinned execution is fetched when min <= version <= max, both bounds inclusive", func(t *testing.T) {
			h := setup(t)
			it, err := h.fetchOrchErr(now, lockMs, packed, packed)
			require.NoError(t, err)
			require.NotNil(t, it)
			require.Equal(t, "pinned", it.Instance)
		})

		t.Run("a pinned execution outside the range is skipped and not locked", func(t *testing.T) {
			h := setup(t)
			it, err := h.fetchOrchErr(now, lockMs, 0, packed-1)
			require.NoError(t, err)
			require.NotNil(t, it)
			require.Equal(t, "free", it.Instance, "unpinned instances always pass")
			require.Nil(t, h.instanceLock("pinned"))
			require.Zero(t, h.count("orchestrator_queue", "instance_id = 'pinned' AND (lock_token IS NOT NULL OR attempt_count <> 0)"))

			it, err = h.fetchOrchErr(now, lockMs, packed+1, 2_000_000)
			require.NoError(t, err)
			require.Nil(t, it, "above the range too")
		})

		t.Run("an instance with no instances row passes any range", func(t *testing.T) {
			h := setup(t)
			h.enqueueOrch("brand-new", startItem("brand-new", "N", "1.0.0", 1), clock0)
			it, err := h.fetchOrchErr(now, lockMs, 5_000_000, 6_000_000)
			require.NoError(t, err)
			require.NotNil(t, it)
			require.Equal(t, "brand-new", it.Instance)
		})

		t.Run("min without max rejects every pinned execution (kept quirk)", func(t *testing.T) {
			h := setup(t)
			it, err := h.fetchOrchErr(now, lockMs, 0, nil)
			require.NoError(t, err)
			require.NotNil(t, it)
			require.Equal(t, "free", it.Instance, "pinned is older but fails the range test against a NULL max")
			it, err = h.fetchOrchErr(now, lockMs, 0, nil)
			require.NoError(t, err)
			require.Nil(t, it)
		})

		t.Run("max without min does not filter at all (kept quirk)", func(t *testing.T) {
			h := setup(t)
			it, err := h.fetchOrchErr(now, lockMs, nil, 0)
			require.NoError(t, err)
			require.NotNil(t, it)
			require.Equal(t, "pinned", it.Instance, "max 0 would exclude 1.2.3 if it were applied")
		})
	})
}

func TestAckOrchestrationItem(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {

		t.Run("ack with an unknown token fails with Invalid lock token", func(t *testing.T) {
			h := fresh(t)
			requirePgError(t, h.ackErr("lock_00000000-0000-0000-0000-000000000000", clock0, turn{}), "P0001", "Invalid lock token")
		})

		t.Run("ack with an expired lease fails with Invalid lock token and changes nothing", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("order-1", startItem("order-1", "P", "1.0.0", 1), clock0)
			it := h.mustFetchOrch(clock0, "order-1")
			tr := turn{
				History: historyDelta(t, startedEvent("order-1", 1, "P", "1.0.0")),
				Meta:    ackMeta(t, "orchestration_name", "P", "orchestration_version", "1.0.0", "status", "Running"),
			}

			until := h.instanceLock("order-1").LockedUntil
			requireLeaseFrom(t, h, "fetch_orchestration_item", clock0+lockMs, until)

			requirePgError(t, h.ackErr(it.Token, until, tr), "P0001", "Invalid lock token")
			require.Zero(t, h.count("history", "true"))
			require.Zero(t, h.count("instances", "true"))
			require.Zero(t, h.count("executions", "true"))
			require.NotNil(t, h.instanceLock("order-1"), "nobody took the lease over; it is still there")
			require.Len(t, h.orchRows(), 1)

			h.ack(it.Token, until-1, tr)
			require.EqualValues(t, 1, h.count("history", "true"), "one ms earlier the same ack succeeds")
		})

		t.Run("a second ack with the same token fails with Invalid lock token", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0)
			it := h.mustFetchOrch(clock0, "order-1")
			h.ack(it.Token, clock0+1, turn{})
			requirePgError(t, h.ackErr(it.Token, clock0+2, turn{}), "P0001", "Invalid lock token")
		})

		t.Run("the first ack creates instance, execution and history, consumes the batch and releases the lease", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("child", childStartItem("child", "Charge", "parent"), clock0)
			it := h.mustFetchOrch(clock0, "child")
			started := startedEvent("child", 1, "Charge", "1.0.0")
			scheduled := eventJSON("child", 1, 2, "ActivityScheduled", `"name":"Charge"`, `"input":"\"x\""`)
			now := clock0 + 100
			h.ack(it.Token, now, turn{
				History: historyDelta(t, started, scheduled),
				Meta: ackMeta(t, "orchestration_name", "Charge", "orchestration_version", "1.0.0", "status", "Running",
					"parent_instance_id", "parent"),
			})

			var (
				name, version, parent string
				current               int64
				created, updated      time.Time
				customStatus          *string
				customVersion         int32
			)
			h.scan(`SELECT orchestration_name, orchestration_version, current_execution_id, created_at, updated_at,
			parent_instance_id, custom_status, custom_status_version FROM duroxide.instances WHERE instance_id = 'child'`, nil,
				&name, &version, &current, &created, &updated, &parent, &customStatus, &customVersion)
			require.Equal(t, "Charge", name)
			require.Equal(t, "1.0.0", version)
			require.EqualValues(t, 1, current)
			require.Equal(t, msTime(now), created.UTC())
			require.Equal(t, msTime(now), updated.UTC())
			require.Equal(t, "parent", parent)
			require.Nil(t, customStatus)
			require.Zero(t, customVersion)

			var (
				status              string
				output              *string
				started_at          time.Time
				completedAt         *time.Time
				major, minor, patch *int32
			)
			h.scan(`SELECT status, output, started_at, completed_at, duroxide_version_major, duroxide_version_minor, duroxide_version_patch
			FROM duroxide.executions WHERE instance_id = 'child' AND execution_id = 1`, nil,
				&status, &output, &started_at, &completedAt, &major, &minor, &patch)
			require.Equal(t, "Running", status)
			require.Nil(t, output)
			require.Equal(t, msTime(now), started_at.UTC())
			require.Nil(t, completedAt)
			require.Nil(t, major)

			rows, err := h.pool.Query(h.ctx(), `SELECT event_id, event_type, event_data, created_at FROM duroxide.history
			WHERE instance_id = 'child' AND execution_id = 1 ORDER BY event_id`)
			require.NoError(t, err)
			type hrow struct {
				ID        int64
				Type      string
				Data      string
				CreatedAt time.Time
			}
			var got []hrow
			for rows.Next() {
				var r hrow
				require.NoError(t, rows.Scan(&r.ID, &r.Type, &r.Data, &r.CreatedAt))
				r.CreatedAt = r.CreatedAt.UTC()
				got = append(got, r)
			}
			require.NoError(t, rows.Err())
			require.Equal(t, []hrow{{1, "Event", started, msTime(now)}, {2, "Event", scheduled, msTime(now)}}, got)

			require.Empty(t, h.orchRows(), "the claimed message is consumed")
			require.Nil(t, h.instanceLock("child"), "the lease is released")
		})

		t.Run("event_data is stored exactly as sent, not re-normalised", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0)
			it := h.mustFetchOrch(clock0, "order-1")
			odd := `{"event_id":1,  "type" : "OrchestrationStarted", "b":1, "a":2, "a":3}`
			h.ack(it.Token, clock0+1, turn{History: json.RawMessage(`[{"event_id":1,"event_type":"Event","event_data":` + jsonValue(odd) + `}]`)})
			require.Equal(t, []string{odd}, h.texts(`SELECT event_data FROM duroxide.history`))
		})

		t.Run("without both name and version no instances row is created, but the execution row is", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("ghost", queueMessageItem("ghost", "m1"), clock0)
			it := h.mustFetchOrch(clock0, "ghost")
			h.ack(it.Token, clock0+1, turn{Meta: ackMeta(t, "orchestration_name", "OnlyName", "status", "Running")})

			require.Zero(t, h.count("instances", "true"))
			require.EqualValues(t, 1, h.count("executions", "instance_id = 'ghost' AND execution_id = 1 AND status = 'Running'"))
			require.Empty(t, h.orchRows())
			require.Nil(t, h.instanceLock("ghost"))
		})

		t.Run("a later ack overwrites name and version but keeps an existing parent", func(t *testing.T) {
			h := fresh(t)
			h.startInstance("order-1", "P", "1.0.0", clock0, "parent_instance_id", "first-parent")
			h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0+10)
			it := h.mustFetchOrch(clock0+10, "order-1")
			h.ack(it.Token, clock0+20, turn{Meta: ackMeta(t, "orchestration_name", "P2", "orchestration_version", "2.0.0",
				"parent_instance_id", "second-parent")})

			var name, version, parent string
			var created, updated time.Time
			h.scan(`SELECT orchestration_name, orchestration_version, parent_instance_id, created_at, updated_at
			FROM duroxide.instances WHERE instance_id = 'order-1'`, nil, &name, &version, &parent, &created, &updated)
			require.Equal(t, "P2", name)
			require.Equal(t, "2.0.0", version)
			require.Equal(t, "first-parent", parent)
			require.Equal(t, msTime(clock0+1), created.UTC(), "created_at is the first ack's")
			require.Equal(t, msTime(clock0+20), updated.UTC())
		})

		t.Run("status Completed or Failed stamps completed_at and output; any other status clears both", func(t *testing.T) {
			h := fresh(t)
			h.startInstance("order-1", "P", "1.0.0", clock0)
			execRow := func() (string, *string, *time.Time) {
				var status string
				var output *string
				var completed *time.Time
				h.scan(`SELECT status, output, completed_at FROM duroxide.executions WHERE instance_id = 'order-1' AND execution_id = 1`,
					nil, &status, &output, &completed)
				if completed != nil {
					completed = ptrTo(completed.UTC())
				}
				return status, output, completed
			}
			ackStatus := func(now int64, kv ...any) {
				h.enqueueOrch("order-1", externalItem("order-1", "x"), now)
				it := h.mustFetchOrch(now, "order-1")
				h.ack(it.Token, now+1, turn{Meta: ackMeta(t, kv...)})
			}

			ackStatus(clock0+100, "status", "Completed", "output", `"done"`)
			status, output, completed := execRow()
			require.Equal(t, "Completed", status)
			require.Equal(t, ptrTo(`"done"`), output)
			require.Equal(t, ptrTo(msTime(clock0+101)), completed)

			ackStatus(clock0+200, "status", "ContinuedAsNew")
			status, output, completed = execRow()
			require.Equal(t, "ContinuedAsNew", status)
			require.Nil(t, output, "an absent output is written as NULL")
			require.Nil(t, completed, "a status other than Completed/Failed clears completed_at")

			ackStatus(clock0+300, "status", "Failed", "output", "boom")
			status, output, completed = execRow()
			require.Equal(t, "Failed", status)
			require.Equal(t, ptrTo("boom"), output)
			require.Equal(t, ptrTo(msTime(clock0+301)), completed)

			ackStatus(clock0 + 400)
			status, _, completed = execRow()
			require.Equal(t, "Failed", status, "a NULL status leaves the execution alone")
			require.Equal(t, ptrTo(msTime(clock0+301)), completed)
		})

		t.Run("current_execution_id only ever grows", func(t *testing.T) {
			h := fresh(t)
			h.startInstance("order-1", "P", "1.0.0", clock0)
			for i, exec := range []int64{3, 2} {
				now := clock0 + 100*int64(i+1)
				h.enqueueOrch("order-1", externalItem("order-1", "x"), now)
				it := h.mustFetchOrch(now, "order-1")
				h.ack(it.Token, now+1, turn{ExecutionID: exec})
			}
			var current int64
			h.scan(`SELECT duroxide.latest_execution_id('order-1')`, nil, &current)
			require.EqualValues(t, 3, current)
			require.Equal(t, []string{"1", "2", "3"}, h.texts(`SELECT execution_id::text FROM duroxide.list_executions('order-1')`),
				"every acked execution id gets a Running row")
		})

		t.Run("a pinned duroxide version is written to the execution; a JSON null leaves it alone", func(t *testing.T) {
			h := fresh(t)
			h.startInstance("order-1", "P", "1.0.0", clock0, "pinned_duroxide_version", pinVersion(0, 1, 29))
			pinned := func() [3]*int32 {
				var p [3]*int32
				h.scan(`SELECT duroxide_version_major, duroxide_version_minor, duroxide_version_patch FROM duroxide.executions
				WHERE instance_id = 'order-1' AND execution_id = 1`, nil, &p[0], &p[1], &p[2])
				return p
			}
			require.Equal(t, [3]*int32{ptrTo(int32(0)), ptrTo(int32(1)), ptrTo(int32(29))}, pinned())

			h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0+10)
			it := h.mustFetchOrch(clock0+10, "order-1")
			h.ack(it.Token, clock0+11, turn{Meta: ackMeta(t, "pinned_duroxide_version", nil)})
			require.Equal(t, [3]*int32{ptrTo(int32(0)), ptrTo(int32(1)), ptrTo(int32(29))}, pinned())

			h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0+20)
			it = h.mustFetchOrch(clock0+20, "order-1")
			h.ack(it.Token, clock0+21, turn{Meta: ackMeta(t, "pinned_duroxide_version", map[string]any{"major": 2})})
			require.Equal(t, [3]*int32{ptrTo(int32(2)), nil, nil}, pinned(), "the pin is overwritten; missing parts become NULL")
		})

		t.Run("a duplicate event id fails with 23505, rolls the whole turn back and keeps the lease", func(t *testing.T) {
			h := fresh(t)
			h.startInstance("order-1", "P", "1.0.0", clock0)
			h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0+10)
			it := h.mustFetchOrch(clock0+10, "order-1")
			bad := turn{
				History: historyDelta(t, eventJSON("order-1", 1, 2, "ExternalEvent"), eventJSON("order-1", 1, 1, "OrchestrationStarted")),
				Worker:  rawArray(activityExecuteItem("order-1", 1, 2, nil, nil)),
				Meta:    ackMeta(t, "status", "Completed", "kv_mutations", []any{kvSet("k", "v", clock0)}),
			}
			requirePgError(t, h.ackErr(it.Token, clock0+11, bad), "23505", "")

			require.EqualValues(t, 1, h.count("history", "true"))
			require.Empty(t, h.workerRows())
			require.Zero(t, h.count("kv_store", "true"))
			require.EqualValues(t, 1, h.count("executions", "status = 'Running'"))
			require.Equal(t, it.Token, h.instanceLock("order-1").Token)
			require.Len(t, h.orchRows(), 1)

			h.ack(it.Token, clock0+12, turn{History: historyDelta(t, eventJSON("order-1", 1, 2, "ExternalEvent"))})
			require.EqualValues(t, 2, h.count("history", "true"))
		})

		t.Run("worker items are stored as jsonb text, with the identity of an ActivityExecute", func(t *testing.T) {
			h := fresh(t)
			h.startInstance("order-1", "P", "1.0.0", clock0)
			h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0+10)
			it := h.mustFetchOrch(clock0+10, "order-1")
			withSession := activityExecuteItem("order-1", 1, 2, "s1", "gpu")
			plain := activityExecuteItem("order-1", 1, 3, nil, nil)
			other := `{"Other": {"instance": "order-1", "id": 9}}`
			now := clock0 + 11
			h.ack(it.Token, now, turn{Worker: rawArray(withSession, plain, other)})

			canonical := func(s string) string {
				var out string
				h.scan(`SELECT $1::jsonb::text`, []any{s}, &out)
				return out
			}
			rows := h.workerRows()
			require.Len(t, rows, 3)
			for i, want := range []string{withSession, plain, other} {
				require.Equal(t, canonical(want), rows[i].WorkItem, "row %d", i)
				require.Equal(t, msTime(now), rows[i].VisibleAt.UTC())
				require.Equal(t, msTime(now), rows[i].CreatedAt.UTC())
				require.Nil(t, rows[i].Token)
				require.Nil(t, rows[i].LockedUntil)
				require.Zero(t, rows[i].Attempts)
			}
			require.NotEqual(t, withSession, rows[0].WorkItem, "not the caller's string")
			require.Equal(t, ptrTo("order-1"), rows[0].Instance)
			require.Equal(t, ptrTo(int64(1)), rows[0].ExecutionID)
			require.Equal(t, ptrTo(int64(2)), rows[0].ActivityID)
			require.Equal(t, ptrTo("s1"), rows[0].Session)
			require.Equal(t, ptrTo("gpu"), rows[0].Tag)
			require.Equal(t, ptrTo(int64(3)), rows[1].ActivityID)
			require.Nil(t, rows[1].Session)
			require.Nil(t, rows[1].Tag)
			require.Nil(t, rows[2].Instance, "a non-ActivityExecute item has no identity")
			require.Nil(t, rows[2].ActivityID)
		})

		t.Run("cancelled activities are deleted after the turn's worker items are inserted, leased or not", func(t *testing.T) {
			h := fresh(t)
			h.startInstance("order-1", "P", "1.0.0", clock0)
			h.exec(`SELECT duroxide.enqueue_worker_work($1, $2, 'order-1', 1, 2, NULL, NULL)`, activityExecuteItem("order-1", 1, 2, nil, nil), clock0)
			inFlight := h.fetchDefault(clock0 + 5)
			require.NotNil(t, inFlight)

			h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0+10)
			it := h.mustFetchOrch(clock0+10, "order-1")
			h.ack(it.Token, clock0+11, turn{
				Worker: rawArray(activityExecuteItem("order-1", 1, 3, nil, nil), activityExecuteItem("order-1", 1, 4, nil, nil)),
				Cancelled: mustJSON(t, []map[string]any{
					{"instance": "order-1", "execution_id": 1, "activity_id": 2},
					{"instance": "order-1", "execution_id": 1, "activity_id": 3},
					{"instance": "order-1", "activity_id": 4}, // no execution_id: matches nothing
				}),
			})
			rows := h.workerRows()
			require.Len(t, rows, 1)
			require.Equal(t, ptrTo(int64(4)), rows[0].ActivityID)
		})

		t.Run("orchestrator items go to their target instance; a TimerFired waits for fire_at_ms", func(t *testing.T) {
			h := fresh(t)
			h.startInstance("order-1", "P", "1.0.0", clock0)
			h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0+10)
			it := h.mustFetchOrch(clock0+10, "order-1")
			now := clock0 + 11
			items := []string{
				childStartItem("order-1::sub::2", "Child", "order-1"),
				subOrchCompletedItem("grand-parent"),
				timerFiredItem("order-1", 1, 4, clock0+60_000),
				timerFiredItem("order-1", 1, 5, 0),
				timerFiredItem("order-1", 1, 6, clock0-1_000),
				`{"Mystery":{"instance":"elsewhere"}}`,
				externalItem("someone-else", "ping"),
			}
			h.ack(it.Token, now, turn{Orch: rawArray(items...)})

			rows := h.orchRows()
			require.Len(t, rows, len(items))
			wantInstance := []string{"order-1::sub::2", "grand-parent", "order-1", "order-1", "order-1", "order-1", "someone-else"}
			wantVisible := []int64{now, now, clock0 + 60_000, now, clock0 - 1_000, now, now}
			for i, r := range rows {
				var canonical string
				h.scan(`SELECT $1::jsonb::text`, []any{items[i]}, &canonical)
				require.Equal(t, wantInstance[i], r.Instance, "item %d", i)
				require.Equal(t, msTime(wantVisible[i]), r.VisibleAt.UTC(), "item %d", i)
				require.Equal(t, canonical, r.WorkItem, "item %d", i)
				require.Equal(t, msTime(now), r.CreatedAt.UTC())
				require.Nil(t, r.Token)
				require.Zero(t, r.Attempts)
			}
		})

		t.Run("an orchestrator item without its target instance fails with 23502 and rolls back", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("order-1", startItem("order-1", "P", "1.0.0", 1), clock0)
			it := h.mustFetchOrch(clock0, "order-1")
			err := h.ackErr(it.Token, clock0+1, turn{
				History: historyDelta(t, startedEvent("order-1", 1, "P", "1.0.0")),
				Orch:    rawArray(`{"ExternalRaised":{"instance":null,"name":"x","data":"{}"}}`),
				Meta:    ackMeta(t, "orchestration_name", "P", "orchestration_version", "1.0.0"),
			})
			requirePgError(t, err, "23502", "")
			require.Zero(t, h.count("history", "true"))
			require.Zero(t, h.count("instances", "true"))
			require.NotNil(t, h.instanceLock("order-1"))
		})

		t.Run("an array argument given as a JSON scalar fails with 22023", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0)
			it := h.mustFetchOrch(clock0, "order-1")
			requirePgError(t, h.ackErr(it.Token, clock0+1, turn{Worker: json.RawMessage(`null`)}), "22023", "")
			requirePgError(t, h.ackErr(it.Token, clock0+1, turn{Meta: json.RawMessage(`{"kv_mutations": null}`)}), "22023", "")
			require.NotNil(t, h.instanceLock("order-1"))
		})
	})
}

func TestAbandonOrchestrationItem(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {

		// setup: one message visible since clock0-1000, fetched at clock0.
		setup := func(t *testing.T) (*schemaDB, *orchItem) {
			h := fresh(t)
			h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0-1_000)
			return h, h.mustFetchOrch(clock0, "order-1")
		}
		abandon := func(h *schemaDB, token string, now int64, delay, ignore any) (string, error) {
			var instance string
			err := h.pool.QueryRow(h.ctx(), `SELECT duroxide.abandon_orchestration_item($1, $2, $3, $4)`, token, now, delay, ignore).Scan(&instance)
			return instance, err
		}

		t.Run("abandon returns the instance id, releases lease and messages and keeps visible_at", func(t *testing.T) {
			h, it := setup(t)
			instance, err := abandon(h, it.Token, clock0+10, nil, false)
			require.NoError(t, err)
			require.Equal(t, "order-1", instance)
			require.Nil(t, h.instanceLock("order-1"))
			rows := h.orchRows()
			require.Nil(t, rows[0].Token)
			require.Nil(t, rows[0].LockedUntil)
			require.Equal(t, msTime(clock0-1_000), rows[0].VisibleAt.UTC())
			require.EqualValues(t, 1, rows[0].Attempts)

			again := h.mustFetchOrch(clock0+10, "order-1")
			require.EqualValues(t, 2, again.Attempts)
		})

		t.Run("abandon with a delay hides the messages until now + delay", func(t *testing.T) {
			h, it := setup(t)
			_, err := abandon(h, it.Token, clock0+10, int64(1_000), false)
			require.NoError(t, err)
			require.Equal(t, msTime(clock0+1_010), h.orchRows()[0].VisibleAt.UTC())
			require.Nil(t, h.fetchOrch(h.justBefore("fetch_orchestration_item", clock0+1_010)))
			require.NotNil(t, h.fetchOrch(clock0+1_010))
		})

		t.Run("a delay of zero leaves visible_at unchanged", func(t *testing.T) {
			h, it := setup(t)
			_, err := abandon(h, it.Token, clock0+10, int64(0), false)
			require.NoError(t, err)
			require.Equal(t, msTime(clock0-1_000), h.orchRows()[0].VisibleAt.UTC())
		})

		t.Run("ignore_attempt gives the attempt back, never below zero; NULL counts as false", func(t *testing.T) {
			h, it := setup(t)
			_, err := abandon(h, it.Token, clock0+10, nil, true)
			require.NoError(t, err)
			require.Zero(t, h.orchRows()[0].Attempts)

			it = h.mustFetchOrch(clock0+20, "order-1")
			require.EqualValues(t, 1, it.Attempts, "the next fetch reports 1 again")
			_, err = abandon(h, it.Token, clock0+30, nil, nil)
			require.NoError(t, err)
			require.EqualValues(t, 1, h.orchRows()[0].Attempts)

			it = h.mustFetchOrch(clock0+40, "order-1")
			h.exec(`UPDATE duroxide.orchestrator_queue SET attempt_count = 0`)
			_, err = abandon(h, it.Token, clock0+50, nil, true)
			require.NoError(t, err)
			require.Zero(t, h.orchRows()[0].Attempts)
		})

		t.Run("abandon with an unknown token fails with Invalid lock token", func(t *testing.T) {
			h, _ := setup(t)
			_, err := abandon(h, "lock_nope", clock0+10, nil, false)
			requirePgError(t, err, "P0001", "Invalid lock token")
			require.NotNil(t, h.instanceLock("order-1"), "the real lease is untouched")
		})

		t.Run("an expired lease that nobody took over can still be abandoned", func(t *testing.T) {
			h, it := setup(t)
			instance, err := abandon(h, it.Token, clock0+lockMs+60_000, nil, false)
			require.NoError(t, err)
			require.Equal(t, "order-1", instance)
			require.Nil(t, h.instanceLock("order-1"))
		})
	})
}

func TestRenewOrchestrationItemLock(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {

		setup := func(t *testing.T) (*schemaDB, *orchItem) {
			h := fresh(t)
			h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0)
			return h, h.mustFetchOrch(clock0, "order-1")
		}
		renew := func(h *schemaDB, token string, now, secs int64) error {
			return h.try(`SELECT duroxide.renew_orchestration_item_lock($1, $2, $3)`, token, now, secs)
		}

		t.Run("renew sets lease and claimed messages to now + seconds and keeps others away", func(t *testing.T) {
			h, it := setup(t)
			require.NoError(t, renew(h, it.Token, clock0+3_000, 5))
			lock := h.instanceLock("order-1")
			require.Equal(t, it.Token, lock.Token)
			requireLeaseFrom(t, h, "renew_orchestration_item_lock", clock0+8_000, lock.LockedUntil)
			requireStampFrom(t, h, "fetch_orchestration_item", clock0, lock.LockedAt, "renew leaves locked_at alone")
			require.Equal(t, ptrTo(lock.LockedUntil), h.orchRows()[0].LockedUntil)

			require.Nil(t, h.fetchOrch(clock0+lockMs+1_000), "past the original lease the instance is still held")
			h.ack(it.Token, clock0+7_999, turn{})
		})

		t.Run("renew can shorten a lease; from the fix of renew_orchestration_item_lock on it never does", func(t *testing.T) {
			h, it := setup(t)
			before := h.instanceLock("order-1").LockedUntil
			require.NoError(t, renew(h, it.Token, clock0+1_000, 0))
			if h.hasFix("renew_orchestration_item_lock") {
				require.Equal(t, before, h.instanceLock("order-1").LockedUntil, "a renewal never shortens the lease")
				require.Nil(t, h.fetchOrch(clock0+1_000), "the instance is still held")
				return
			}
			require.Equal(t, clock0+1_000, h.instanceLock("order-1").LockedUntil)
			next := h.mustFetchOrch(clock0+1_000, "order-1")
			require.NotEqual(t, it.Token, next.Token)
		})

		t.Run("renew at or after locked_until fails with 'Lock token invalid, expired, or already released'", func(t *testing.T) {
			h, it := setup(t)
			until := h.instanceLock("order-1").LockedUntil
			requireLeaseFrom(t, h, "fetch_orchestration_item", clock0+lockMs, until)
			requirePgError(t, renew(h, it.Token, until, 5), "P0001", "Lock token invalid, expired, or already released")
			require.Equal(t, until, h.instanceLock("order-1").LockedUntil)
			require.Equal(t, ptrTo(until), h.orchRows()[0].LockedUntil)
		})

		t.Run("renew after ack or with an unknown token fails", func(t *testing.T) {
			h, it := setup(t)
			h.ack(it.Token, clock0+1, turn{})
			requirePgError(t, renew(h, it.Token, clock0+2, 5), "P0001", "Lock token invalid, expired, or already released")
			requirePgError(t, renew(h, "lock_nope", clock0+2, 5), "P0001", "Lock token invalid, expired, or already released")
		})
	})
}

func TestEnqueueOrchestratorWork(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {

		t.Run("enqueue stores the item verbatim at the given visible_at, created_at from the database clock", func(t *testing.T) {
			h := fresh(t)
			item := `{"ExternalRaised": {"name":"x", "instance":"order-1","data":"{}"}}`
			var before, after time.Time
			h.scan(`SELECT clock_timestamp()`, nil, &before)
			h.exec(`SELECT duroxide.enqueue_orchestrator_work($1, $2, $3, 'Ignored', '9.9.9', 42)`, "order-1", item, msTime(clock0+123))
			h.scan(`SELECT clock_timestamp()`, nil, &after)

			rows := h.orchRows()
			require.Len(t, rows, 1)
			r := rows[0]
			require.Equal(t, "order-1", r.Instance)
			require.Equal(t, item, r.WorkItem)
			require.Equal(t, msTime(clock0+123), r.VisibleAt.UTC())
			require.Nil(t, r.Token)
			require.Nil(t, r.LockedUntil)
			require.Zero(t, r.Attempts)
			require.False(t, r.CreatedAt.Before(before), "created_at %v before %v", r.CreatedAt, before)
			require.False(t, r.CreatedAt.After(after), "created_at %v after %v", r.CreatedAt, after)
			require.Zero(t, h.count("instances", "true"), "enqueue never creates the instance")
			require.Zero(t, h.count("executions", "true"))
		})

		t.Run("a message is invisible to fetch until its visible_at", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("order-1", timerFiredItem("order-1", 1, 4, clock0+60_000), clock0+60_000)
			require.Nil(t, h.fetchOrch(h.justBefore("fetch_orchestration_item", clock0+60_000)))
			require.NotNil(t, h.fetchOrch(clock0+60_000))
		})

		t.Run("a NULL visible_at or instance fails with 23502", func(t *testing.T) {
			h := fresh(t)
			requirePgError(t, h.try(`SELECT duroxide.enqueue_orchestrator_work('order-1', '{}', NULL)`), "23502", "")
			requirePgError(t, h.try(`SELECT duroxide.enqueue_orchestrator_work(NULL, '{}', $1)`, msTime(clock0)), "23502", "")
			require.Empty(t, h.orchRows())
		})
	})
}
