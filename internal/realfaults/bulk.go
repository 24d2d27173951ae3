package realfaults

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// Bulk sizes the bulk operations of a run (RunBulk).
type Bulk struct {
	// Children is the number of sub-orchestrations one turn starts (one
	// ack queues a message for each).
	Children int
	// Instances is the number of completed instances (two executions
	// each) the client prunes and deletes in bulk.
	Instances int
	// QueueMessages is the size of the orchestrator queue (one message per
	// instance) a DBA deletes, then truncates.
	QueueMessages int
	// Deadline bounds the runtime's work on one operation.
	Deadline time.Duration
}

// BulkStep is one bulk operation on one side: whether it succeeded, its
// error, its time and what it did.
type BulkStep struct {
	Name  string
	Error string
	Ms    int64
	Note  string
}

// BulkSide is the steps of one side.
type BulkSide struct {
	Side  Side
	Steps []BulkStep
}

// BulkReport is a bulk run: every side's steps and what a runtime working
// meanwhile on a schema of its own saw.
type BulkReport struct {
	Sides []BulkSide
	// LiveRuns is how many times the concurrent runtime ran its load, and
	// LiveIncomplete how many of those runs left an instance not completed
	// with its output.
	LiveRuns, LiveIncomplete int
	// LiveOutOfMemory are the concurrent runtime's lines that carry "out
	// of shared memory".
	LiveOutOfMemory []string
}

// RunBulk runs the bulk operations on every side in turn, on src's
// database, while another runtime process works on schema live (which must
// hold a schema the runtime runs on) meanwhile, over and over, and reports
// whether each operation succeeded and whether the other runtime met "out
// of shared memory".
func RunBulk(ctx context.Context, p *upstream.Provider, src *dbconn.Source, sides []Side, live string, b Bulk) (*BulkReport, error) {
	if b.Children < 1 || b.Instances < 1 || b.QueueMessages < 1 || b.Deadline <= 0 {
		return nil, errors.New("realfaults: bulk sizes and deadline must be positive")
	}
	conn, err := src.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("realfaults: %w", err)
	}
	defer conn.Close(context.Background())

	rep := &BulkReport{}
	stop := make(chan struct{})
	var liveErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			res, err := p.RunRuntime(ctx, src, upstream.RuntimeRun{
				Schema: live, Prefix: fmt.Sprintf("live-%d-", n), Wait: 2 * time.Minute,
				Scenarios: []upstream.Scenario{{Name: "faultLoad", Key: "live", Count: 20, DelayMs: 100}},
			})
			if err != nil {
				liveErr = err
				return
			}
			rep.LiveRuns++
			if res.Results["live"].Status() != "Completed" {
				rep.LiveIncomplete++
			}
			for _, l := range res.Logs {
				if strings.Contains(l.Text(), "out of shared memory") {
					rep.LiveOutOfMemory = append(rep.LiveOutOfMemory, l.Text())
				}
			}
		}
	}()

	for _, s := range sides {
		side := BulkSide{Side: s}
		for _, step := range bulkSteps(p, src, conn, s, b) {
			started := time.Now()
			note, err := step.run(ctx)
			bs := BulkStep{Name: step.name, Ms: time.Since(started).Milliseconds(), Note: note}
			if err != nil {
				bs.Error = err.Error()
			}
			// A runtime stopped at its deadline can leave a statement
			// running in the server (PostgreSQL notices a vanished client
			// only when it next writes to it): it would load the steps
			// and the side that follow.
			left, err := settle(ctx, conn, bulkApp(s))
			if err != nil {
				return nil, fmt.Errorf("realfaults: after %q on %s: %w", step.name, s.Name, err)
			}
			if left > 0 {
				bs.Note = strings.TrimPrefix(fmt.Sprintf("%s; %d statements it left running terminated", bs.Note, left), "; ")
			}
			side.Steps = append(side.Steps, bs)
		}
		rep.Sides = append(rep.Sides, side)
	}
	close(stop)
	wg.Wait()
	if liveErr != nil {
		return nil, fmt.Errorf("realfaults: the concurrent runtime: %w", liveErr)
	}
	return rep, nil
}

// bulkApp is the application_name of side s's runtime processes in a
// bulk run.
func bulkApp(s Side) string { return "realfaults-bulk-" + s.Name }

