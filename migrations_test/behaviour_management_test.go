package migrations_test

// Behaviour of the management surface at version 19: instance and execution info, metrics, listings, parent and
// children, delete_instances_atomic, prune_executions, cleanup_schema.

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/packfacts"
)

// buildWorld fills h with instances in several states. Creation times
// (ack times) are clock0+1, clock0+101, ... in the order listed.
//
//	root        Running                          created clock0+1
//	child-b     Running,   parent root           created clock0+101
//	child-a     Completed, parent root           created clock0+201
//	grandchild  Running,   parent child-b        created clock0+301
//	done        Completed, output "ok", 2 events created clock0+401
//	failed      Failed                           created clock0+501
//	can         ContinuedAsNew                   created clock0+601
//	multi       execution 1 Failed, execution 2 (current) Running, created clock0+701
//	nocurrent   instances row only, NULL version, current execution 5 (no row), created clock0+800
//	ghost       an executions row (Running) and no instances row
func buildWorld(h *schemaDB) {
	t := h.t
	h.startInstance("root", "Root", "1.0.0", clock0)
	h.startInstance("child-b", "Child", "1.0.0", clock0+100, "parent_instance_id", "root")
	h.startInstance("child-a", "Child", "1.0.0", clock0+200, "parent_instance_id", "root")
	h.nextTurn("child-a", clock0+210, turn{Meta: ackMeta(t, "status", "Completed", "output", "a")})
	h.startInstance("grandchild", "Grand", "1.0.0", clock0+300, "parent_instance_id", "child-b")
	h.startInstance("done", "P", "1.0.0", clock0+400)
	h.nextTurn("done", clock0+410, turn{History: historyDelta(t, eventJSON("done", 1, 2, "OrchestrationCompleted", `"output":"\"ok\""`)),
		Meta: ackMeta(t, "status", "Completed", "output", `"ok"`)})
	h.startInstance("failed", "P", "1.0.0", clock0+500)
	h.nextTurn("failed", clock0+510, turn{Meta: ackMeta(t, "status", "Failed", "output", "boom")})
	h.startInstance("can", "P", "1.0.0", clock0+600)
	h.nextTurn("can", clock0+610, turn{Meta: ackMeta(t, "status", "ContinuedAsNew")})
	h.startInstance("multi", "P", "1.0.0", clock0+700)
	h.nextTurn("multi", clock0+710, turn{Meta: ackMeta(t, "status", "Failed")})
	h.nextTurn("multi", clock0+720, turn{ExecutionID: 2, History: historyDelta(t, startedEvent("multi", 2, "P", "1.0.0")),
		Meta: ackMeta(t, "status", "Running")})
	h.exec(`INSERT INTO duroxide.instances (instance_id, orchestration_name, orchestration_version, current_execution_id, created_at, updated_at)
		VALUES ('nocurrent', 'N', NULL, 5, $1, $1)`, msTime(clock0+800))
	h.enqueueOrch("ghost", queueMessageItem("ghost", "m"), clock0+900)
	it := h.mustFetchOrch(clock0+900, "ghost")
	h.ack(it.Token, clock0+901, turn{})
}

// instanceInfo is get_instance_info's row.
type instanceInfo struct {
	InstanceID     string
	Name           string
	Version        string
	CurrentExecID  int64
	CreatedAt      time.Time
	UpdatedAt      time.Time
	Status, Output *string
	Parent         *string
}

