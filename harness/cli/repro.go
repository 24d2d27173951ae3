package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/harness/sim/dispatch"
	"github.com/duroxide-pg/migrations/harness/sim/orch"
	"github.com/duroxide-pg/migrations/harness/sim/repro"
	"github.com/duroxide-pg/migrations/harness/sim/worker"
	"github.com/duroxide-pg/migrations/harness/testenv/pgtest"
	migrations "github.com/duroxide-pg/migrations/sql"
)

// reproSetup is one throwaway database with one schema per version.
type reproSetup struct {
	srv     *pgtest.Server
	name    string
	dsn     string
	schemas map[int64]string
}

// setupRepro starts (or borrows, with dsn) a server, creates a database and
// migrates schema duroxide_v<N> to N for every version.
func setupRepro(ctx context.Context, env *Env, dsn string, versions []int64) (*reproSetup, error) {
	srv, err := obtainServer(ctx, dsn)
	if err != nil {
		return nil, err
	}
	name, err := srv.CreateDatabase(ctx, "harness_repro_", "")
	if err != nil {
		srv.Close(context.Background())
		return nil, err
	}
	s := &reproSetup{srv: srv, name: name, dsn: srv.DSN(name), schemas: map[int64]string{}}
	for _, v := range versions {
		schema := fmt.Sprintf("duroxide_v%d", v)
		if err := migrate.To(ctx, s.dsn, schema, v); err != nil {
			s.close()
			return nil, err
		}
		s.schemas[v] = schema
	}
	fmt.Fprintf(env.Stderr, "harness: %s database, schemas %v\n", srv.Backend(), s.schemas)
	return s, nil
}

func (s *reproSetup) close() { _ = s.srv.Close(context.Background()) }

// reproReport is what --json writes.
type reproReport struct {
	Minimal       []repro.MinimalResult       `json:"minimal,omitempty"`
	Organic       *repro.OrganicResult        `json:"organic,omitempty"`
	WorkerMinimal []repro.WorkerMinimalResult `json:"worker_minimal,omitempty"`
	Worker        *repro.WorkerResult         `json:"worker,omitempty"`
	Verdict       map[string]bool             `json:"verdict"`
}

// reproUsage is the repro command's synopsis.
const reproUsage = "usage: harness repro [minimal|organic|worker-minimal|worker|all] [--versions BUG,FIX] [--worker-versions BUG,FIX] [--json FILE] [--report DIR] [--dsn DSN]"

// reproKinds are the repros, in the order `all` runs them.
func reproKinds() []string { return []string{"minimal", "organic", "worker-minimal", "worker"} }