// settle terminates the backends of application app still connected and
// waits until they are gone (at most a minute); it returns how many of
// them were running a statement.
func settle(ctx context.Context, conn *pgx.Conn, app string) (int, error) {
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'active'), count(pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, app).Scan(&n, nil); err != nil {
		return 0, fmt.Errorf("terminate %s's backends: %w", app, err)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		var left int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&left); err != nil {
			return 0, fmt.Errorf("count %s's backends: %w", app, err)
		}
		if left == 0 {
			return n, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d backends of %s still there a minute after they were terminated", left, app)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// bulkStep is one bulk operation: its name and what it does.
type bulkStep struct {
	name string
	run  func(ctx context.Context) (string, error)
}

// bulkSteps are the operations on side s, in order.
func bulkSteps(p *upstream.Provider, src *dbconn.Source, conn *pgx.Conn, s Side, b Bulk) []bulkStep {
	q := func(table string) string { return pgx.Identifier{s.Schema, table}.Sanitize() }
	exec := func(sql string) func(ctx context.Context) (string, error) {
		return func(ctx context.Context) (string, error) {
			tag, err := conn.Exec(ctx, sql)
			return tag.String(), err
		}
	}
	queue := fmt.Sprintf(`INSERT INTO %s (instance_id, work_item, visible_at, created_at)
		SELECT 'bulk-queue-' || g, '{"ExternalRaised":{"instance":"x","name":"go","data":"1"}}', now(), now()
		FROM generate_series(1, %d) g`, q("orchestrator_queue"), b.QueueMessages)
	return []bulkStep{
		{fmt.Sprintf("a turn starts %d sub-orchestrations (the runtime)", b.Children), func(ctx context.Context) (string, error) {
			res, err := p.RunRuntime(ctx, src, upstream.RuntimeRun{
				Schema: s.Schema, Prefix: "bulk-", Wait: b.Deadline, ApplicationName: bulkApp(s),
				Runtime:   upstream.RuntimeOptions{OrchestrationConcurrency: 8},
				Scenarios: []upstream.Scenario{{Name: "spawn", Key: "spawner", Count: b.Children}},
			})
			if err != nil {
				return "", err
			}
			out := res.Results["spawner"]
			want := fmt.Sprintf(`{"children":%d,"ok":%d}`, b.Children, b.Children)
			if out.Status() != "Completed" || out.Output() != want {
				return "", fmt.Errorf("the spawner ended %s with %q %s, want %s", out.Status(), out.Output(), out.Error(), want)
			}
			return fmt.Sprintf("%d turns", res.Turns), nil
		}},
		{fmt.Sprintf("%d completed instances of two executions (set up in SQL)", b.Instances), exec(fmt.Sprintf(`
			INSERT INTO %[1]s (instance_id, orchestration_name, orchestration_version, current_execution_id, created_at, updated_at)
			SELECT 'bulk-done-' || g, 'Bulk', '1.0.0', 2, now(), now() FROM generate_series(1, %[3]d) g;
			INSERT INTO %[2]s (instance_id, execution_id, status, output, started_at, completed_at)
			SELECT 'bulk-done-' || g, e, CASE e WHEN 1 THEN 'ContinuedAsNew' ELSE 'Completed' END, 'done', now() - interval '1 hour', now() - interval '1 minute'
			FROM generate_series(1, %[3]d) g, generate_series(1, 2) e`, q("instances"), q("executions"), b.Instances))},
		{"the client prunes their executions and deletes them (pruneExecutionsBulk, deleteInstanceBulk)", func(ctx context.Context) (string, error) {
			res, err := p.RunRuntime(ctx, src, upstream.RuntimeRun{
				Schema: s.Schema, Prefix: "bulk-client-", Wait: b.Deadline, ApplicationName: bulkApp(s),
				Scenarios: []upstream.Scenario{{Name: "clientBulk", Key: "client", Count: b.Instances + b.Children + 1}},
			})
			if err != nil {
				return "", err
			}
			out := res.Results["client"]
			if out.Status() != "Completed" {
				return "", fmt.Errorf("the client's bulk calls: %s %s", out.Status(), out.Error())
			}
			return fmt.Sprintf("pruned %v, deleted %v", out["pruned"], out["deleted"]), nil
		}},
		{fmt.Sprintf("one INSERT queues a message for each of %d instances", b.QueueMessages), exec(queue)},
		{"a DBA's DELETE of the queue", exec("DELETE FROM " + q("orchestrator_queue"))},
		{"the same INSERT again", exec(queue)},
		{"a DBA's TRUNCATE of the queue", exec("TRUNCATE " + q("orchestrator_queue"))},
	}
}

// Problems lists the steps of side name that failed.
func (r *BulkReport) Problems(name string) []string {
	var out []string
	for _, s := range r.Sides {
		if s.Side.Name != name {
			continue
		}
		for _, st := range s.Steps {
			if st.Error != "" {
				out = append(out, st.Name+": "+st.Error)
			}
		}
	}
	return out
}

// String is the report, one line per step.
func (r *BulkReport) String() string {
	var b strings.Builder
	for _, s := range r.Sides {
		for _, st := range s.Steps {
			res := "ok"
			if st.Error != "" {
				res = "FAILED: " + st.Error
			}
			fmt.Fprintf(&b, "%s: %s: %s in %d ms (%s)\n", s.Side.Name, st.Name, res, st.Ms, st.Note)
		}
	}
	fmt.Fprintf(&b, "concurrent runtime: %d runs, %d incomplete, %d lines with \"out of shared memory\"\n", r.LiveRuns, r.LiveIncomplete, len(r.LiveOutOfMemory))
	return b.String()
}