func TestInstanceQueries(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {
		world := fresh(t)
		buildWorld(world)

		info := func(h *schemaDB, id string) *instanceInfo {
			rows, err := h.pool.Query(h.ctx(), `SELECT instance_id, orchestration_name, orchestration_version, current_execution_id,
			created_at, updated_at, status, output, parent_instance_id FROM duroxide.get_instance_info($1)`, id)
			require.NoError(h.t, err)
			defer rows.Close()
			var out []instanceInfo
			for rows.Next() {
				var i instanceInfo
				require.NoError(h.t, rows.Scan(&i.InstanceID, &i.Name, &i.Version, &i.CurrentExecID, &i.CreatedAt, &i.UpdatedAt, &i.Status, &i.Output, &i.Parent))
				i.CreatedAt, i.UpdatedAt = i.CreatedAt.UTC(), i.UpdatedAt.UTC()
				out = append(out, i)
			}
			require.NoError(h.t, rows.Err())
			require.LessOrEqual(h.t, len(out), 1)
			if len(out) == 0 {
				return nil
			}
			return &out[0]
		}

		t.Run("get_instance_info joins the instance with its current execution", func(t *testing.T) {
			h := world.on(t)
			require.Equal(t, &instanceInfo{InstanceID: "done", Name: "P", Version: "1.0.0", CurrentExecID: 1,
				CreatedAt: msTime(clock0 + 401), UpdatedAt: msTime(clock0 + 411), Status: ptrTo("Completed"), Output: ptrTo(`"ok"`)}, info(h, "done"))
			require.Equal(t, ptrTo("root"), info(h, "child-b").Parent)
			multi := info(h, "multi")
			require.EqualValues(t, 2, multi.CurrentExecID)
			require.Equal(t, ptrTo("Running"), multi.Status, "the current execution's status, not execution 1's")
		})

		t.Run("get_instance_info reports a NULL version as 'unknown' and a missing current execution as NULL status", func(t *testing.T) {
			h := world.on(t)
			require.Equal(t, &instanceInfo{InstanceID: "nocurrent", Name: "N", Version: "unknown", CurrentExecID: 5,
				CreatedAt: msTime(clock0 + 800), UpdatedAt: msTime(clock0 + 800)}, info(h, "nocurrent"))
		})

		t.Run("get_instance_info of an unknown instance gives no row", func(t *testing.T) {
			h := world.on(t)
			require.Nil(t, info(h, "nobody"))
			require.Nil(t, info(h, "ghost"), "an executions row alone is not an instance")
		})

		type execInfo struct {
			ExecutionID int64
			Status      string
			Output      *string
			StartedAt   time.Time
			CompletedAt *time.Time
			EventCount  int64
		}
		execution := func(h *schemaDB, id string, exec int64) *execInfo {
			rows, err := h.pool.Query(h.ctx(), `SELECT execution_id, status, output, started_at, completed_at, event_count
			FROM duroxide.get_execution_info($1, $2)`, id, exec)
			require.NoError(h.t, err)
			defer rows.Close()
			var out []execInfo
			for rows.Next() {
				var e execInfo
				require.NoError(h.t, rows.Scan(&e.ExecutionID, &e.Status, &e.Output, &e.StartedAt, &e.CompletedAt, &e.EventCount))
				e.StartedAt = e.StartedAt.UTC()
				if e.CompletedAt != nil {
					e.CompletedAt = ptrTo(e.CompletedAt.UTC())
				}
				out = append(out, e)
			}
			require.NoError(h.t, rows.Err())
			require.LessOrEqual(h.t, len(out), 1)
			if len(out) == 0 {
				return nil
			}
			return &out[0]
		}

		t.Run("get_execution_info returns the execution and its number of history events", func(t *testing.T) {
			h := world.on(t)
			require.Equal(t, &execInfo{ExecutionID: 1, Status: "Completed", Output: ptrTo(`"ok"`), StartedAt: msTime(clock0 + 401),
				CompletedAt: ptrTo(msTime(clock0 + 411)), EventCount: 2}, execution(h, "done", 1))
			require.Equal(t, "Failed", execution(h, "multi", 1).Status)
			require.EqualValues(t, 1, execution(h, "multi", 2).EventCount)
			require.Equal(t, &execInfo{ExecutionID: 1, Status: "Running", StartedAt: msTime(clock0 + 901)}, execution(h, "ghost", 1),
				"an execution without history has event_count 0")
		})

		t.Run("get_execution_info of an unknown execution gives no row", func(t *testing.T) {
			h := world.on(t)
			require.Nil(t, execution(h, "done", 2))
			require.Nil(t, execution(h, "nobody", 1))
		})

		t.Run("get_system_metrics counts instances by the status of their current execution", func(t *testing.T) {
			h := world.on(t)
			var m [6]int64
			h.scan(`SELECT total_instances, total_executions, running_instances, completed_instances, failed_instances, total_events
			FROM duroxide.get_system_metrics()`, nil, &m[0], &m[1], &m[2], &m[3], &m[4], &m[5])
			// instances: all but ghost; executions: one each, multi two, ghost one, nocurrent none;
			// running: root, child-b, grandchild, multi; completed: child-a, done; failed: failed
			// (multi's failed execution 1 is not current; can and nocurrent are in no bucket);
			// events: one OrchestrationStarted per started instance, done's completion, multi's second start.
			require.Equal(t, [6]int64{9, 10, 4, 2, 1, 10}, m)
		})

		t.Run("list_instances lists every instance, newest first", func(t *testing.T) {
			h := world.on(t)
			require.Equal(t, []string{"nocurrent", "multi", "can", "failed", "done", "grandchild", "child-a", "child-b", "root"},
				h.texts(`SELECT instance_id FROM duroxide.list_instances()`))
		})

		t.Run("list_instances_by_status matches the current execution's status exactly, newest first", func(t *testing.T) {
			h := world.on(t)
			byStatus := func(s any) []string {
				return h.texts(`SELECT instance_id FROM duroxide.list_instances_by_status($1)`, s)
			}
			require.Equal(t, []string{"multi", "grandchild", "child-b", "root"}, byStatus("Running"))
			require.Equal(t, []string{"done", "child-a"}, byStatus("Completed"))
			require.Equal(t, []string{"failed"}, byStatus("Failed"))
			require.Empty(t, byStatus("running"))
			require.Empty(t, byStatus(nil))
		})

		t.Run("list_children lists direct children only, oldest first", func(t *testing.T) {
			h := world.on(t)
			children := func(id string) []string {
				return h.texts(`SELECT child_instance_id FROM duroxide.list_children($1)`, id)
			}
			require.Equal(t, []string{"child-b", "child-a"}, children("root"))
			require.Equal(t, []string{"grandchild"}, children("child-b"))
			require.Empty(t, children("grandchild"))
			require.Empty(t, children("nobody"))
		})

		t.Run("get_parent_id returns the parent, NULL for a root, and fails for an unknown instance", func(t *testing.T) {
			h := world.on(t)
			var parent *string
			h.scan(`SELECT duroxide.get_parent_id('grandchild')`, nil, &parent)
			require.Equal(t, ptrTo("child-b"), parent)
			h.scan(`SELECT duroxide.get_parent_id('root')`, nil, &parent)
			require.Nil(t, parent)

			requirePgError(t, h.try(`SELECT duroxide.get_parent_id('nobody')`), "P0001", "Instance not found: nobody")
			requirePgError(t, h.try(`SELECT duroxide.get_parent_id(NULL)`), "P0001", "Instance not found: <NULL>")
		})
	})
}

