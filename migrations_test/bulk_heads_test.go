package migrations_test

// Bulk transactions on the orchestrator queue at PostgreSQL's default lock
// capacity: the queue heads' upkeep must not take an entry of the server's
// shared lock table per instance (0027 and 0029 did: an advisory key per
// instance, held to commit), so a transaction that queues or deletes the
// messages of 100,000 instances succeeds on the pack as it does on
// upstream's schema.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// bulkInstances is the size of every bulk transaction.
const bulkInstances = 100_000

// defaultConfiguredPool starts a throwaway server of its own with
// PostgreSQL's default lock capacity (the shared test server has a larger
// one) and hands out databases on it.
func defaultConfiguredPool(t *testing.T) *testdb.Pool {
	t.Helper()
	opts := pgtest.OptionsFromEnv()
	if opts.Backend == pgtest.DSN || (opts.Backend == "" && opts.DSN != "") {
		t.Skip("needs a server started with PostgreSQL's default max_connections and max_locks_per_transaction; HARNESS_DSN names an existing server, whose settings this test cannot choose")
	}
	opts.Settings = pgtest.DefaultLockCapacity()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, opts)
	require.NoError(t, err, "start a default-configured server")
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	pool := testdb.NewPool(srv, "duroxide")
	var capacity [2]int
	conn, err := pgx.ConnectConfig(ctx, srv.ConnConfig("postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_setting('max_connections')::int, current_setting('max_locks_per_transaction')::int`).Scan(&capacity[0], &capacity[1]))
	require.Equal(t, [2]int{100, 64}, capacity, "the server runs with PostgreSQL's defaults")
	return pool
}

// bulkStep is one transaction of the bulk scenario.
type bulkStep struct {
	name string
	sql  string
}

// bulkSteps are the scenario's transactions, in order, on schema s: the
// messages of 100,000 running instances queued in one INSERT; all of them
// deleted with delete_instances_atomic; queued again and deleted with a
// DBA's DELETE; queued again and truncated.
func bulkSteps(s string) []bulkStep {
	queue := fmt.Sprintf(`INSERT INTO %[1]s.orchestrator_queue (instance_id, work_item, visible_at, created_at)
		SELECT 'bulk-' || g, '{"ExternalRaised":{"instance":"x","name":"go","data":"1"}}', now(), now()
		FROM generate_series(1, %[2]d) g`, s, bulkInstances)
	return []bulkStep{
		{"create instances", fmt.Sprintf(`INSERT INTO %[1]s.instances (instance_id, orchestration_name, orchestration_version, current_execution_id, created_at, updated_at)
			SELECT 'bulk-' || g, 'Bulk', '1.0.0', 1, now(), now() FROM generate_series(1, %[2]d) g;
			INSERT INTO %[1]s.executions (instance_id, execution_id, status, started_at)
			SELECT 'bulk-' || g, 1, 'Running', now() FROM generate_series(1, %[2]d) g`, s, bulkInstances)},
		{"one INSERT queues a message for each of 100,000 instances", queue},
		{"delete_instances_atomic deletes the 100,000 running instances", fmt.Sprintf(`SELECT * FROM %[1]s.delete_instances_atomic(
			ARRAY(SELECT 'bulk-' || g FROM generate_series(1, %[2]d) g), true)`, s, bulkInstances)},
		{"queue again", queue},
		{"a DBA's DELETE of the 100,000 messages", fmt.Sprintf(`DELETE FROM %s.orchestrator_queue`, s)},
		{"queue again", queue},
		{"a DBA's TRUNCATE of the queue", fmt.Sprintf(`TRUNCATE %s.orchestrator_queue`, s)},
		// Statistics of an empty queue, as after a TRUNCATE or on an idle
		// system: a plan made from them must not scan a table per row.
		{"statistics of the empty queue", fmt.Sprintf(`ANALYZE %[1]s.orchestrator_queue; ANALYZE %[1]s.instances`, s) + analyzeHeads(s)},
		{"queue again, planned on an empty queue", queue},
		{"a DBA's DELETE, planned on an empty queue", fmt.Sprintf(`DELETE FROM %s.orchestrator_queue`, s)},
	}
}

// analyzeHeads analyzes the queue heads of schema s where they exist.
func analyzeHeads(s string) string {
	return fmt.Sprintf(`; DO $a$ BEGIN IF to_regclass('%[1]s.orchestrator_queue_heads') IS NOT NULL THEN ANALYZE %[1]s.orchestrator_queue_heads; END IF; END $a$`, s)
}

// Each bulk transaction succeeds on upstream's schema (the port of 1..21
// and 23) and on the pack's latest, on a server at PostgreSQL's default
// lock capacity, and another session can take locks while one of them is
// open; the heads are exactly the oldest messages after each. 0029, the
// version before the heads' upkeep took row locks, fails the first one with
// "out of shared memory": the test can fail.
func TestBulkQueueTransactionsAtDefaultLockCapacity(t *testing.T) {
	t.Parallel()
	pool := defaultConfiguredPool(t)
	upstream, ok := migrations.PortOf(23)
	require.True(t, ok)
	// before is the version just before the latest fix of the heads'
	// helpers (0030's row locks): it still takes an advisory key per
	// instance. The first fix of them (0029's scoped keys) must precede it.
	first, ok := migrations.FixOf("orchestrator_queue_head_offer")
	require.True(t, ok)
	var before int64
	for _, m := range migrations.Fixes() {
		if slices.Contains(m.Fixes, "orchestrator_queue_head_offer") {
			before = m.Version - 1
		}
	}
	require.GreaterOrEqual(t, before, first.Version, "the pack has a fix of the heads' upkeep after %s", first.File)

	// Databases are built one at a time (each is a template build on the
	// small server); the scenarios then run side by side.
	sides := []struct {
		name    string
		version int64
		db      *testdb.Database
	}{
		{"upstream 1..21 and 23", upstream.Version, nil},
		{"pack latest", migrations.Latest(), nil},
		{"pack before the fix", before, nil},
	}
	for i := range sides {
		sides[i].db = pool.New(t, sides[i].version)
	}
	// Upstream's and the latest side by side; the version before the fix
	// after them, alone: while it fills the server's lock table, other
	// sessions fail too (that is the defect), the other sides included.
	var wg sync.WaitGroup
	errs := make([]error, len(sides))
	for i, side := range sides[:2] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = runBulk(t, side.db, false)
		}()
	}
	wg.Wait()
	errs[2] = runBulk(t, sides[2].db, true)
	for i, side := range sides {
		require.NoError(t, errs[i], "%s (goose %d)", side.name, side.version)
	}
}

