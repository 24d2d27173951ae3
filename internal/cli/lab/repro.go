package lab

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/repro"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// reproSetup is one throwaway database with one schema per version.
type reproSetup struct {
	srv     *pgtest.Server
	name    string
	db      *dbconn.Source
	schemas map[int64]string
}

// setupRepro starts (or borrows, with dsn) a server, creates a database and
// migrates schema duroxide_v<N> to N for every version.
func setupRepro(ctx context.Context, env *cli.Env, dsn string, versions []int64) (*reproSetup, error) {
	srv, err := obtainServer(ctx, dsn)
	if err != nil {
		return nil, err
	}
	name, err := srv.CreateDatabase(ctx, "harness_repro_", "")
	if err != nil {
		srv.Close(context.Background())
		return nil, err
	}
	db, err := srv.Source(name)
	if err != nil {
		srv.Close(context.Background())
		return nil, err
	}
	s := &reproSetup{srv: srv, name: name, db: db, schemas: map[int64]string{}}
	for _, v := range versions {
		schema := fmt.Sprintf("duroxide_v%d", v)
		if err := migrate.To(ctx, s.db.Config(), schema, v); err != nil {
			s.close()
			return nil, err
		}
		s.schemas[v] = schema
	}
	if len(s.schemas) > 0 {
		fmt.Fprintf(env.Stderr, "harness-lab: %s database, schemas %v\n", srv.Backend(), s.schemas)
	} else {
		fmt.Fprintf(env.Stderr, "harness-lab: %s database %s\n", srv.Backend(), name)
	}
	return s, nil
}

func (s *reproSetup) close() { _ = s.srv.Close(context.Background()) }

// reproUsage is the repro command's synopsis.
const reproUsage = "usage: harness-lab repro [minimal|organic|worker-minimal|worker|runtime|all] [--sides upstream,candidate,pack] [--form held-key|pool|all] [--worker-versions BUG,FIX] [--json FILE] [--report DIR] [--dsn DSN]"

// reproKinds are the repros, in the order `all` runs them.
func reproKinds() []string { return repro.Kinds() }

