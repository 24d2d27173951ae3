package migrations_test

// Every function finds its own tables whatever the caller's search_path
// (upstream's convention for every function). The other behaviour tests call
// with an empty search_path; these call with search_path = public holding
// look-alike decoy tables, and with temporary look-alikes.

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/packfacts"
)

// At 19 and at the pack's latest version (the fixes keep the property).
func TestFunctionsIgnoreTheCallersSearchPath(t *testing.T) {
	t.Parallel()
	for _, version := range []int64{19, migrations.Latest()} {
		t.Run(fmt.Sprintf("at version %d", version), func(t *testing.T) {
			testFunctionsIgnoreTheCallersSearchPath(t, version)
		})
	}
}

func testFunctionsIgnoreTheCallersSearchPath(t *testing.T, version int64) {
	t.Parallel()

	// decoyTables are the pack's tables a function body might name without
	// its schema; each gets a look-alike in the caller's path.
	decoyTables := []string{"orchestrator_queue", "instance_locks", "instances", "executions", "history", "kv_store", "worker_queue", "sessions"}
	// From upstream 20 on, a turn's KV mutation lands in kv_delta.
	kvTable := "kv_store"
	if packfacts.UpstreamAt(version) >= 20 {
		kvTable = "kv_delta"
		decoyTables = append(decoyTables, kvTable)
	}

	// run drives one whole turn through conn: enqueue, fetch and ack of an
	// orchestration item, then enqueue, fetch and ack of the activity it
	// scheduled.
	run := func(t *testing.T, conn *pgx.Conn) {
		ctx := context.Background()
		_, err := conn.Exec(ctx, `SELECT duroxide.enqueue_orchestrator_work($1, $2, $3, NULL, NULL, NULL)`,
			"order-1", startItem("order-1", "P", "1.0.0", 1), msTime(clock0))
		require.NoError(t, err)

		var instance, token string
		require.NoError(t, conn.QueryRow(ctx, `SELECT out_instance_id, out_lock_token FROM duroxide.fetch_orchestration_item($1, $2, NULL, NULL)`,
			clock0, lockMs).Scan(&instance, &token))
		require.Equal(t, "order-1", instance, "the decoy queue's older message and the decoy live lease are not seen")

		_, err = conn.Exec(ctx, `SELECT duroxide.ack_orchestration_item($1, $2, 1, $3, $4, $5, $6, '[]')`, token, clock0+1,
			historyDelta(t, startedEvent("order-1", 1, "P", "1.0.0")),
			rawArray(activityExecuteItem("order-1", 1, 2, "s1", nil)),
			rawArray(externalItem("order-1", "next")),
			ackMeta(t, "orchestration_name", "P", "orchestration_version", "1.0.0", "status", "Running",
				"kv_mutations", []any{kvSet("k", "v", clock0)}))
		require.NoError(t, err)

		var item, workToken string
		require.NoError(t, conn.QueryRow(ctx, `SELECT out_work_item, out_lock_token FROM duroxide.fetch_work_item($1, $2, 'w1', 60000, '{}', 'default_only')`,
			clock0+2, lockMs).Scan(&item, &workToken))
		require.Contains(t, item, `"ActivityExecute"`)
		_, err = conn.Exec(ctx, `SELECT duroxide.ack_worker($1, 'order-1', $2, $3)`, workToken, activityCompletedItem("order-1", 1, 2), clock0+3)
		require.NoError(t, err)
	}

	// requireRealTablesUsed checks the effects of run landed in duroxide.*.
	requireRealTablesUsed := func(t *testing.T, h *schemaDB) {
		require.EqualValues(t, 1, h.count("instances", "instance_id = 'order-1'"))
		require.EqualValues(t, 1, h.count("executions", "instance_id = 'order-1'"))
		require.EqualValues(t, 1, h.count("history", "instance_id = 'order-1'"))
		require.EqualValues(t, 1, h.count(kvTable, "instance_id = 'order-1'"))
		require.Zero(t, h.count("instance_locks", "true"))
		require.Zero(t, h.count("worker_queue", "true"))
		require.EqualValues(t, 1, h.count("sessions", "session_id = 's1' AND worker_id = 'w1'"))
		require.Len(t, h.orchRows(), 2, "the ExternalRaised of the ack and the ActivityCompleted of ack_worker")
	}

	t.Run("with search_path public holding decoy tables, the functions use and leave only the duroxide tables", func(t *testing.T) {
		t.Parallel()
		h := newAtVersion(t, version)
		conn := h.db.Conn(t, "public")
		ctx := context.Background()
		for _, table := range decoyTables {
			_, err := conn.Exec(ctx, `CREATE TABLE public.`+table+` (LIKE duroxide.`+table+` INCLUDING ALL)`)
			require.NoError(t, err, table)
		}
		_, err := conn.Exec(ctx, `INSERT INTO public.orchestrator_queue (id, instance_id, work_item, visible_at, created_at)
			VALUES (999, 'decoy', $1, $2, $2)`, startItem("decoy", "Decoy", "1.0.0", 1), msTime(clock0-1_000_000))
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `INSERT INTO public.instance_locks VALUES ('order-1', 'lock_decoy', $1, $2)`, clock0+1_000_000_000, clock0)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `INSERT INTO public.worker_queue (id, work_item, visible_at, created_at) VALUES (999, '{"decoy":true}', $1, $1)`, msTime(clock0-1_000_000))
		require.NoError(t, err)

		run(t, conn)

		requireRealTablesUsed(t, h)
		var decoy string
		require.NoError(t, conn.QueryRow(ctx, `SELECT format('%s|%s|%s|%s|%s', id, instance_id, visible_at = $1, lock_token IS NULL, attempt_count)
			FROM public.orchestrator_queue`, msTime(clock0-1_000_000)).Scan(&decoy))
		require.Equal(t, "999|decoy|t|t|0", decoy, "the decoy message is untouched and alone")
		require.NoError(t, conn.QueryRow(ctx, `SELECT format('%s|%s|%s|%s', instance_id, lock_token, locked_until, locked_at)
			FROM public.instance_locks`).Scan(&decoy))
		require.Equal(t, "order-1|lock_decoy|4101000000000|4100000000000", decoy, "the decoy lease is untouched and alone")
		require.NoError(t, conn.QueryRow(ctx, `SELECT format('%s|%s|%s', id, lock_token IS NULL, attempt_count) FROM public.worker_queue`).Scan(&decoy))
		require.Equal(t, "999|t|0", decoy)
		for _, table := range decoyTables {
			var n int64
			require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM public.`+table).Scan(&n))
			switch table {
			case "orchestrator_queue", "instance_locks", "worker_queue":
				require.EqualValues(t, 1, n, "public.%s holds its decoy row only", table)
			default:
				require.Zero(t, n, "public.%s stays empty", table)
			}
		}
	})

	t.Run("temporary look-alike tables do not shadow the duroxide tables", func(t *testing.T) {
		t.Parallel()
		h := newAtVersion(t, version)
		conn := h.db.Conn(t, "public")
		ctx := context.Background()
		for _, table := range decoyTables {
			_, err := conn.Exec(ctx, `CREATE TEMPORARY TABLE `+table+` (LIKE duroxide.`+table+` INCLUDING ALL)`)
			require.NoError(t, err, table)
		}
		_, err := conn.Exec(ctx, `INSERT INTO pg_temp.instance_locks VALUES ('order-1', 'lock_decoy', $1, $2)`, clock0+1_000_000_000, clock0)
		require.NoError(t, err)

		run(t, conn)

		requireRealTablesUsed(t, h)
		var n int64
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_temp.orchestrator_queue`).Scan(&n))
		require.Zero(t, n)
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_temp.instance_locks WHERE lock_token = 'lock_decoy'`).Scan(&n))
		require.EqualValues(t, 1, n)
	})
}
