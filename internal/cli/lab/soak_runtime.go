package lab

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/realfaults"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// runtimeSoak are the settings of `soak --runtime`.
type runtimeSoak struct {
	dsn            string
	duration       time.Duration
	orchestrations int
	each           bool
	doc            string
	seed           uint64
}

// runtimeScenario is one fault scenario of the real runtime, as `soak
// --runtime` runs it.
type runtimeScenario struct {
	name string
	// fault is the scenario's fault on lab, for the round's database src
	// (nil: none).
	fault func(lab *runtimeLab, src *dbconn.Source) realfaults.Fault
	// clocks are the runtime processes' clock offsets.
	clocks []time.Duration
	// bouncer runs the runtime through PgBouncer (session mode).
	bouncer bool
	// needs says what the scenario needs that lab may lack ("" when lab
	// has it).
	needs func(lab *runtimeLab) string
}

// runtimeLab is what the scenarios run on: the throwaway server, a
// PgBouncer in front of it (nil without pgbouncer), the real provider.
type runtimeLab struct {
	srv      *pgtest.Server
	bouncer  *pgtest.PgBouncer
	provider *upstream.Provider
}

func needsLocal(lab *runtimeLab) string {
	if lab.srv.Backend() != pgtest.Local {
		return "restarts the server: only the local backend's server can be restarted"
	}
	return ""
}

func needsBouncer(lab *runtimeLab) string {
	if lab.bouncer == nil {
		return "needs pgbouncer (Debian: apt-get install pgbouncer)"
	}
	return ""
}

// runtimeScenarios are the scenarios of docs/RELIABILITY.md in their long
// form: the faults mixed by a soak (items killed, restarts, PgBouncer),
// then the clock cells, which `--each` adds.
func runtimeScenarios() (mixed, clocks []runtimeScenario) {
	mixed = []runtimeScenario{
		{name: "backends terminated", fault: func(_ *runtimeLab, src *dbconn.Source) realfaults.Fault {
			return realfaults.KillBackends{Admin: src, MinGap: 200 * time.Millisecond, MaxGap: 500 * time.Millisecond, Share: 0.5}
		}},
		{name: "server restarted twice", needs: needsLocal, fault: func(lab *runtimeLab, _ *dbconn.Source) realfaults.Fault {
			return realfaults.RestartServer{Server: lab.srv, Times: 2, First: 500 * time.Millisecond, Gap: 2 * time.Second}
		}},
		{name: "PgBouncer (session mode) restarted twice", bouncer: true, needs: needsBouncer, fault: func(lab *runtimeLab, _ *dbconn.Source) realfaults.Fault {
			return realfaults.RestartServer{Server: lab.bouncer, What: "PgBouncer", Times: 2, First: 500 * time.Millisecond, Gap: 2 * time.Second}
		}},
	}
	for _, s := range []time.Duration{2 * time.Second, 30 * time.Second, 120 * time.Second} {
		for _, c := range [][]time.Duration{{-s, s}, {-s}, {s}} {
			clocks = append(clocks, runtimeScenario{name: fmt.Sprintf("runtime clocks %v", c), clocks: c})
		}
	}
	return mixed, clocks
}

// runRuntimeSoak runs the real runtime's fault scenarios: mixed rounds for
// the duration, or every scenario once with each.
func runRuntimeSoak(ctx context.Context, env *cli.Env, o runtimeSoak) error {
	provider, err := upstream.Find()
	if err != nil {
		return cli.Usagef("soak --runtime runs the real duroxide runtime: %v (make upstream installs it)", err)
	}
	srv, err := obtainServer(ctx, o.dsn)
	if err != nil {
		return err
	}
	defer srv.Close(context.Background())
	lab := &runtimeLab{srv: srv, provider: provider}
	bouncer, err := pgtest.StartPgBouncer(ctx, srv, "session")
	switch {
	case errors.Is(err, pgtest.ErrUnavailable):
		fmt.Fprintf(env.Stderr, "harness-lab: no PgBouncer scenario: %v\n", err)
	case err != nil:
		return err
	default:
		lab.bouncer = bouncer
		defer bouncer.Close()
	}

	mixed, clocks := runtimeScenarios()
	var plan []runtimeScenario
	if o.each {
		plan = append(mixed, clocks...)
	}
	rng := rand.New(rand.NewPCG(o.seed, o.seed^0x9e3779b97f4a7c15))
	deadline := time.Now().Add(o.duration)
	var rows []realfaults.Row
	var problems []string
	for n := 1; ; n++ {
		var sc runtimeScenario
		switch {
		case o.each && n > len(plan):
		case o.each:
			sc = plan[n-1]
		case time.Now().Before(deadline) || n == 1:
			sc = mixed[rng.IntN(len(mixed))]
		}
		if sc.name == "" {
			break
		}
		if sc.needs != nil {
			if why := sc.needs(lab); why != "" {
				fmt.Fprintf(env.Stderr, "round %d: %s left out: %s\n", n, sc.name, why)
				if !o.each && !anyRunnable(mixed, lab) {
					return cli.Usagef("soak --runtime: no scenario can run here")
				}
				continue
			}
		}
		rep, err := runRuntimeRound(ctx, lab, sc, o.orchestrations)
		if err != nil {
			return fmt.Errorf("round %d (%s): %w", n, sc.name, err)
		}
		rows = append(rows, realfaults.Row{Scenario: sc.name, Report: rep})
		fmt.Fprintf(env.Stderr, "round %d: %s", n, rep.String())
		for _, s := range rep.Sides {
			if s.Side.Name != "pack" {
				continue
			}
			for _, p := range s.Problems() {
				problems = append(problems, fmt.Sprintf("round %d (%s): %s", n, sc.name, p))
			}
		}
		if sc.fault != nil && rep.Injected == 0 {
			problems = append(problems, fmt.Sprintf("round %d (%s): no fault was injected while the load ran", n, sc.name))
		}
	}
	table := realfaults.Table(rows)
	fmt.Fprintf(env.Stdout, "%s\nWARN/ERROR lines by kind:\n%s", table, realfaults.LogKinds(rows))
	bulkText := ""
	if o.each {
		bulk, note, err := runBulkAtDefaults(ctx, env, lab.provider, o.dsn)
		switch {
		case err != nil:
			return fmt.Errorf("bulk operations: %w", err)
		case bulk == nil:
			bulkText = "Bulk operations: not run: " + note + "\n"
		default:
			bulkText = "Bulk operations on a server at PostgreSQL's default `max_connections` (100) and `max_locks_per_transaction` (64):\n\n" + realfaults.BulkTable(bulk)
			for _, p := range bulk.Problems("pack") {
				problems = append(problems, "bulk: "+p)
			}
			for _, l := range bulk.LiveOutOfMemory {
				problems = append(problems, "bulk: the concurrent runtime: "+l)
			}
		}
		fmt.Fprintf(env.Stdout, "\n%s", bulkText)
	}
	if o.doc != "" {
		body := fmt.Sprintf("%d orchestrations per side and scenario; %s; `harness-lab soak --runtime --each`.\n\n%s\nThe runtime's WARN and ERROR lines over every scenario, by kind:\n\n%s\n%s",
			o.orchestrations, time.Now().UTC().Format("2006-01-02"), table, realfaults.LogKinds(rows), bulkText)
		if err := realfaults.ReplaceSection(o.doc, body); err != nil {
			return err
		}
	}
	for _, p := range problems {
		fmt.Fprintf(env.Stdout, "problem: %s\n", p)
	}
	if len(problems) > 0 {
		return cli.Failure{Msg: fmt.Sprintf("soak --runtime: %d problem(s) on the pack's side", len(problems))}
	}
	fmt.Fprintln(env.Stdout, "\nverdict: on the pack's side nothing was lost, doubled or wrong, and nothing failed outside the runtime's own Failure class")
	return nil
}