// runBulk runs the bulk steps on db, each in its own transaction, and
// checks what each leaves. With expectFailure the first queueing step must
// fail with SQLSTATE 53200 (out of shared memory) and nothing more runs.
func runBulk(t *testing.T, db *testdb.Database, expectFailure bool) error {
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, db.Source.Config())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	other, err := pgx.ConnectConfig(ctx, db.Source.Config())
	if err != nil {
		return err
	}
	defer other.Close(ctx)
	s := pgx.Identifier{db.Schema}.Sanitize()
	hasHeads := false
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, db.Schema+".orchestrator_queue_heads").Scan(&hasHeads); err != nil {
		return err
	}
	// A step is a few seconds (each is logged with its time); a plan that
	// scans a table per row makes it hours.
	if _, err := conn.Exec(ctx, `SET statement_timeout = '120s'`); err != nil {
		return err
	}
	for i, step := range bulkSteps(s) {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		began := time.Now()
		_, err = tx.Exec(ctx, step.sql)
		t.Logf("%s: %s: %s", db.Name, step.name, time.Since(began).Round(time.Millisecond))
		if expectFailure && i == 1 {
			_ = tx.Rollback(ctx)
			var pgErr *pgconn.PgError
			if err == nil {
				return fmt.Errorf("%s: succeeded; want out of shared memory (the version before the fix takes a lock-table entry per instance)", step.name)
			}
			if !errors.As(err, &pgErr) || pgErr.Code != "53200" {
				return fmt.Errorf("%s: want SQLSTATE 53200 (out of shared memory), got %w", step.name, err)
			}
			return nil
		}
		if err != nil {
			_ = tx.Rollback(ctx)
			return fmt.Errorf("%s: %w", step.name, err)
		}
		// Meanwhile another session takes 200 locks of the shared table.
		if _, err := other.Exec(ctx, `SELECT count(pg_advisory_xact_lock(4242, g)) FROM generate_series(1, 200) g`); err != nil {
			_ = tx.Rollback(ctx)
			return fmt.Errorf("%s: another session, while it is open: %w", step.name, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("%s: commit: %w", step.name, err)
		}
		if !hasHeads {
			continue
		}
		var missing, stale int64
		// The check itself joins 100,000 rows: hash joins, whatever the
		// statistics say.
		check, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := check.Exec(ctx, `SET LOCAL enable_nestloop = off`); err != nil {
			_ = check.Rollback(ctx)
			return err
		}
		err = check.QueryRow(ctx, `
			WITH oldest AS (SELECT DISTINCT ON (instance_id) instance_id, visible_at, id FROM `+s+`.orchestrator_queue ORDER BY instance_id, visible_at, id)
			SELECT (SELECT count(*) FROM oldest o LEFT JOIN `+s+`.orchestrator_queue_heads h USING (instance_id)
			         WHERE h.instance_id IS NULL OR (h.visible_at, h.id) <> (o.visible_at, o.id)),
			       (SELECT count(*) FROM `+s+`.orchestrator_queue_heads h WHERE NOT EXISTS (
			         SELECT 1 FROM `+s+`.orchestrator_queue q WHERE q.instance_id = h.instance_id))`).Scan(&missing, &stale)
		_ = check.Rollback(ctx)
		if err != nil {
			return fmt.Errorf("%s: check the heads: %w", step.name, err)
		}
		if missing != 0 || stale != 0 {
			return fmt.Errorf("%s: %d instances whose head is missing or not their oldest message, %d heads without messages", step.name, missing, stale)
		}
	}
	return nil
}
