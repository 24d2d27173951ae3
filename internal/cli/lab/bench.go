package lab

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/callcost"
	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/migrateload"
	"github.com/duroxide-pg/migrations/internal/planshape"
	"github.com/duroxide-pg/migrations/internal/sim/bench"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// benchSummary is the line of `harness help` for the bench command (the
// versions compared are in `harness-lab bench -h`, read from the pack).
const benchSummary = "speed before and after the pack's fixes, side by side in one run: bench [--rounds 3] [--duration 2.5s] [--scenarios backlog,hot,queue-only,migrate,worker,scale,runtime,migrate-load,plans,calls] [--scale-blocked 1000,10000,100000] [--json FILE] [--report DIR] [--dsn DSN]"

// runBench is `harness-lab bench`: every scenario of package bench, rounds
// alternating the versions before and after the fix of
// fetch_orchestration_item (the worker scenario: before and after the
// worker fixes), on a throwaway server (or --dsn), a table of medians and
// ratios on stdout, a progress line on stderr.
func runBench(ctx context.Context, env *cli.Env, args []string) error {
	def := bench.Defaults()
	fs := cli.NewFlags(env, "bench")
	dsn := fs.String("dsn", "", "use this existing server (a database is created and dropped) instead of a throwaway one")
	rounds := fs.Int("rounds", def.Rounds, "rounds per cell and version (at least 3)")
	duration := fs.Duration("duration", def.Duration, "run time of one cell, per version and round")
	rprev, rlatest := bench.RuntimeVersions()
	scenarios := fs.String("scenarios", strings.Join(def.Scenarios, ","), fmt.Sprintf(
		"scenarios to run: backlog, hot, queue-only, migrate (%s), worker (%s), scale (%s), runtime (the real runtime: upstream's schema against %d and %d), migrate-load (migrate up to the latest while a writer enqueues: not run unless named), plans (rows a queue read reads, call after call: upstream's schema and the latest; not run unless named), calls (where a call's server time goes, uncontended: upstream's schema, the latest and its variants; not run unless named)",
		pairOf(bench.Versions()), pairOf(bench.WorkerVersions()), pairOf(bench.ScaleVersions()), rprev, rlatest))
	hotLock := fs.Duration("hot-lock-timeout", def.HotLockTimeout, "hot scenario's lock timeout; 0: calibrated at start like the organic repro")
	scaleBlocked := fs.String("scale-blocked", joinInts(def.ScaleBlocked), "scale: blocked message counts K, comma-separated")
	scaleCompleted := fs.String("scale-completed", joinInts(def.ScaleCompleted), "scale: completed instance counts, comma-separated")
	scaleCalls := fs.Int("scale-calls", def.ScaleCalls, "scale: fetch calls per figure on one session (at least 7)")
	scaleIdle := fs.Int("scale-idle-dispatchers", def.ScaleIdleDispatchers, "scale: idle dispatchers polling at the largest K")
	scaleIdleFor := fs.Duration("scale-idle-duration", def.ScaleIdleDuration, "scale: how long the idle dispatchers poll, per version and round")
	full := migrateload.Full()
	loadMessages := fs.Int("migrate-load-messages", full.Messages, "migrate-load: messages queued before the writer starts")
	loadInstances := fs.Int("migrate-load-instances", full.Instances, "migrate-load: instances the queued messages are spread over")
	loadRate := fs.Int("migrate-load-rate", full.Rate, "migrate-load: the writer's messages per second")
	plansRows := fs.Int("plans-rows", planshape.DefaultRows, "plans: the rows a call does not need, in every cell")
	callsCount := fs.Int("calls-count", 2000, "calls: measured calls per cell, side and round")
	jsonFile := fs.String("json", "", "write the result as JSON to this file")
	reportDir := fs.String("report", "", "write report.md, throughput.svg and bench.json into this directory (migrate-load: migrate-load.md and migrate-load.json; plans: plans.md and plans.json; calls: calls.md and calls.json)")
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return cli.Usagef("harness-lab bench takes no arguments, got %q (run `harness-lab bench -h`)", pos[0])
	}
	if *rounds < 3 {
		return cli.Usagef("--rounds %d: at least 3 rounds, so that medians mean something", *rounds)
	}
	if *duration < 100*time.Millisecond || *duration > 10*time.Minute {
		return cli.Usagef("--duration %v: give a cell duration between 100ms and 10m, e.g. 2.5s", *duration)
	}
	cfg := def
	cfg.Rounds, cfg.Duration, cfg.Scenarios = *rounds, *duration, nil
	if *hotLock < 0 || *scaleCalls < 1 || *scaleIdle < 1 || *scaleIdleFor < 100*time.Millisecond {
		return cli.Usagef("--hot-lock-timeout >= 0, --scale-calls and --scale-idle-dispatchers >= 1, --scale-idle-duration >= 100ms")
	}
	cfg.ScaleCalls, cfg.ScaleIdleDispatchers, cfg.ScaleIdleDuration = *scaleCalls, *scaleIdle, *scaleIdleFor
	if *hotLock != 0 {
		cfg.HotLockTimeout, cfg.CalibrateHotLockTimeout = *hotLock, false
	}
	if cfg.ScaleBlocked, err = parseInts("--scale-blocked", *scaleBlocked); err != nil {
		return err
	}
	if cfg.ScaleCompleted, err = parseInts("--scale-completed", *scaleCompleted); err != nil {
		return err
	}
	var load *migrateload.Load
	plans, calls := false, false
	for _, s := range strings.Split(*scenarios, ",") {
		s = strings.ReplaceAll(strings.TrimSpace(s), "-", "_")
		switch s {
		case "":
			continue
		case plansScenario:
			if *plansRows < 1 {
				return cli.Usagef("--plans-rows %d: at least 1", *plansRows)
			}
			plans = true
			continue
		case callsScenario:
			if *callsCount < 1 {
				return cli.Usagef("--calls-count %d: at least 1", *callsCount)
			}
			calls = true
			continue
		case migrateLoadScenario:
			load = &migrateload.Load{Messages: *loadMessages, Instances: *loadInstances, Rate: *loadRate, Lead: full.Lead, To: migrations.Latest()}
			if err := load.Validate(); err != nil {
				return cli.Usagef("%v", err)
			}
			continue
		}
		cfg.Scenarios = append(cfg.Scenarios, s)
	}
	if len(cfg.Scenarios) == 0 && load == nil && !plans && !calls {
		return cli.Usagef("--scenarios is empty: name some of backlog, hot, queue-only, migrate, worker, scale, runtime, migrate-load, plans, calls")
	}
	if len(cfg.Scenarios) > 0 {
		if err := cfg.Validate(); err != nil {
			return cli.Usagef("%v", err)
		}
	}
	var provider *upstream.Provider
	if load != nil || plans || calls {
		if provider, err = upstream.Find(); err != nil {
			return cli.Usagef("bench --scenarios migrate-load, plans and calls start from a database the real provider's runner makes: %v (make upstream installs it)", err)
		}
	}

	// A throwaway server loads pg_stat_statements for the runtime
	// scenario's per-function figures (an existing one is taken as it is).
	opts := pgtest.OptionsFromEnv()
	if *dsn != "" {
		opts.Backend, opts.DSN = pgtest.DSN, *dsn
	}
	opts.Preload = []string{"pg_stat_statements"}
	srv, err := obtainServerWith(ctx, opts)
	if err != nil {
		return err
	}
	defer srv.Close(context.Background())

	if load != nil {
		if err := runMigrateLoad(ctx, env, srv, provider, *load, *reportDir); err != nil {
			return err
		}
	}
	if plans {
		if err := runPlans(ctx, env, srv, provider, *plansRows, *reportDir); err != nil {
			return err
		}
	}
	if calls {
		if err := runCalls(ctx, env, srv, provider, *callsCount, *rounds, *reportDir); err != nil {
			return err
		}
	}
	if len(cfg.Scenarios) == 0 {
		return nil
	}
	bar := newProgressBar(env.Stderr)
	res, err := bench.Run(ctx, srv, cfg, bar.update)
	bar.done()
	res.Server.Backend = string(srv.Backend())
	if err != nil {
		return err
	}
	if err := bench.PrintTable(env.Stdout, &res); err != nil {
		return err
	}
	if *reportDir != "" {
		if err := bench.WriteReport(*reportDir, &res); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
		fmt.Fprintf(env.Stderr, "harness-lab: report written to %s\n", filepath.Join(*reportDir, bench.ReportFile))
	}
	if *jsonFile != "" {
		if err := bench.WriteJSON(*jsonFile, &res); err != nil {
			return fmt.Errorf("write %s: %w", *jsonFile, err)
		}
	}
	return nil
}