func anyRunnable(list []runtimeScenario, lab *runtimeLab) bool {
	for _, sc := range list {
		if sc.needs == nil || sc.needs(lab) == "" {
			return true
		}
	}
	return false
}

// runRuntimeRound runs one scenario on a database of its own, dropped
// afterwards.
func runRuntimeRound(ctx context.Context, lab *runtimeLab, sc runtimeScenario, orchestrations int) (*realfaults.Report, error) {
	name, err := lab.srv.CreateDatabase(ctx, "harness_soak_runtime_", "")
	if err != nil {
		return nil, err
	}
	defer lab.srv.DropDatabase(context.Background(), name)
	src, err := lab.srv.Source(name)
	if err != nil {
		return nil, err
	}
	sides, err := realfaults.MakeSides(ctx, lab.provider, src, "soak_")
	if err != nil {
		return nil, err
	}
	target := realfaults.Target{DB: src}
	if sc.bouncer {
		target.Via = lab.bouncer.RuntimeDSN(name)
	}
	var fault realfaults.Fault
	if sc.fault != nil {
		fault = sc.fault(lab, src)
	}
	load := realfaults.Load{
		Orchestrations: orchestrations, TimerMs: 1000, FaultFor: time.Minute, Deadline: 5 * time.Minute,
		Runtime: upstream.RuntimeOptions{OrchestrationConcurrency: 4, WorkerConcurrency: 8},
		Clocks:  sc.clocks,
	}
	return realfaults.Run(ctx, lab.provider, target, sides, fault, load)
}

// runBulkAtDefaults runs the bulk operations in their long form on a
// server of their own started at PostgreSQL's default lock capacity; with
// an existing server (--dsn), whose settings it cannot choose, it runs
// nothing and says why.
func runBulkAtDefaults(ctx context.Context, env *cli.Env, p *upstream.Provider, dsn string) (*realfaults.BulkReport, string, error) {
	opts := pgtest.OptionsFromEnv()
	if dsn != "" || opts.Backend == pgtest.DSN || (opts.Backend == "" && opts.DSN != "") {
		return nil, "needs a server started at PostgreSQL's default lock capacity; --dsn names an existing one", nil
	}
	opts.Settings = pgtest.DefaultLockCapacity()
	srv, err := obtainServerWith(ctx, opts)
	if err != nil {
		return nil, "", err
	}
	defer srv.Close(context.Background())
	name, err := srv.CreateDatabase(ctx, "harness_soak_bulk_", "")
	if err != nil {
		return nil, "", err
	}
	src, err := srv.Source(name)
	if err != nil {
		return nil, "", err
	}
	sides, err := realfaults.MakeSides(ctx, p, src, "bulk_")
	if err != nil {
		return nil, "", err
	}
	live, err := realfaults.MakeSides(ctx, p, src, "live_")
	if err != nil {
		return nil, "", err
	}
	fmt.Fprintln(env.Stderr, "bulk operations at PostgreSQL's default lock capacity ...")
	rep, err := realfaults.RunBulk(ctx, p, src, sides, live[1].Schema, realfaults.Bulk{
		Children: 20_000, Instances: 100_000, QueueMessages: 100_000, Deadline: 15 * time.Minute,
	})
	if err != nil {
		return nil, "", err
	}
	fmt.Fprint(env.Stderr, rep.String())
	return rep, "", nil
}