func runRepro(ctx context.Context, env *cli.Env, args []string) error {
	fs := cli.NewFlags(env, "repro")
	dsn := fs.String("dsn", "", "use this existing server (a database is created and dropped) instead of a throwaway one")
	sidesFlag := fs.String("sides", strings.Join(repro.Sides(), ","), fmt.Sprintf("minimal, organic, runtime: the schemas to compare, among %s (upstream's latest as its runner makes it; upstream's candidate fix, port; the pack's latest; the candidate with the amendment offered upstream); upstream and pack are required",
		strings.Join([]string{repro.SideUpstream, repro.SideCandidate, repro.SidePack, repro.SideAmended}, ", ")))
	jsonFile := fs.String("json", "", "write the figures as JSON to this file")
	reportDir := fs.String("report", "", "write a Markdown report (with a histogram of remaining lease) into this directory")
	def := repro.OrganicDefaults()
	dispatchers := fs.Int("dispatchers", def.Dispatchers, "organic: simulated dispatchers, each with its own connection")
	instances := fs.Int("instances", def.Instances, "organic: hot instances")
	history := fs.Int("history", def.HistoryEvents, "organic: history events per instance")
	eventBytes := fs.Int("event-bytes", def.EventBytes, "organic: approximate size of one history event")
	lockTimeout := fs.Duration("lock-timeout", def.LockTimeout, fmt.Sprintf("organic: orchestrator lock timeout (0: %g x one uncontended fetch, measured now)", repro.LockTimeoutFactor))
	poll := fs.Duration("poll", def.PollInterval, "organic: minimum poll interval")
	turn := fs.Duration("turn", def.TurnTime, "organic: simulated turn time")
	duration := fs.Duration("duration", def.Duration, "organic: run time per version")
	skew := fs.Duration("skew", def.Skew, "organic: spread the dispatchers' clocks over [-skew, +skew]")
	bouncer := fs.String("pgbouncer", "", "organic: the dispatchers connect through a PgBouncer started next to the server, in this pool mode (transaction, session or statement)")
	// A pack without the worker fixes has no default pair: the worker
	// repros then need --worker-versions, and say why.
	wbug, wfix, werr := repro.WorkerVersions()
	workerPair := ""
	if werr == nil {
		workerPair = fmt.Sprintf("%d,%d", wbug, wfix)
	}
	workerVersionsFlag := fs.String("worker-versions", workerPair, "worker-minimal: schema versions to compare, the buggy one then the fixed one")
	wdef := repro.WorkerDefaults()
	workerRuntimes := fs.Int("worker-runtimes", wdef.Runtimes, "worker: simulated runtimes, each with its own clock")
	workerSlots := fs.Int("worker-slots", wdef.Slots, "worker: worker slots per runtime, each with its own connection")
	workerDuration := fs.Duration("worker-duration", wdef.Duration, "worker: run time per version")
	workerLockTimeout := fs.Duration("worker-lock-timeout", wdef.LockTimeout, fmt.Sprintf("worker: worker lock timeout, whole seconds (0: calibrated, at least %v)", repro.WorkerMinLockTimeout))
	rdef := repro.RuntimeDefaults()
	runtimeHold := fs.Duration("runtime-hold", rdef.Hold, fmt.Sprintf("runtime: how long another session holds the instance's advisory key each time (above the runtime's %v lock timeout)", repro.RuntimeLockTimeout))
	runtimeHolds := fs.Int("runtime-holds", rdef.Holds, "runtime: how many times it holds the key (11 passes the runtime's poison threshold)")
	form := fs.String("form", runtimeFormAll, "runtime: the form to run: held-key (another session holds the instance's advisory key), pool (another session makes the runtime's pooled connections wait; no advisory lock), or all")
	pdef := repro.RuntimePoolDefaults()
	poolHold := fs.Duration("pool-hold", pdef.Hold, fmt.Sprintf("runtime pool form: how long another session holds worker_queue's table lock each time (above the runtime's %v lock timeout, below the pool's %v acquire timeout)", repro.RuntimeLockTimeout, repro.PoolAcquireTimeout))
	poolHolds := fs.Int("pool-holds", pdef.Holds, "runtime pool form: how many times it holds the lock")
	poolOrchestrations := fs.Int("pool-orchestrations", pdef.Orchestrations, "runtime pool form: the backlog of orchestrations, each waiting for an event raised at once")
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	which := "all"
	if len(pos) > 1 {
		return cli.Usagef("%s", reproUsage)
	}
	if len(pos) == 1 {
		which = pos[0]
	}
	runs := map[string]bool{}
	for _, k := range reproKinds() {
		runs[k] = which == k || which == "all"
	}
	if which != "all" && !runs[which] {
		return cli.Usagef("unknown repro %q: use minimal, organic, worker-minimal, worker, runtime or all", which)
	}
	if !slices.Contains(runtimeForms(), *form) {
		return cli.Usagef("--form %q: use %s", *form, strings.Join(runtimeForms(), ", "))
	}
	runs["runtime-held-key"] = runs["runtime"] && (*form == runtimeFormHeldKey || *form == runtimeFormAll)
	runs["runtime-pool"] = runs["runtime"] && (*form == runtimeFormPool || *form == runtimeFormAll)
	runtimeCfg := repro.RuntimeConfig{Hold: *runtimeHold, Holds: *runtimeHolds}
	if err := runtimeCfg.Validate(); err != nil {
		return cli.Usagef("%v", err)
	}
	poolCfg := pdef
	poolCfg.Hold, poolCfg.Holds, poolCfg.Orchestrations = *poolHold, *poolHolds, *poolOrchestrations
	if err := poolCfg.Validate(); err != nil {
		return cli.Usagef("%v", err)
	}
	sides, err := parseSides(*sidesFlag)
	if err != nil {
		return err
	}
	var provider *upstream.Provider
	if runs["minimal"] || runs["organic"] || runs["runtime"] {
		// Upstream's side, and its candidate's, are made by the real
		// provider.
		if provider, err = upstream.Find(); err != nil {
			return fmt.Errorf("repro: %w", err)
		}
	}
	var workerVersions []int64
	if *workerVersionsFlag != "" || runs["worker"] || runs["worker-minimal"] {
		if *workerVersionsFlag == "" {
			return cli.Usagef("repro: %v", werr)
		}
		if workerVersions, err = parseVersions(*workerVersionsFlag); err != nil {
			return err
		}
	}
	if *workerRuntimes < 1 || *workerSlots < 1 || *workerDuration <= 0 || *workerLockTimeout < 0 || *workerLockTimeout%time.Second != 0 {
		return cli.Usagef("worker settings out of range: worker-runtimes, worker-slots >= 1; worker-duration > 0; worker-lock-timeout 0 or whole seconds")
	}
	if runs["worker"] && (*workerVersionsFlag != workerPair) {
		return cli.Usagef("the worker repro compares versions %d and %d only; drop --worker-versions or use `repro worker-minimal`", wbug, wfix)
	}
	workerCfg := wdef
	workerCfg.Runtimes, workerCfg.Slots, workerCfg.Duration = *workerRuntimes, *workerSlots, *workerDuration
	if *workerLockTimeout != 0 {
		workerCfg.LockTimeout, workerCfg.CalibrateLockTimeout = *workerLockTimeout, false
	}
	organicCfg := def
	organicCfg.Dispatchers, organicCfg.Instances, organicCfg.HistoryEvents, organicCfg.EventBytes = *dispatchers, *instances, *history, *eventBytes
	organicCfg.PollInterval, organicCfg.TurnTime, organicCfg.Duration, organicCfg.Skew = *poll, *turn, *duration, *skew
	if *lockTimeout != 0 {
		organicCfg.LockTimeout, organicCfg.CalibrateLockTimeout = *lockTimeout, false
	}
	if *dispatchers < 1 || *instances < 1 || *history < 0 || *eventBytes < 1 || *lockTimeout < 0 || *poll <= 0 || *turn < 0 || *duration <= 0 || *skew < 0 {
		return cli.Usagef("organic settings out of range: dispatchers, instances, event-bytes >= 1; poll, duration > 0; history, lock-timeout, turn, skew >= 0")
	}
	if *bouncer != "" && !slices.Contains(pgtest.PoolModes(), *bouncer) {
		return cli.Usagef("--pgbouncer %q: use a pool mode, one of %s", *bouncer, strings.Join(pgtest.PoolModes(), ", "))
	}

	// Schemas duroxide_vN for the worker's minimal repro; the others make
	// their own.
	var setupVersions []int64
	if runs["worker-minimal"] {
		setupVersions = workerVersions
	}
	setup, err := setupRepro(ctx, env, *dsn, setupVersions)
	if err != nil {
		return err
	}
	defer setup.close()

	progress := func(line string) { fmt.Fprintln(env.Stderr, "harness-lab: "+line) }
	report := repro.Report{Verdict: map[string]bool{}}
	steps := []struct {
		kind string
		run  func() (verdict bool, err error)
	}{
		{"minimal", func() (bool, error) {
			made, err := repro.MakeSides(ctx, setup.db, provider, "minimal", sides)
			if err != nil {
				return false, fmt.Errorf("minimal repro: %w", err)
			}
			res, err := repro.RunMinimal(ctx, setup.db, made)
			report.Minimal = res
			return repro.MinimalVerdict(res), printed(err, func() error { return repro.PrintMinimal(env.Stdout, res) })
		}},
		{"organic", func() (bool, error) {
			res, err := runOrganic(ctx, setup, provider, organicCfg, sides, *bouncer, env, progress)
			report.Organic = &res
			return res.Verdict.OK, printed(err, func() error { return repro.PrintOrganic(env.Stdout, res) })
		}},
		{"worker-minimal", func() (bool, error) {
			res, err := repro.RunWorkerMinimal(ctx, setup.db, setup.schemas, workerVersions)
			report.WorkerMinimal = res
			return repro.WorkerMinimalVerdict(res), printed(err, func() error { return repro.PrintWorkerMinimal(env.Stdout, res) })
		}},
		{"worker", func() (bool, error) {
			res, err := repro.WorkerRepro(ctx, setup.db, workerCfg, progress)
			report.Worker = &res
			return res.Verdict.OK, printed(err, func() error { return repro.PrintWorker(env.Stdout, res) })
		}},
		{"runtime-held-key", func() (bool, error) {
			res, err := repro.RuntimeRepro(ctx, setup.db, provider, runtimeCfg, sides, progress)
			report.Runtime = &res
			return res.OK(), printed(err, func() error { return repro.PrintRuntime(env.Stdout, res) })
		}},
		{"runtime-pool", func() (bool, error) {
			res, err := repro.RuntimePoolRepro(ctx, setup.db, provider, poolCfg, sides, progress)
			report.RuntimePool = &res
			return res.OK(), printed(err, func() error { return repro.PrintRuntimePool(env.Stdout, res) })
		}},
	}
	section := false
	for _, st := range steps {
		if !runs[st.kind] {
			continue
		}
		if section {
			fmt.Fprintln(env.Stdout)
		}
		section = true
		verdict, err := st.run()
		if err != nil {
			return err
		}
		report.Verdict[verdictKey(st.kind)] = verdict
	}
	if *reportDir != "" {
		if err := report.Write(*reportDir); err != nil {
			return err
		}
		fmt.Fprintf(env.Stderr, "harness-lab: report written to %s\n", filepath.Join(*reportDir, repro.ReportFile))
	}
	if *jsonFile != "" {
		if err := report.WriteJSON(*jsonFile); err != nil {
			return err
		}
	}
	if !report.OK() {
		return cli.Failure{Msg: "the repro did not show what it should (see the verdicts above)"}
	}
	return nil
}