// migrateLoadScenario is the bench scenario of internal/migrateload,
// which the cli runs itself (bench.Run does not know it).
const migrateLoadScenario = "migrate_load"

// runMigrateLoad measures load from every start state to the pack's
// latest, each in a schema of its own in a database it creates on srv and
// drops, and prints the table (and writes the report into dir, if any).
func runMigrateLoad(ctx context.Context, env *cli.Env, srv *pgtest.Server, provider *upstream.Provider, load migrateload.Load, dir string) error {
	starts, err := migrateload.Starts(func(ctx context.Context, src *dbconn.Source, schema string) error {
		return provider.Migrate(ctx, src, schema)
	})
	if err != nil {
		return err
	}
	src, server, drop, err := benchDatabase(ctx, srv, "harness_bench_load_")
	if err != nil {
		return err
	}
	defer drop()
	var reps []*migrateload.Report
	for i, start := range starts {
		fmt.Fprintf(env.Stderr, "migrate-load: from %s ...\n", start.Name)
		l := load
		l.Start = start
		rep, err := migrateload.Run(ctx, src, fmt.Sprintf("load_%d", i+1), l)
		if err != nil {
			return err
		}
		reps = append(reps, rep)
	}
	fmt.Fprint(env.Stdout, migrateload.Table(reps))
	if dir != "" {
		if err := migrateload.WriteReport(dir, server, reps); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
		fmt.Fprintf(env.Stderr, "harness-lab: report written to %s\n", filepath.Join(dir, migrateload.ReportFile))
	}
	return nil
}

