// Package planshape measures how much a queue-reading function of the
// schema reads per call, call after call on one session, next to rows it
// does not need (items scheduled for later, leased items or instances,
// completed instances). PL/pgSQL plans a statement for its arguments on its
// first five calls in a session and may then keep a generic plan for the
// session: a plan that cannot use the call's bound reads every unneeded row
// from the 6th call on (a cliff). The figures are rows read, from
// pg_stat_xact_user_tables, and, for reports only, each call's time.
package planshape

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/sim/orch"
)

// DefaultRows is how many unneeded rows a cell seeds.
const DefaultRows = 100_000

// Calls is how many calls Measure makes: five with custom plans, then five
// that may use the session's generic plan.
const Calls = 10

// Cell is one function with one kind of unneeded rows.
type Cell struct {
	// Name says the function and the rows.
	Name string
	// seed fills schema %[1]s with %[2]d unneeded rows and, unless the cell
	// is an empty poll, 30 the call can take.
	seed string
	// call is the function call, its schema %[1]s; $1 is the caller's clock
	// (epoch ms).
	call string
}

// Cells are the cells: the orchestration and worker fetches (the worker's
// with and without an owner, whose candidate queries differ), their empty
// polls, and the renewals, each alone with its kind of unneeded rows.
// filter is the version range the orchestration fetch is called with.
func Cells(filter *orch.VersionRange) []Cell {
	worker := `SELECT count(*) FROM %[1]s.fetch_work_item($1, 30000, NULL, NULL, ARRAY[]::text[], 'default_only')`
	workerOwned := `SELECT count(*) FROM %[1]s.fetch_work_item($1, 30000, 'worker-1', NULL, ARRAY[]::text[], 'default_only')`
	orchestrator := fmt.Sprintf(`SELECT count(*) FROM %%[1]s.fetch_orchestration_item($1, 30000, %d, %d)`, filter.Min, filter.Max)
	workerReady := `INSERT INTO %[1]s.worker_queue (work_item, visible_at, created_at)
		SELECT '{"ActivityExecute":{}}', now() - interval '1 minute', now() FROM generate_series(1, 30);`
	orchReady := `INSERT INTO %[1]s.orchestrator_queue (instance_id, work_item, visible_at, created_at)
		SELECT 'ready-' || g, '{"ExternalRaised":{"instance":"x","name":"go","data":"1"}}', now() - interval '1 minute', now() FROM generate_series(1, 30) g;`
	workerFuture := `INSERT INTO %[1]s.worker_queue (work_item, visible_at, created_at)
		SELECT '{"ActivityExecute":{}}', now() + interval '1 day', now() FROM generate_series(1, %[2]d);`
	orchFuture := `INSERT INTO %[1]s.orchestrator_queue (instance_id, work_item, visible_at, created_at)
		SELECT 'later-' || g, '{"ExternalRaised":{"instance":"x","name":"go","data":"1"}}', now() + interval '1 day', now() FROM generate_series(1, %[2]d) g;`
	workerLeased := `INSERT INTO %[1]s.worker_queue (work_item, visible_at, created_at, lock_token, locked_until)
		SELECT '{"ActivityExecute":{}}', now() - interval '1 minute', now(), 'held-' || g,
		       floor(extract(epoch FROM now()) * 1000)::bigint + 3600000 FROM generate_series(1, %[2]d) g;`
	orchLeased := `INSERT INTO %[1]s.instance_locks (instance_id, lock_token, locked_until, locked_at)
		SELECT 'held-' || g, 'lock-' || g, floor(extract(epoch FROM now()) * 1000)::bigint + 3600000,
		       floor(extract(epoch FROM now()) * 1000)::bigint FROM generate_series(1, %[2]d) g;
		INSERT INTO %[1]s.orchestrator_queue (instance_id, work_item, visible_at, created_at, lock_token, locked_until)
		SELECT 'held-' || g, '{"ExternalRaised":{"instance":"x","name":"go","data":"1"}}', now() - interval '2 minutes', now(),
		       'lock-' || g, floor(extract(epoch FROM now()) * 1000)::bigint + 3600000 FROM generate_series(1, %[2]d) g;`
	completed := `INSERT INTO %[1]s.instances (instance_id, orchestration_name, orchestration_version, current_execution_id, created_at, updated_at)
		SELECT 'done-' || g, 'Done', '1.0.0', 1, now(), now() FROM generate_series(1, %[2]d) g;
		INSERT INTO %[1]s.executions (instance_id, execution_id, status, started_at, completed_at, duroxide_version_major, duroxide_version_minor, duroxide_version_patch)
		SELECT 'done-' || g, 1, 'Completed', now(), now(), 0, 1, 5 FROM generate_series(1, %[2]d) g;`
	return []Cell{
		{"fetch_work_item, items scheduled for later", workerFuture + workerReady, worker},
		{"fetch_work_item with an owner, items scheduled for later", workerFuture + workerReady, workerOwned},
		{"fetch_work_item, leased items", workerLeased + workerReady, worker},
		{"fetch_work_item, empty poll behind items scheduled for later", workerFuture, worker},
		{"renew_work_item_lock, leased items", workerLeased,
			`SELECT count(*) FROM (SELECT %[1]s.renew_work_item_lock('held-1', $1, 30)) r`},
		{"fetch_orchestration_item, instances' messages scheduled for later", orchFuture + orchReady, orchestrator},
		{"fetch_orchestration_item, leased instances", orchLeased + orchReady, orchestrator},
		{"fetch_orchestration_item, completed instances", completed + orchReady, orchestrator},
		{"fetch_orchestration_item, empty poll behind instances' messages scheduled for later", orchFuture, orchestrator},
		{"renew_orchestration_item_lock, leased instances", orchLeased,
			`SELECT count(*) FROM (SELECT %[1]s.renew_orchestration_item_lock('lock-1', $1, 30)) r`},
	}
}