func TestEmptySchemaMetrics(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {
		h := fresh(t)
		var m [6]int64
		h.scan(`SELECT * FROM duroxide.get_system_metrics()`, nil, &m[0], &m[1], &m[2], &m[3], &m[4], &m[5])
		require.Equal(t, [6]int64{}, m, "one row of zeros")
		require.Empty(t, h.texts(`SELECT instance_id FROM duroxide.list_instances()`))
	})
}

func TestDeleteInstancesAtomic(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {

		// setup: a tree root (Completed) → kid (Running, leased) → grandkid
		// (Completed), and an unrelated Running instance "other". root and kid
		// have KV, queue messages and activities; one worker item has no
		// instance and one session exists.
		setup := func(t *testing.T) *schemaDB {
			h := fresh(t)
			h.startInstance("root", "R", "1.0.0", clock0, "kv_mutations", []any{kvSet("k", "v", clock0)})
			h.nextTurn("root", clock0+10, turn{
				History: historyDelta(t, eventJSON("root", 1, 2, "SubOrchestrationScheduled")),
				Worker:  rawArray(activityExecuteItem("root", 1, 3, nil, nil)),
				Meta:    ackMeta(t, "status", "Completed"),
			})
			h.startInstance("kid", "K", "1.0.0", clock0+20, "parent_instance_id", "root", "kv_mutations", []any{kvSet("k", "v", clock0)})
			h.startInstance("grandkid", "G", "1.0.0", clock0+30, "parent_instance_id", "kid")
			h.nextTurn("grandkid", clock0+40, turn{Meta: ackMeta(t, "status", "Completed")})
			h.startInstance("other", "O", "1.0.0", clock0+50)

			h.enqueueOrch("root", externalItem("root", "late"), clock0+60)
			h.enqueueOrch("kid", externalItem("kid", "x"), clock0+60)
			h.mustFetchOrch(clock0+60, "root") // root's lease and claimed message
			h.exec(`SELECT duroxide.enqueue_worker_work($1, $2, 'kid', 1, 4, NULL, NULL)`, activityExecuteItem("kid", 1, 4, nil, nil), clock0)
			h.enqueueWork(`{"n":"no-instance"}`, clock0, nil, nil)
			h.exec(`INSERT INTO duroxide.sessions VALUES ('s1', 'w1', $1, $1)`, clock0+100_000)
			return h
		}
		type counts struct{ Instances, Executions, Events, Queue int64 }
		deleteErr := func(h *schemaDB, ids any, force any) (counts, error) {
			var c counts
			err := h.pool.QueryRow(h.ctx(), `SELECT instances_deleted, executions_deleted, events_deleted, queue_messages_deleted
			FROM duroxide.delete_instances_atomic($1, $2)`, ids, force).Scan(&c.Instances, &c.Executions, &c.Events, &c.Queue)
			return c, err
		}
		del := func(h *schemaDB, ids any, force any) counts {
			c, err := deleteErr(h, ids, force)
			require.NoError(h.t, err)
			return c
		}
		remaining := func(h *schemaDB) []string {
			return h.texts(`SELECT instance_id FROM duroxide.instances ORDER BY instance_id`)
		}

		t.Run("an empty or NULL list deletes nothing", func(t *testing.T) {
			h := setup(t)
			require.Equal(t, counts{}, del(h, []string{}, false))
			require.Equal(t, counts{}, del(h, nil, false))
			require.Len(t, remaining(h), 4)
		})

		t.Run("a Running instance is refused without force", func(t *testing.T) {
			h := setup(t)
			_, err := deleteErr(h, []string{"other"}, false)
			requirePgError(t, err, "P0001", "Instance other is Running. Use force=true to delete.")
			require.Len(t, remaining(h), 4)
		})

		t.Run("force deletes a Running instance", func(t *testing.T) {
			h := setup(t)
			require.Equal(t, counts{Instances: 1, Executions: 1, Events: 1}, del(h, []string{"other"}, true))
			require.Equal(t, []string{"grandkid", "kid", "root"}, remaining(h))
		})

		t.Run("a NULL force skips the Running check (kept quirk)", func(t *testing.T) {
			h := setup(t)
			require.Equal(t, counts{Instances: 1, Executions: 1, Events: 1}, del(h, []string{"other"}, nil))
		})

		t.Run("the Running check looks at the current execution only", func(t *testing.T) {
			h := setup(t)
			h.exec(`INSERT INTO duroxide.executions (instance_id, execution_id, status, started_at) VALUES ('other', 2, 'Completed', now())`)
			h.exec(`UPDATE duroxide.instances SET current_execution_id = 2 WHERE instance_id = 'other'`)
			require.EqualValues(t, 1, h.count("executions", "instance_id = 'other' AND execution_id = 1 AND status = 'Running'"))
			require.Equal(t, counts{Instances: 1, Executions: 2, Events: 1}, del(h, []string{"other"}, false))
		})

		t.Run("deleting a parent without its children fails as an orphan, even when forced", func(t *testing.T) {
			h := setup(t)
			_, err := deleteErr(h, []string{"root"}, true)
			requirePgError(t, err, "P0001", "Orphan detected: instance kid has parent in delete list but is not included")
			_, err = deleteErr(h, []string{"root", "kid"}, true)
			requirePgError(t, err, "P0001", "Orphan detected: instance grandkid has parent in delete list but is not included")
			require.Len(t, remaining(h), 4)
		})

		t.Run("the Running check comes before the orphan check", func(t *testing.T) {
			h := setup(t)
			_, err := deleteErr(h, []string{"root", "kid", "grandkid"}, false)
			requirePgError(t, err, "P0001", "Instance kid is Running. Use force=true to delete.")
			_, err = deleteErr(h, []string{"root"}, false)
			requirePgError(t, err, "P0001", "Orphan detected: instance kid has parent in delete list but is not included")
		})

		t.Run("deleting a whole tree removes every row of the listed instances and counts them", func(t *testing.T) {
			h := setup(t)
			// events: root 2, kid 1, grandkid 1; executions 1 each; queue: root's
			// and kid's orchestrator messages (2) plus root's and kid's activities (2).
			require.Equal(t, counts{Instances: 3, Executions: 3, Events: 4, Queue: 4}, del(h, []string{"grandkid", "kid", "root"}, true))
			require.Equal(t, []string{"other"}, remaining(h))
			for _, table := range []string{"executions", "history", "orchestrator_queue", "worker_queue", "instance_locks", "kv_store"} {
				require.Zero(t, h.count(table, "instance_id = ANY($1)", []string{"root", "kid", "grandkid"}), table)
			}
			require.Equal(t, []string{`{"n":"no-instance"}`}, h.texts(`SELECT work_item FROM duroxide.worker_queue`),
				"a worker item without instance survives")
			require.EqualValues(t, 1, h.count("sessions", "true"), "sessions are not touched")
			require.EqualValues(t, 1, h.count("history", "instance_id = 'other'"))
		})

		t.Run("unknown ids are skipped and duplicates count once", func(t *testing.T) {
			h := setup(t)
			require.Equal(t, counts{Instances: 1, Executions: 1, Events: 1}, del(h, []string{"zzz", "other", "other"}, true))
		})

		t.Run("a NULL element defeats the orphan check (kept quirk)", func(t *testing.T) {
			h := setup(t)
			_, err := deleteErr(h, []*string{ptrTo("root")}, true)
			requirePgError(t, err, "P0001", "Orphan detected: instance kid has parent in delete list but is not included")

			c := del(h, []*string{ptrTo("root"), nil}, true)
			require.EqualValues(t, 1, c.Instances)
			require.Equal(t, []string{"grandkid", "kid", "other"}, remaining(h), "kid is left with a deleted parent")
		})

		t.Run("an instance without a current execution is not Running", func(t *testing.T) {
			h := setup(t)
			h.exec(`INSERT INTO duroxide.instances (instance_id, orchestration_name, current_execution_id, created_at, updated_at)
			VALUES ('bare', 'B', 3, now(), now())`)
			require.Equal(t, counts{Instances: 1}, del(h, []string{"bare"}, false))
		})
	})
}