// benchDatabase creates a database on srv for a scenario the cli runs
// itself, and says which PostgreSQL it is; drop drops it.
func benchDatabase(ctx context.Context, srv *pgtest.Server, prefix string) (src *dbconn.Source, server string, drop func(), err error) {
	name, err := srv.CreateDatabase(ctx, prefix, "")
	if err != nil {
		return nil, "", nil, err
	}
	drop = func() { _ = srv.DropDatabase(context.Background(), name) }
	if src, err = srv.Source(name); err != nil {
		drop()
		return nil, "", nil, err
	}
	conn, err := src.Connect(ctx)
	if err != nil {
		drop()
		return nil, "", nil, err
	}
	err = conn.QueryRow(ctx, "SELECT 'PostgreSQL ' || current_setting('server_version')").Scan(&server)
	conn.Close(ctx)
	if err != nil {
		drop()
		return nil, "", nil, err
	}
	return src, server, drop, nil
}

// plansScenario is the bench scenario of internal/planshape, which the cli
// runs itself (bench.Run does not know it).
const plansScenario = "plans"

// runPlans runs every planshape cell with rows unneeded rows on upstream's
// schema as its runner makes it and on the pack's latest, prints the table
// and writes the report into dir, if any.
func runPlans(ctx context.Context, env *cli.Env, srv *pgtest.Server, provider *upstream.Provider, rows int, dir string) error {
	src, server, drop, err := benchDatabase(ctx, srv, "harness_bench_plans_")
	if err != nil {
		return err
	}
	defer drop()
	latest := fmt.Sprintf("pack %04d", migrations.Latest())
	sides := []planshape.Side{
		{Name: "upstream 1..21 and 23", Make: provider.Migrate},
		{Name: latest, Make: func(ctx context.Context, src *dbconn.Source, schema string) error {
			return migrate.To(ctx, src.Config(), schema, migrations.Latest())
		}},
	}
	results, err := planshape.Run(ctx, src, sides, planshape.Cells(orch.RuntimeFilter()), rows, func(line string) {
		fmt.Fprintf(env.Stderr, "plans: %s ...\n", line)
	})
	if err != nil {
		return err
	}
	fmt.Fprint(env.Stdout, planshape.Table(results))
	if dir != "" {
		if err := planshape.WriteReport(dir, server, latest, results); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
		fmt.Fprintf(env.Stderr, "harness-lab: report written to %s\n", filepath.Join(dir, planshape.ReportFile))
	}
	return nil
}

