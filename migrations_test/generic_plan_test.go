package migrations_test

// No generic-plan cliff: PL/pgSQL plans a statement for its arguments on
// the first five calls of a session and may then switch to a generic plan
// cached for the session. A queue-reading function of the pack's latest
// reads, from its 6th call on, no more rows than twice what it read in
// calls 2-5, with 100,000 rows it does not need (scheduled for later,
// leased, or completed instances) next to the few it does. Measured in
// rows read (pg_stat_xact_user_tables), never in time.

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// planRows is the size of the rows a call does not need in every cell.
const planRows = 100_000

// planCell is one function with one kind of unneeded rows.
type planCell struct {
	name string
	// seed fills schema s (%[1]s) with planRows (%[2]d) unneeded rows and,
	// unless it is an empty poll, 30 the call can take.
	seed string
	// call is the function call, schema-qualified; $1 is the caller's
	// clock (epoch ms).
	call string
}

func planCells(s string, filter *orch.VersionRange) []planCell {
	worker := fmt.Sprintf(`SELECT count(*) FROM %s.fetch_work_item($1, 30000, NULL, NULL, ARRAY[]::text[], 'default_only')`, s)
	// With an owner the candidate query is another statement (it joins the
	// sessions), with a plan of its own.
	workerOwned := fmt.Sprintf(`SELECT count(*) FROM %s.fetch_work_item($1, 30000, 'worker-1', NULL, ARRAY[]::text[], 'default_only')`, s)
	orchestrator := fmt.Sprintf(`SELECT count(*) FROM %s.fetch_orchestration_item($1, 30000, %d, %d)`, s, filter.Min, filter.Max)
	workerReady := `INSERT INTO %[1]s.worker_queue (work_item, visible_at, created_at)
		SELECT '{"ActivityExecute":{}}', now() - interval '1 minute', now() FROM generate_series(1, 30);`
	orchReady := `INSERT INTO %[1]s.orchestrator_queue (instance_id, work_item, visible_at, created_at)
		SELECT 'ready-' || g, '{"ExternalRaised":{"instance":"x","name":"go","data":"1"}}', now() - interval '1 minute', now() FROM generate_series(1, 30) g;`
	workerFuture := `INSERT INTO %[1]s.worker_queue (work_item, visible_at, created_at)
		SELECT '{"ActivityExecute":{}}', now() + interval '1 day', now() FROM generate_series(1, %[2]d);`
	orchFuture := `INSERT INTO %[1]s.orchestrator_queue (instance_id, work_item, visible_at, created_at)
		SELECT 'later-' || g, '{"ExternalRaised":{"instance":"x","name":"go","data":"1"}}', now() + interval '1 day', now() FROM generate_series(1, %[2]d) g;`
	return []planCell{
		{"fetch_work_item, 100,000 items scheduled for later", workerFuture + workerReady, worker},
		{"fetch_work_item with an owner, 100,000 items scheduled for later", workerFuture + workerReady, workerOwned},
		{"fetch_work_item, 100,000 leased items", `INSERT INTO %[1]s.worker_queue (work_item, visible_at, created_at, lock_token, locked_until)
			SELECT '{"ActivityExecute":{}}', now() - interval '1 minute', now(), 'held-' || g,
			       floor(extract(epoch FROM now()) * 1000)::bigint + 3600000 FROM generate_series(1, %[2]d) g;` + workerReady, worker},
		{"fetch_work_item, empty poll behind 100,000 items scheduled for later", workerFuture, worker},
		{"fetch_orchestration_item, 100,000 instances' messages scheduled for later", orchFuture + orchReady, orchestrator},
		{"fetch_orchestration_item, 100,000 leased instances", `INSERT INTO %[1]s.instance_locks (instance_id, lock_token, locked_until, locked_at)
			SELECT 'held-' || g, 'lock-' || g, floor(extract(epoch FROM now()) * 1000)::bigint + 3600000,
			       floor(extract(epoch FROM now()) * 1000)::bigint FROM generate_series(1, %[2]d) g;
			INSERT INTO %[1]s.orchestrator_queue (instance_id, work_item, visible_at, created_at)
			SELECT 'held-' || g, '{"ExternalRaised":{"instance":"x","name":"go","data":"1"}}', now() - interval '2 minutes', now() FROM generate_series(1, %[2]d) g;` + orchReady, orchestrator},
		{"fetch_orchestration_item, 100,000 completed instances", `INSERT INTO %[1]s.instances (instance_id, orchestration_name, orchestration_version, current_execution_id, created_at, updated_at)
			SELECT 'done-' || g, 'Done', '1.0.0', 1, now(), now() FROM generate_series(1, %[2]d) g;
			INSERT INTO %[1]s.executions (instance_id, execution_id, status, started_at, completed_at, duroxide_version_major, duroxide_version_minor, duroxide_version_patch)
			SELECT 'done-' || g, 1, 'Completed', now(), now(), 0, 1, 5 FROM generate_series(1, %[2]d) g;` + orchReady, orchestrator},
		{"fetch_orchestration_item, empty poll behind 100,000 instances' messages scheduled for later", orchFuture, orchestrator},
	}
}