// Seed fills schema with rows unneeded rows of the cell's kind (and the
// few the call can take), then analyzes the tables.
func (c Cell) Seed(ctx context.Context, conn *pgx.Conn, schema string, rows int) error {
	s := pgx.Identifier{schema}.Sanitize()
	if _, err := conn.Exec(ctx, fmt.Sprintf(c.seed, s, rows)); err != nil {
		return fmt.Errorf("planshape: seed %s: %w", c.Name, err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf(`ANALYZE %[1]s.worker_queue; ANALYZE %[1]s.orchestrator_queue; ANALYZE %[1]s.instance_locks; ANALYZE %[1]s.instances; ANALYZE %[1]s.executions`, s)); err != nil {
		return fmt.Errorf("planshape: analyze %s: %w", schema, err)
	}
	return nil
}

// Call is what one call read and took.
type Call struct {
	Rows   int64   `json:"rows"`
	Micros float64 `json:"us"`
}

// Measure calls the cell's function Calls times on conn (one session), each
// call in a transaction of its own that is rolled back, so that every call
// finds the same rows, and returns what each read from schema's tables.
func (c Cell) Measure(ctx context.Context, conn *pgx.Conn, schema string) ([]Call, error) {
	call := fmt.Sprintf(c.call, pgx.Identifier{schema}.Sanitize())
	out := make([]Call, 0, Calls)
	for range Calls {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return nil, err
		}
		// The counters hold what the session has not yet reported to the
		// server's statistics, earlier calls included: read them on both
		// sides of the call.
		read := func() (int64, error) {
			var n int64
			err := tx.QueryRow(ctx, `SELECT coalesce(sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)), 0)::bigint
				FROM pg_stat_xact_user_tables WHERE schemaname = $1`, schema).Scan(&n)
			return n, err
		}
		before, err := read()
		if err != nil {
			_ = tx.Rollback(ctx)
			return nil, fmt.Errorf("planshape: %s: %w", c.Name, err)
		}
		var n int64
		start := time.Now()
		if err := tx.QueryRow(ctx, call, time.Now().UnixMilli()).Scan(&n); err != nil {
			_ = tx.Rollback(ctx)
			return nil, fmt.Errorf("planshape: %s: %s: %w", c.Name, call, err)
		}
		took := time.Since(start)
		after, err := read()
		if err != nil {
			_ = tx.Rollback(ctx)
			return nil, fmt.Errorf("planshape: %s: %w", c.Name, err)
		}
		out = append(out, Call{Rows: after - before, Micros: float64(took.Microseconds())})
		if err := tx.Rollback(ctx); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Early and Steady are the most a call read in calls 2-5 (custom plans,
// the first call's planning aside) and in calls 6 on.
func Early(calls []Call) int64  { return maxRows(calls[1:5]) }
func Steady(calls []Call) int64 { return maxRows(calls[5:]) }

// Cliff reports whether calls 6 on read more than twice what calls 2-5 did
// (plus a little slack for the rows every call reads).
func Cliff(calls []Call) bool { return Steady(calls) > 2*Early(calls)+100 }

// Rows are the rows each call read.
func Rows(calls []Call) []int64 {
	out := make([]int64, len(calls))
	for i, c := range calls {
		out[i] = c.Rows
	}
	return out
}

func maxRows(calls []Call) int64 {
	return slices.Max(Rows(calls))
}