func TestPruneExecutions(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {
		completed1 := clock0 + 1_000

		// setup (as in the spec's verified table): instance p with execution 1
		// (ContinuedAsNew, completed at completed1, 2 events), 2
		// (ContinuedAsNew, completed_at NULL, 1 event) and 3 (current, Running,
		// 1 event); key k1 was last written by execution 1.
		setup := func(t *testing.T) *schemaDB {
			h := fresh(t)
			h.exec(`INSERT INTO duroxide.instances (instance_id, orchestration_name, orchestration_version, current_execution_id, created_at, updated_at)
			VALUES ('p', 'P', '1.0.0', 3, now(), now())`)
			h.exec(`INSERT INTO duroxide.executions (instance_id, execution_id, status, started_at, completed_at) VALUES
			('p', 1, 'ContinuedAsNew', now(), $1), ('p', 2, 'ContinuedAsNew', now(), NULL), ('p', 3, 'Running', now(), NULL)`, msTime(completed1))
			h.exec(`INSERT INTO duroxide.history (instance_id, execution_id, event_id, event_type, event_data, created_at) VALUES
			('p', 1, 1, 'Event', '{}', now()), ('p', 1, 2, 'Event', '{}', now()), ('p', 2, 1, 'Event', '{}', now()), ('p', 3, 1, 'Event', '{}', now())`)
			h.exec(`INSERT INTO duroxide.kv_store (instance_id, key, value, execution_id, last_updated_at_ms) VALUES ('p', 'k1', 'v', 1, $1)`, clock0)
			return h
		}
		type result struct{ Instances, Executions, Events int64 }
		pruneErr := func(h *schemaDB, id any, keepLast, before any) (result, error) {
			var r result
			err := h.pool.QueryRow(h.ctx(), `SELECT instances_processed, executions_deleted, events_deleted
			FROM duroxide.prune_executions($1, $2, $3)`, id, keepLast, before).Scan(&r.Instances, &r.Executions, &r.Events)
			return r, err
		}
		prune := func(h *schemaDB, keepLast, before any) result {
			r, err := pruneErr(h, "p", keepLast, before)
			require.NoError(h.t, err)
			return r
		}
		executions := func(h *schemaDB) []string {
			return h.texts(`SELECT execution_id::text FROM duroxide.list_executions('p')`)
		}

		t.Run("without options every non-current, non-Running execution and its history is pruned; KV survives", func(t *testing.T) {
			h := setup(t)
			require.Equal(t, result{1, 2, 3}, prune(h, nil, nil))
			require.Equal(t, []string{"3"}, executions(h))
			require.EqualValues(t, 1, h.count("history", "true"))
			require.EqualValues(t, 1, h.count("kv_store", "key = 'k1'"), "KV is instance-scoped at 19")
		})

		t.Run("keep_last 0 protects nothing", func(t *testing.T) {
			h := setup(t)
			require.Equal(t, result{1, 2, 3}, prune(h, int32(0), nil))
		})

		t.Run("keep_last N keeps the N highest execution ids", func(t *testing.T) {
			h := setup(t)
			require.Equal(t, result{1, 1, 2}, prune(h, int32(2), nil))
			require.Equal(t, []string{"2", "3"}, executions(h))
		})

		t.Run("completed_before prunes executions completed strictly earlier, never a NULL completed_at", func(t *testing.T) {
			h := setup(t)
			require.Equal(t, result{1, 0, 0}, prune(h, nil, completed1))
			require.Equal(t, result{1, 1, 2}, prune(h, nil, completed1+1))
			require.Equal(t, []string{"2", "3"}, executions(h))
			require.Equal(t, result{1, 0, 0}, prune(h, nil, clock0+1_000_000))
		})

		t.Run("the current and any Running execution are never pruned", func(t *testing.T) {
			h := setup(t)
			h.exec(`UPDATE duroxide.instances SET current_execution_id = 1 WHERE instance_id = 'p'`)
			require.Equal(t, result{1, 1, 1}, prune(h, int32(1), nil))
			require.Equal(t, []string{"1", "3"}, executions(h))
		})

		t.Run("an instance with only its current execution gives (1, 0, 0)", func(t *testing.T) {
			h := setup(t)
			prune(h, nil, nil)
			require.Equal(t, result{1, 0, 0}, prune(h, nil, nil))
		})

		t.Run("a negative keep_last fails with PostgreSQL's LIMIT error (kept quirk)", func(t *testing.T) {
			h := setup(t)
			_, err := pruneErr(h, "p", int32(-1), nil)
			requirePgError(t, err, "2201W", "LIMIT must not be negative")
			require.Equal(t, []string{"1", "2", "3"}, executions(h))
		})

		t.Run("an unknown instance fails with 'Instance <id> not found'", func(t *testing.T) {
			h := setup(t)
			_, err := pruneErr(h, "nobody", nil, nil)
			requirePgError(t, err, "P0001", "Instance nobody not found")
			_, err = pruneErr(h, nil, nil, nil)
			requirePgError(t, err, "P0001", "Instance <NULL> not found")
		})
	})
}

