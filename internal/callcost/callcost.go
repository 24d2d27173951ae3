// Package callcost measures where a function call's server time goes, on
// the uncontended path: the time PostgreSQL spends inside each function a
// call runs (pg_stat_user_functions with track_functions = 'all': the
// called function's total time, and every function's own time, triggers
// and helpers included), on steady sessions, and the client's time of the
// first call on a new session (which compiles the functions and loads
// their tables' catalog entries).
//
// The sides are schema states: upstream's as its runner makes it, the
// pack's latest, and variants of the latest that each take one thing away
// (the SET search_path clause of every function; the queue heads' upkeep),
// so that the cost of each is the difference, measured in one run.
package callcost

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/dbconn"
)

// Warm is how many calls run on a new session before the measured ones:
// the first compiles the functions, and PL/pgSQL plans a statement for the
// call's values on the first five executions.
const Warm = 5

// Cell is one function call on the uncontended path.
type Cell struct {
	// Name says the call.
	Name string
	// Function is the function the call runs (its total time is the
	// call's).
	Function string
	// seed fills schema %[1]s before the calls; %[2]d is how many calls
	// will run.
	seed string
	// call is one call: schema %[1]s, the call's number %[2]d (from 1),
	// the caller's clock %[3]d (epoch ms).
	call string
}

// Cells are the calls of an orchestration's turn that run alone: queueing
// a message (for a new instance, and behind an instance's head), the
// worker's ack with a completion, the two fetches' empty polls, and two
// reads.
func Cells(minVersion, maxVersion int64) []Cell {
	return []Cell{
		{Name: "enqueue_orchestrator_work, a new instance", Function: "enqueue_orchestrator_work",
			call: `SELECT %[1]s.enqueue_orchestrator_work('new-%[2]d', '{"ExternalRaised":{"instance":"x","name":"go","data":"1"}}', now(), NULL, NULL, NULL)`},
		{Name: "enqueue_orchestrator_work, behind the instance's head", Function: "enqueue_orchestrator_work",
			seed: `INSERT INTO %[1]s.orchestrator_queue (instance_id, work_item, visible_at, created_at)
				VALUES ('fan-in', '{"ExternalRaised":{"instance":"x","name":"go","data":"1"}}', now() - interval '1 minute', now())`,
			call: `SELECT %[1]s.enqueue_orchestrator_work('fan-in', '{"ExternalRaised":{"instance":"x","name":"go","data":"1"}}', now(), NULL, NULL, NULL)`},
		{Name: "ack_worker, with a completion", Function: "ack_worker",
			seed: `INSERT INTO %[1]s.worker_queue (work_item, visible_at, created_at, lock_token, locked_until)
				SELECT '{"ActivityExecute":{}}', now() - interval '1 minute', now(), 'held-' || g,
				       floor(extract(epoch FROM now()) * 1000)::bigint + 3600000 FROM generate_series(1, %[2]d) g`,
			call: `SELECT %[1]s.ack_worker('held-%[2]d', 'done-%[2]d', '{"ActivityCompleted":{"execution_id":1,"id":1,"result":"1"}}', %[3]d)`},
		{Name: "fetch_work_item, empty queue", Function: "fetch_work_item",
			call: `SELECT count(*) FROM %[1]s.fetch_work_item(%[3]d, 30000, NULL, NULL, ARRAY[]::text[], 'default_only')`},
		{Name: "fetch_orchestration_item, empty queue", Function: "fetch_orchestration_item",
			call: fmt.Sprintf(`SELECT count(*) FROM %%[1]s.fetch_orchestration_item(%%[3]d, 30000, %d, %d)`, minVersion, maxVersion)},
		{Name: "fetch_history, no such instance", Function: "fetch_history",
			call: `SELECT count(*) FROM %[1]s.fetch_history('none')`},
		{Name: "get_custom_status, no such instance", Function: "get_custom_status",
			call: `SELECT count(*) FROM %[1]s.get_custom_status('none', 0)`},
	}
}

// Side is a schema state the cells run on.
type Side struct {
	// Name labels the side in reports.
	Name string
	// Make brings the (new) schema to the side's state.
	Make func(ctx context.Context, src *dbconn.Source, schema string) error
	// Alter, when not nil, changes the made schema (a variant).
	Alter func(ctx context.Context, conn *pgx.Conn, schema string) error
	// SearchPath sets the session's search_path to the schema: a function
	// without a SET clause of its own resolves the schema's tables so.
	SearchPath bool
}