// rowsPerCall calls cell's function calls times on one session, each call
// in a transaction of its own that is rolled back (so every call finds the
// same rows), and returns the rows each read from the schema's tables.
func rowsPerCall(t *testing.T, db *testdb.Database, cell planCell, calls int) []int64 {
	t.Helper()
	ctx := context.Background()
	conn := db.Conn(t, "")
	out := make([]int64, 0, calls)
	for range calls {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		// The counters hold what the session has not yet reported to the
		// server's statistics, earlier calls included: read them on both
		// sides of the call.
		read := func() int64 {
			var n int64
			require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)), 0)::bigint
				FROM pg_stat_xact_user_tables WHERE schemaname = $1`, db.Schema).Scan(&n))
			return n
		}
		before := read()
		var n int64
		require.NoError(t, tx.QueryRow(ctx, cell.call, time.Now().UnixMilli()).Scan(&n), cell.call)
		out = append(out, read()-before)
		require.NoError(t, tx.Rollback(ctx))
	}
	return out
}

// cliff reports whether calls 6 on read more than twice what calls 2-5 did
// (plus a little slack for the rows every call reads).
func cliff(rows []int64) bool {
	return slices.Max(rows[5:]) > 2*slices.Max(rows[1:5])+100
}

func seedPlanCell(t *testing.T, db *testdb.Database, cell planCell) {
	t.Helper()
	ctx := context.Background()
	conn := db.Conn(t, "")
	s := pgx.Identifier{db.Schema}.Sanitize()
	_, err := conn.Exec(ctx, fmt.Sprintf(cell.seed, s, planRows))
	require.NoError(t, err, "seed %s", cell.name)
	_, err = conn.Exec(ctx, fmt.Sprintf(`ANALYZE %[1]s.worker_queue; ANALYZE %[1]s.orchestrator_queue; ANALYZE %[1]s.instance_locks; ANALYZE %[1]s.instances; ANALYZE %[1]s.executions`, s))
	require.NoError(t, err)
}

func TestQueueReadsHaveNoGenericPlanCliff(t *testing.T) {
	t.Parallel()
	latest := migrations.Latest()
	for _, cell := range planCells("%[1]s", orch.RuntimeFilter()) {
		t.Run(cell.name, func(t *testing.T) {
			t.Parallel()
			db := dbs.New(t, latest)
			c := cell
			c.call = fmt.Sprintf(cell.call, pgx.Identifier{db.Schema}.Sanitize())
			seedPlanCell(t, db, c)
			rows := rowsPerCall(t, db, c, 10)
			t.Logf("rows read per call at %04d: %v", latest, rows)
			require.False(t, cliff(rows), "from the 6th call on, %s reads more than twice what calls 2-5 read: %v", c.name, rows)
		})
	}
}

// Before the pack's latest fix of the worker fetch, its 6th call on reads
// every item scheduled for later: the test above can fail.
func TestWorkerFetchHadAGenericPlanCliffBeforeItsFix(t *testing.T) {
	t.Parallel()
	var fix int64
	for _, m := range migrations.Fixes() {
		if slices.Contains(m.Fixes, "fetch_work_item") {
			fix = m.Version
		}
	}
	db := dbs.New(t, fix-1)
	cell := planCells("%[1]s", orch.RuntimeFilter())[0]
	cell.call = fmt.Sprintf(cell.call, pgx.Identifier{db.Schema}.Sanitize())
	seedPlanCell(t, db, cell)
	rows := rowsPerCall(t, db, cell, 10)
	t.Logf("rows read per call at %04d: %v", fix-1, rows)
	// The custom plans of calls 1-5 depend on ANALYZE's sample; the
	// generic plan (a bound of unknown value: a third of the table, by
	// PostgreSQL's default estimate) always walks the primary key.
	require.GreaterOrEqual(t, slices.Min(rows[5:]), int64(planRows), "at %04d fetch_work_item's generic plan reads every item scheduled for later: %v", fix-1, rows)
}