func runRepro(ctx context.Context, env *Env, args []string) error {
	fs := newFlags(env, "repro")
	dsn := fs.String("dsn", "", "use this existing server (a database is created and dropped) instead of a throwaway one")
	bug, fix := repro.Versions()
	pair := fmt.Sprintf("%d,%d", bug, fix)
	versionsFlag := fs.String("versions", pair, "schema versions to compare: the buggy one, then the fixed one")
	jsonFile := fs.String("json", "", "write the figures as JSON to this file")
	reportDir := fs.String("report", "", "write a Markdown report (with a histogram of remaining lease) into this directory")
	def := repro.OrganicDefaults()
	dispatchers := fs.Int("dispatchers", def.Dispatchers, "organic: simulated dispatchers, each with its own connection")
	instances := fs.Int("instances", def.Instances, "organic: hot instances")
	history := fs.Int("history", def.HistoryEvents, "organic: history events per instance")
	eventBytes := fs.Int("event-bytes", def.EventBytes, "organic: approximate size of one history event")
	lockTimeout := fs.Duration("lock-timeout", def.LockTimeout, "organic: orchestrator lock timeout (0: 3.5 x one uncontended fetch, measured now)")
	poll := fs.Duration("poll", def.PollInterval, "organic: minimum poll interval")
	turn := fs.Duration("turn", def.TurnTime, "organic: simulated turn time")
	duration := fs.Duration("duration", def.Duration, "organic: run time per version")
	skew := fs.Duration("skew", def.Skew, "organic: spread the dispatchers' clocks over [-skew, +skew]")
	bouncer := fs.String("pgbouncer", "", "organic: the dispatchers connect through a PgBouncer started next to the server, in this pool mode (transaction, session or statement)")
	wbug, wfix := repro.WorkerVersions()
	workerPair := fmt.Sprintf("%d,%d", wbug, wfix)
	workerVersionsFlag := fs.String("worker-versions", workerPair, "worker-minimal: schema versions to compare, the buggy one then the fixed one")
	wdef := repro.WorkerDefaults()
	workerRuntimes := fs.Int("worker-runtimes", wdef.Runtimes, "worker: simulated runtimes, each with its own clock")
	workerSlots := fs.Int("worker-slots", wdef.Slots, "worker: worker slots per runtime, each with its own connection")
	workerDuration := fs.Duration("worker-duration", wdef.Duration, "worker: run time per version")
	workerLockTimeout := fs.Duration("worker-lock-timeout", wdef.LockTimeout, "worker: worker lock timeout, whole seconds (0: calibrated, at least 2s)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	which := "all"
	if len(pos) > 1 {
		return usagef("%s", reproUsage)
	}
	if len(pos) == 1 {
		which = pos[0]
	}
	runs := map[string]bool{}
	for _, k := range reproKinds() {
		runs[k] = which == k || which == "all"
	}
	if which != "all" && !runs[which] {
		return usagef("unknown repro %q: use minimal, organic, worker-minimal, worker or all", which)
	}
	versions, err := parseVersions(*versionsFlag)
	if err != nil {
		return err
	}
	workerVersions, err := parseVersions(*workerVersionsFlag)
	if err != nil {
		return err
	}
	if *workerRuntimes < 1 || *workerSlots < 1 || *workerDuration <= 0 || *workerLockTimeout < 0 || *workerLockTimeout%time.Second != 0 {
		return usagef("worker settings out of range: worker-runtimes, worker-slots >= 1; worker-duration > 0; worker-lock-timeout 0 or whole seconds")
	}
	if runs["worker"] && (*workerVersionsFlag != workerPair) {
		return usagef("the worker repro compares versions %d and %d only; drop --worker-versions or use `repro worker-minimal`", wbug, wfix)
	}
	workerCfg := wdef
	workerCfg.Runtimes, workerCfg.Slots, workerCfg.Duration, workerCfg.LockTimeout = *workerRuntimes, *workerSlots, *workerDuration, *workerLockTimeout
	organicCfg := def
	organicCfg.Dispatchers, organicCfg.Instances, organicCfg.HistoryEvents, organicCfg.EventBytes = *dispatchers, *instances, *history, *eventBytes
	organicCfg.LockTimeout, organicCfg.PollInterval, organicCfg.TurnTime, organicCfg.Duration, organicCfg.Skew = *lockTimeout, *poll, *turn, *duration, *skew
	if *dispatchers < 1 || *instances < 1 || *history < 0 || *eventBytes < 1 || *lockTimeout < 0 || *poll <= 0 || *turn < 0 || *duration <= 0 || *skew < 0 {
		return usagef("organic settings out of range: dispatchers, instances, event-bytes >= 1; poll, duration > 0; history, lock-timeout, turn, skew >= 0")
	}
	if *bouncer != "" && !slices.Contains(pgtest.PoolModes(), *bouncer) {
		return usagef("--pgbouncer %q: use a pool mode, one of %s", *bouncer, strings.Join(pgtest.PoolModes(), ", "))
	}
	if runs["organic"] && (versions[0] != int64(bug) || versions[1] != int64(fix)) {
		return usagef("the organic repro compares versions %d and %d only; drop --versions or use `repro minimal`", bug, fix)
	}

	// Schemas duroxide_vN for the minimal repros; organic and worker
	// migrate their own.
	var setupVersions []int64
	if runs["minimal"] || runs["organic"] {
		setupVersions = append(setupVersions, versions...)
	}
	if runs["worker-minimal"] {
		for _, v := range workerVersions {
			if !slices.Contains(setupVersions, v) {
				setupVersions = append(setupVersions, v)
			}
		}
	}
	setup, err := setupRepro(ctx, env, *dsn, setupVersions)
	if err != nil {
		return err
	}
	defer setup.close()

	report := reproReport{Verdict: map[string]bool{}}
	ok := true
	section := false
	next := func() {
		if section {
			fmt.Fprintln(env.Stdout)
		}
		section = true
	}
	if runs["minimal"] {
		next()
		results, verdict, err := runMinimal(ctx, env, setup, versions)
		if err != nil {
			return err
		}
		report.Minimal = results
		report.Verdict["minimal"] = verdict
		ok = ok && verdict
	}
	if runs["organic"] {
		next()
		res, err := runOrganic(ctx, env, setup, organicCfg, *bouncer)
		if err != nil {
			return err
		}
		report.Organic = &res
		report.Verdict["organic"] = res.Verdict.OK
		ok = ok && res.Verdict.OK
	}
	if runs["worker-minimal"] {
		next()
		results, verdict, err := runWorkerMinimal(ctx, env, setup, workerVersions)
		if err != nil {
			return err
		}
		report.WorkerMinimal = results
		report.Verdict["worker_minimal"] = verdict
		ok = ok && verdict
	}
	if runs["worker"] {
		next()
		res, err := runWorker(ctx, env, setup, workerCfg)
		if err != nil {
			return err
		}
		report.Worker = &res
		report.Verdict["worker"] = res.Verdict.OK
		ok = ok && res.Verdict.OK
	}
	if *reportDir != "" {
		if err := writeReproReport(*reportDir, report); err != nil {
			return err
		}
		fmt.Fprintf(env.Stderr, "harness: report written to %s\n", filepath.Join(*reportDir, "report.md"))
	}
	if *jsonFile != "" {
		b, _ := json.MarshalIndent(report, "", "  ")
		if err := os.WriteFile(*jsonFile, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", *jsonFile, err)
		}
	}
	if !ok {
		return failure{"the repro did not show what it should (see the verdicts above)"}
	}
	return nil
}

// writeReproReport writes dir/report.md: the organic report (with its
// histogram) when that scenario ran, then the minimal scenario's table,
// the worker minimal scenarios' table and the worker scenario (with its
// histograms of remaining lease), for those that ran.
func writeReproReport(dir string, report reproReport) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	path := filepath.Join(dir, "report.md")
	if report.Organic != nil {
		if err := repro.WriteReport(dir, *report.Organic); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
	} else if err := os.WriteFile(path, []byte("# duroxide-pg fetch_orchestration_item: the repro\n\n"), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	var sections []string
	if len(report.Minimal) > 0 {
		sections = append(sections, repro.MinimalMarkdown(report.Minimal))
	}
	if len(report.WorkerMinimal) > 0 {
		sections = append(sections, repro.WorkerMinimalMarkdown(report.WorkerMinimal))
	}
	if report.Worker != nil {
		sections = append(sections, repro.WorkerMarkdown(*report.Worker))
	}
	if len(sections) == 0 {
		return nil
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	defer f.Close()
	for _, sec := range sections {
		if _, err := fmt.Fprintf(f, "\n%s", sec); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
	}
	return nil
}

// runOrganic runs the multi-dispatcher scenario on throwaway schemas at 19
// and 20 in the repro database, with a progress line on stderr.
func runOrganic(ctx context.Context, env *Env, setup *reproSetup, cfg dispatch.Config, bouncerMode string) (repro.OrganicResult, error) {
	if bouncerMode != "" {
		b, err := pgtest.StartPgBouncer(ctx, setup.srv, bouncerMode)
		if err != nil {
			return repro.OrganicResult{}, fmt.Errorf("organic repro: %w", err)
		}
		defer b.Close()
		cfg.ConnectDSN = b.DSN(setup.name)
		fmt.Fprintf(env.Stderr, "harness: the dispatchers connect through pgbouncer (%s pooling)\n", bouncerMode)
	}
	schemas, err := repro.PrepareOrganic(ctx, setup.dsn)
	if err != nil {
		return repro.OrganicResult{}, err
	}
	res, err := repro.RunOrganic(ctx, setup.dsn, schemas, cfg, func(line string) {
		fmt.Fprintln(env.Stderr, "harness: "+line)
	})
	if err != nil {
		return res, fmt.Errorf("organic repro: %w", err)
	}
	fmt.Fprintln(env.Stdout, "organic repro: simulated dispatchers on hot instances, no stale timestamps injected")
	fmt.Fprintln(env.Stdout)
	if err := repro.PrintTable(env.Stdout, res); err != nil {
		return res, err
	}
	return res, nil
}

func parseVersions(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || v < 1 || v > migrations.Latest() {
			return nil, usagef("--versions %q: give two schema versions between 1 and %d (the pack's latest)", s, migrations.Latest())
		}
		out = append(out, v)
	}
	if len(out) != 2 {
		return nil, usagef("--versions %q: give exactly two versions, the buggy one then the fixed one", s)
	}
	return out, nil
}

// runMinimal runs the stale-timestamp repro on every version and prints
// them side by side. The verdict holds when the first version shows the bug
// and the second the fix.
func runMinimal(ctx context.Context, env *Env, setup *reproSetup, versions []int64) ([]repro.MinimalResult, bool, error) {
	conn, err := pgx.Connect(ctx, setup.dsn)
	if err != nil {
		return nil, false, err
	}
	defer conn.Close(ctx)
	var results []repro.MinimalResult
	for _, v := range versions {
		res, err := repro.Minimal(ctx, conn, setup.schemas[v], v, repro.MinimalConfig{Filter: orch.RuntimeFilter()})
		if err != nil {
			return nil, false, fmt.Errorf("minimal repro at %d: %w", v, err)
		}
		results = append(results, res)
	}
	bug, fixed := results[0].Bug(), results[1].Fixed()
	fmt.Fprintf(env.Stdout, "minimal repro: fetch with p_now_ms %d ms stale, lock timeout %d ms, runtime version filter\n\n",
		results[0].StaleMs, results[0].LockTimeoutMs)
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "\tversion %d\tversion %d\t\n", versions[0], versions[1])
	fmt.Fprintf(tw, "row returned\t%v\t%v\t\n", results[0].Fetched, results[1].Fetched)
	fmt.Fprintf(tw, "remaining lease at return (ms, db clock)\t%+d\t%+d\t\n", results[0].RemainingMs, results[1].RemainingMs)
	fmt.Fprintf(tw, "ack with the returned token\t%s\t%s\t\n", ackText(results[0]), ackText(results[1]))
	tw.Flush()
	fmt.Fprintf(env.Stdout, "\nverdict: version %d %s; version %d %s\n", versions[0], verdictText(bug, "shows the bug", "does NOT show the bug"),
		versions[1], verdictText(fixed, "is fixed", "is NOT fixed"))
	return results, bug && fixed, nil
}