// callsScenario is the bench scenario of internal/callcost, which the cli
// runs itself (bench.Run does not know it).
const callsScenario = "calls"

// runCalls runs every callcost cell, count calls a cell, rounds times, on
// upstream's schema as its runner makes it, the pack's latest and its
// variants, prints the tables and writes the report into dir, if any.
func runCalls(ctx context.Context, env *cli.Env, srv *pgtest.Server, provider *upstream.Provider, count, rounds int, dir string) error {
	src, server, drop, err := benchDatabase(ctx, srv, "harness_bench_calls_")
	if err != nil {
		return err
	}
	defer drop()
	latest := fmt.Sprintf("pack %04d", migrations.Latest())
	sides := callcost.Sides{
		Upstream: callcost.Side{Name: "upstream 1..21 and 23", Make: provider.Migrate},
		Latest: callcost.Side{Name: latest, Make: func(ctx context.Context, src *dbconn.Source, schema string) error {
			return migrate.To(ctx, src.Config(), schema, migrations.Latest())
		}},
	}
	filter := orch.RuntimeFilter()
	results, err := callcost.Run(ctx, src, sides, callcost.Cells(filter.Min, filter.Max), count, rounds, func(line string) {
		fmt.Fprintf(env.Stderr, "calls: %s ...\n", line)
	})
	if err != nil {
		return err
	}
	fmt.Fprint(env.Stdout, callcost.Accounting(results, latest), "\n", callcost.Table(results))
	if dir != "" {
		if err := callcost.WriteReport(dir, server, latest, count, rounds, results); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
		fmt.Fprintf(env.Stderr, "harness-lab: report written to %s\n", filepath.Join(dir, callcost.ReportFile))
	}
	return nil
}

// joinInts writes ns comma-separated.
func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// parseInts reads the comma-separated counts of flag (at least one, none
// negative).
func parseInts(flag, v string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, cli.Usagef("%s %q: give comma-separated counts, e.g. 1000,10000", flag, v)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, cli.Usagef("%s is empty: give comma-separated counts, e.g. 1000,10000", flag)
	}
	return out, nil
}

// progressBar draws one line on a terminal (rewritten in place) or one
// line per step elsewhere (CI logs).
type progressBar struct {
	w    io.Writer
	tty  bool
	last int
}

func newProgressBar(w io.Writer) *progressBar {
	tty := false
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	return &progressBar{w: w, tty: tty}
}

func (p *progressBar) update(pr bench.Progress) {
	const width = 24
	filled := 0
	if pr.Steps > 0 {
		filled = width * max(pr.Step-1, 0) / pr.Steps
	}
	eta := ""
	if pr.Step > 1 && pr.Steps > 0 {
		left := time.Duration(float64(pr.Elapsed) / float64(pr.Step-1) * float64(pr.Steps-pr.Step+1))
		eta = fmt.Sprintf(", ~%v left", left.Round(time.Second))
	}
	round := ""
	if pr.Round > 0 {
		round = fmt.Sprintf("round %d/%d ", pr.Round, pr.Rounds)
	}
	line := fmt.Sprintf("bench [%s%s] %d/%d %s%s (%v%s)", strings.Repeat("#", filled), strings.Repeat(".", width-filled),
		pr.Step, pr.Steps, round, pr.Label, pr.Elapsed.Round(time.Second), eta)
	if p.tty {
		pad := max(p.last-len(line), 0)
		fmt.Fprintf(p.w, "\r%s%s", line, strings.Repeat(" ", pad))
		p.last = len(line)
		return
	}
	fmt.Fprintln(p.w, line)
}

func (p *progressBar) done() {
	if p.tty && p.last > 0 {
		fmt.Fprintln(p.w)
	}
}

// pairOf says which versions a scenario compares, for the help: "schema B
// against F", or why there are none.
func pairOf(before, after int64, err error) string {
	if err != nil {
		return "none: " + err.Error()
	}
	return fmt.Sprintf("schema %d against %d", before, after)
}