// WithoutSetSearchPath removes the SET search_path clause of every function
// of schema. The functions then resolve their tables by the caller's
// search_path, so this variant's sessions set it (Side.SearchPath); it
// costs what functions whose bodies name the schema, as upstream's do,
// would.
func WithoutSetSearchPath(ctx context.Context, conn *pgx.Conn, schema string) error {
	rows, err := conn.Query(ctx, `
		SELECT p.oid::regprocedure::text
		FROM pg_proc p
		JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1
		  AND EXISTS (SELECT 1 FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%')`, schema)
	if err != nil {
		return fmt.Errorf("callcost: list %s's functions: %w", schema, err)
	}
	functions, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("callcost: list %s's functions: %w", schema, err)
	}
	for _, f := range functions {
		if _, err := conn.Exec(ctx, "ALTER FUNCTION "+f+" RESET search_path"); err != nil {
			return fmt.Errorf("callcost: %s: %w", f, err)
		}
	}
	return nil
}

// WithoutHeadUpkeep disables the user triggers of schema's orchestrator
// queue (the queue heads' upkeep). Not a state to run: the heads go stale.
// It shows what the upkeep costs a message.
func WithoutHeadUpkeep(ctx context.Context, conn *pgx.Conn, schema string) error {
	if _, err := conn.Exec(ctx, "ALTER TABLE "+pgx.Identifier{schema, "orchestrator_queue"}.Sanitize()+" DISABLE TRIGGER USER"); err != nil {
		return fmt.Errorf("callcost: disable %s's queue triggers: %w", schema, err)
	}
	return nil
}

// Part is one function's own time in a call.
type Part struct {
	Function string  `json:"function"`
	SelfUs   float64 `json:"self_us"`
}

// Sample is one cell on one side in one round.
type Sample struct {
	// Us is the called function's time per call (µs, server).
	Us float64 `json:"us"`
	// Parts is each function's own time per call (µs, server).
	Parts []Part `json:"parts"`
	// FirstMs is the first call on a new session (ms, client's clock).
	FirstMs float64 `json:"first_ms"`
}

type funcTimes map[string][2]float64 // function -> (total ms, self ms)

// measure runs calls calls of cell on a new session of src, schema made and
// seeded.
func measure(ctx context.Context, src *dbconn.Source, side Side, cell Cell, schema string, calls int) (Sample, error) {
	var s Sample
	conn, err := src.Connect(ctx)
	if err != nil {
		return s, fmt.Errorf("callcost: %w", err)
	}
	defer conn.Close(context.Background())
	set := "SET track_functions = 'all'; SET stats_fetch_consistency = 'none'"
	if side.SearchPath {
		set += "; SET search_path = " + pgx.Identifier{schema}.Sanitize()
	}
	if _, err := conn.Exec(ctx, set); err != nil {
		return s, fmt.Errorf("callcost: session settings: %w", err)
	}
	quoted := pgx.Identifier{schema}.Sanitize()
	n := 0
	call := func() error {
		n++
		if _, err := conn.Exec(ctx, fmt.Sprintf(cell.call, quoted, n, time.Now().UnixMilli())); err != nil {
			return fmt.Errorf("callcost: %s on %s, call %d: %w", cell.Name, side.Name, n, err)
		}
		return nil
	}
	start := time.Now()
	if err := call(); err != nil {
		return s, err
	}
	s.FirstMs = float64(time.Since(start).Microseconds()) / 1000
	for n < Warm {
		if err := call(); err != nil {
			return s, err
		}
	}
	before, err := snapshot(ctx, conn, schema)
	if err != nil {
		return s, err
	}
	for i := 0; i < calls; i++ {
		if err := call(); err != nil {
			return s, err
		}
	}
	after, err := snapshot(ctx, conn, schema)
	if err != nil {
		return s, err
	}
	per := func(ms float64) float64 { return ms * 1000 / float64(calls) }
	s.Us = per(after[cell.Function][0] - before[cell.Function][0])
	for f, t := range after {
		if self := t[1] - before[f][1]; self > 0 {
			s.Parts = append(s.Parts, Part{Function: f, SelfUs: per(self)})
		}
	}
	return s, nil
}

// snapshot flushes this session's function statistics and reads schema's.
func snapshot(ctx context.Context, conn *pgx.Conn, schema string) (funcTimes, error) {
	// The flush happens when the session goes idle after this statement.
	if _, err := conn.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
		return nil, fmt.Errorf("callcost: flush statistics (PostgreSQL 15 or later): %w", err)
	}
	rows, err := conn.Query(ctx, `SELECT funcname::text, total_time, self_time FROM pg_stat_user_functions WHERE schemaname = $1`, schema)
	if err != nil {
		return nil, fmt.Errorf("callcost: read function statistics: %w", err)
	}
	defer rows.Close()
	out := funcTimes{}
	for rows.Next() {
		var f string
		var total, self float64
		if err := rows.Scan(&f, &total, &self); err != nil {
			return nil, err
		}
		t := out[f] // overloads add up
		out[f] = [2]float64{t[0] + total, t[1] + self}
	}
	return out, rows.Err()
}