func TestCleanupSchema(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {
		h := fresh(t)
		h.startInstance("order-1", "P", "1.0.0", clock0)

		h.exec(`SELECT duroxide.cleanup_schema()`)

		// Upstream's cleanup_schema knows nothing of what the pack's fixes
		// add to the catalog: their tables and functions stay (their
		// triggers go with the queue), harmless, and a later Up of the fix
		// that added them rebuilds them.
		tables, functions := []string{"goose_db_version"}, []string{"ack_orchestration(text,jsonb,bigint)", "enqueue_completion(text,text,bigint)",
			"enqueue_message(text,text,bigint,bigint)", "enqueue_orchestration_work(text,text,bigint)"}
		for _, a := range packfacts.AddedBy(h.version) {
			switch kind, name, _ := strings.Cut(a, " "); kind {
			case "table":
				tables = append(tables, name)
			case "function":
				functions = append(functions, name)
			}
		}
		slices.Sort(tables)
		require.Equal(t, tables,
			h.texts(`SELECT c.relname::text FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = 'duroxide' AND c.relkind IN ('r', 'p') ORDER BY 1`),
			"every duroxide table, _duroxide_migrations included, is dropped; goose's own table is not the pack's business")
		require.Empty(t, h.texts(`SELECT c.relname::text FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = 'duroxide' AND c.relkind = 'S' AND c.relname NOT LIKE 'goose%'`), "the queue sequences go with their tables")
		got := h.texts(`SELECT p.proname || '(' || replace(pg_catalog.oidvectortypes(p.proargtypes), ' ', '') || ')' FROM pg_catalog.pg_proc p
			JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'duroxide' ORDER BY 1`)
		for i := range got {
			if name, _, _ := strings.Cut(got[i], "("); slices.Contains(functions, name) {
				got[i] = name
			}
		}
		slices.Sort(functions)
		slices.Sort(got)
		require.Equal(t, functions, got, "only the four legacy functions of 0006 survive (kept quirk), and the pack's added ones")
	})
}