func ackText(r repro.MinimalResult) string {
	if r.AckOK {
		return "ok"
	}
	if r.AckError != "" {
		return r.AckError
	}
	return "-"
}

func verdictText(ok bool, yes, no string) string {
	if ok {
		return yes
	}
	return no
}

// runWorkerMinimal runs the worker minimal repro on both versions and
// prints them side by side. The verdict holds when the first version shows
// both symptoms and the second neither.
func runWorkerMinimal(ctx context.Context, env *Env, setup *reproSetup, versions []int64) ([]repro.WorkerMinimalResult, bool, error) {
	var results []repro.WorkerMinimalResult
	for _, v := range versions {
		res, err := repro.WorkerMinimal(ctx, setup.dsn, setup.schemas[v], v, repro.WorkerMinimalConfig{})
		if err != nil {
			return nil, false, err
		}
		results = append(results, res)
	}
	bug, fixed := results[0].Bug(), results[1].Fixed()
	fmt.Fprintf(env.Stdout, "worker minimal repro: fetch_work_item with p_now_ms %d ms stale and a %d ms lock timeout, then ack_worker; "+
		"a session fetch while another transaction holds the session's row (%d ms)\n\n",
		results[0].StaleMs, results[0].LockTimeoutMs, results[0].HoldMs)
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	for _, row := range repro.WorkerMinimalRows(results) {
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	tw.Flush()
	fmt.Fprintf(env.Stdout, "\nverdict: version %d %s; version %d %s\n", versions[0], verdictText(bug, "shows the bug", "does NOT show the bug"),
		versions[1], verdictText(fixed, "is fixed", "is NOT fixed"))
	return results, bug && fixed, nil
}

// runWorker runs the simulated activity workers on throwaway schemas at
// the worker bug and fix versions, with a progress line on stderr.
func runWorker(ctx context.Context, env *Env, setup *reproSetup, cfg worker.Config) (repro.WorkerResult, error) {
	schemas, err := repro.PrepareWorker(ctx, setup.dsn)
	if err != nil {
		return repro.WorkerResult{}, err
	}
	res, err := repro.RunWorker(ctx, setup.dsn, schemas, cfg, func(line string) {
		fmt.Fprintln(env.Stderr, "harness: "+line)
	})
	if err != nil {
		return res, fmt.Errorf("worker repro: %w", err)
	}
	fmt.Fprintln(env.Stdout, "worker repro: simulated activity workers with sessions and tags, runtime clocks spread around the database's")
	fmt.Fprintln(env.Stdout)
	if err := repro.PrintWorkerTable(env.Stdout, res); err != nil {
		return res, err
	}
	return res, nil
}