// The runtime repro's forms (--form).
const (
	runtimeFormHeldKey = "held-key"
	runtimeFormPool    = "pool"
	runtimeFormAll     = "all"
)

func runtimeForms() []string { return []string{runtimeFormHeldKey, runtimeFormPool, runtimeFormAll} }

// verdictKey is the key of a step's verdict in the report: the kind in
// snake_case, the runtime repro's held-key form as "runtime" and its pool
// form as "runtime_pool".
func verdictKey(step string) string {
	if step == "runtime-held-key" {
		step = "runtime"
	}
	return strings.ReplaceAll(step, "-", "_")
}

// printed is err, or when the step succeeded what printing its result
// returns.
func printed(err error, print func() error) error {
	if err != nil {
		return err
	}
	return print()
}

// runOrganic runs the organic repro in the repro database, its dispatchers
// connecting through a PgBouncer in bouncerMode when that is not empty.
func runOrganic(ctx context.Context, setup *reproSetup, p *upstream.Provider, cfg repro.OrganicConfig, sides []string, bouncerMode string, env *cli.Env, progress func(string)) (repro.OrganicResult, error) {
	if bouncerMode != "" {
		b, err := pgtest.StartPgBouncer(ctx, setup.srv, bouncerMode)
		if err != nil {
			return repro.OrganicResult{}, fmt.Errorf("organic repro: %w", err)
		}
		defer b.Close()
		via, err := dbconn.Parse(b.DSN(setup.name))
		if err != nil {
			return repro.OrganicResult{}, fmt.Errorf("organic repro: %w", err)
		}
		cfg.Via = via
		fmt.Fprintf(env.Stderr, "harness-lab: the dispatchers connect through pgbouncer (%s pooling)\n", bouncerMode)
	}
	return repro.OrganicRepro(ctx, setup.db, p, cfg, sides, progress)
}

// parseSides reads --sides: known keys, each once, upstream's and the
// pack's among them.
func parseSides(s string) ([]string, error) {
	known := []string{repro.SideUpstream, repro.SideCandidate, repro.SidePack, repro.SideAmended}
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if !slices.Contains(known, f) || slices.Contains(out, f) {
			return nil, cli.Usagef("--sides %q: give each of %s at most once", s, strings.Join(known, ", "))
		}
		out = append(out, f)
	}
	if !slices.Contains(out, repro.SideUpstream) || !slices.Contains(out, repro.SidePack) {
		return nil, cli.Usagef("--sides %q: the verdicts compare upstream's side with the pack's; give both", s)
	}
	return out, nil
}

func parseVersions(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || v < 1 || v > migrations.Latest() {
			return nil, cli.Usagef("--worker-versions %q: give two schema versions between 1 and %d (the pack's latest)", s, migrations.Latest())
		}
		out = append(out, v)
	}
	if len(out) != 2 {
		return nil, cli.Usagef("--worker-versions %q: give exactly two versions, the buggy one then the fixed one", s)
	}
	return out, nil
}
