package repro

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/settings"
	"github.com/duroxide-pg/migrations/internal/sim/worker"
)

// The worker scenario: simulated activity workers (package worker) run
// against the worker queue at each schema version, one after the other,
// with the same seed and settings. See WorkerDefaults.

// Verdict thresholds of the worker scenario. Counts are judged only over
// enough leases: a run with fewer fails its "leases returned" check (run it
// longer) rather than pass or fail on a handful.
const (
	minWorkerBugLeases = 50
	minWorkerFixLeases = 100
	// workerLockTimeoutFactor: the calibrated lock timeout is this many
	// uncontended fetch+ack cycles, rounded up to whole seconds, at least
	// WorkerMinLockTimeout.
	workerLockTimeoutFactor = 100
	WorkerMinLockTimeout    = 2 * time.Second
	workerMaxLockTimeout    = 30 * time.Second
)

// WorkerDefaults is the full worker scenario (`make repro`): 4 runtimes of
// 4 worker slots (16 workers, each with its own connection and session
// owner id), a backlog of 400 activities kept full (each completed item is
// replaced) that cycles plain, session-bound, tagged ("gpu", "io"),
// session-bound, over 8 sessions; the slots' tag filters cycle any,
// default_and {gpu}, default_only, tags {gpu, io}. Each runtime renews its
// slots' sessions every quarter of the session timeout (renew_session_lock
// with all its owner ids) and calls cleanup_orphaned_sessions every lock
// timeout. 10 s per version, poll interval 100 ms.
//
// The lock timeout T is calibrated (CalibrateLockTimeout): workerLockTimeoutFactor
// times the median of 9 uncontended fetch+ack cycles, rounded up to whole
// seconds (duroxide-pg renews in whole seconds), at least 2 s so that an
// activity renewed every renewal.Interval(T) (1 s) can outlast it.
// Everything else scales with T (workerTimes): activities run up to T/20,
// one in 8 runs long, 0.6-0.8 T, and is renewed while it runs; the
// runtimes' clocks are spread over [-1.5 T, +0.3 T].
//
// Why the skew, and what it does to the sessions: docs/BENCH.md, "The
// repros' settings".
func WorkerDefaults() WorkerConfig {
	c := defaultsOf[WorkerConfig]()
	c.Tagged, c.Refill, c.WatchLocks = true, true, true
	return c
}

// settings are the worker repro's settings, bound to c: each one's
// default, least value and flag. A lock timeout of 0 is calibrated.
func (c *WorkerConfig) settings() *settings.List {
	l := settings.New("worker: ")
	l.Int(&c.Runtimes, "worker-runtimes", 4, 1).Flag("worker-runtimes", "worker: simulated runtimes, each with its own clock")
	l.Int(&c.Slots, "worker-slots", 4, 1).Flag("worker-slots", "worker: worker slots per runtime, each with its own connection")
	l.Duration(&c.Duration, "worker-duration", 10*time.Second, time.Nanosecond).Flag("worker-duration", "worker: run time per version")
	l.Duration(&c.LockTimeout, "worker-lock-timeout", 0, 0).
		Flag("worker-lock-timeout", fmt.Sprintf("worker: worker lock timeout, whole seconds (0: calibrated, at least %v)", WorkerMinLockTimeout)).
		OnSet(func() { c.CalibrateLockTimeout = c.LockTimeout == 0 })
	l.Duration(&c.PollInterval, "poll interval", 100*time.Millisecond, 0)
	l.Int(&c.Items, "items", 400, 0)
	l.Int(&c.Sessions, "sessions", 8, 0)
	l.Int(&c.LongEvery, "long every", 8, 0)
	l.After(func() { c.CalibrateLockTimeout = c.LockTimeout == 0 })
	return l
}

// Register adds the worker repro's flags to fs, bound to c, its values as
// their defaults.
func (c *WorkerConfig) Register(fs *flag.FlagSet) { c.settings().Register(fs) }

// WorkerConfig is the worker scenario: the workers' settings, and whether
// their lock timeout is measured on the machine before the run.
type WorkerConfig struct {
	worker.Config
	// CalibrateLockTimeout sets the lock timeout to workerLockTimeoutFactor
	// x the median uncontended fetch+ack cycle, in whole seconds, at least
	// WorkerMinLockTimeout, measured on the lowest version's schema before
	// the first run. LockTimeout must then be 0.
	CalibrateLockTimeout bool
}

// CheckSettings rejects settings the worker repro cannot run, before
// anything connects: a runtime and a slot at least, a positive duration,
// and a lock timeout of 0 (calibrated) or whole seconds (duroxide-pg
// sends seconds).
func (c WorkerConfig) CheckSettings() error {
	if err := c.settings().Check(); err != nil {
		return err
	}
	if c.LockTimeout%time.Second != 0 {
		return fmt.Errorf("worker: worker-lock-timeout %v: 0 or whole seconds", c.LockTimeout)
	}
	return nil
}

// workerShort is WorkerDefaults cut to 5 s per version, for the test suite.
func workerShort() WorkerConfig {
	c := WorkerDefaults()
	c.Duration = 5 * time.Second
	return c
}

// workerTimes fills the zero activity times and skews of cfg in
// proportion to its lock timeout (see WorkerDefaults).
func workerTimes(cfg worker.Config) worker.Config {
	t := cfg.LockTimeout
	set := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	set(&cfg.ShortActivity, t/20)
	set(&cfg.LongActivityMin, t*6/10)
	set(&cfg.LongActivityMax, t*8/10)
	set(&cfg.SkewBehind, t*3/2)
	set(&cfg.SkewAhead, t*3/10)
	return cfg
}

// workerSchemas are the schemas prepareWorker migrates, by version:
// worker_vN for each of WorkerVersions.
func workerSchemas() (map[int64]string, error) {
	bug, fix, err := WorkerVersions()
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	return schemasOf("worker", bug, fix), nil
}

// prepareWorker migrates workerSchemas in the database of src, each to its
// version. It returns the map runWorker takes.
func prepareWorker(ctx context.Context, src *dbconn.Source) (map[int64]string, error) {
	schemas, err := workerSchemas()
	if err != nil {
		return nil, err
	}
	return prepare(ctx, src, "worker", schemas)
}

// WorkerSettings echoes the scenario's settings in readable units.
type WorkerSettings struct {
	Runtimes             int     `json:"runtimes"`
	Slots                int     `json:"slots_per_runtime"`
	Items                int     `json:"backlog_items"`
	Sessions             int     `json:"sessions"`
	Tagged               bool    `json:"tagged"`
	LockTimeoutMs        int64   `json:"lock_timeout_ms"`
	SessionLockTimeoutMs int64   `json:"session_lock_timeout_ms"`
	ShortActivityMs      int64   `json:"short_activity_max_ms"`
	LongEvery            int     `json:"long_every"`
	LongActivityMinMs    int64   `json:"long_activity_min_ms"`
	LongActivityMaxMs    int64   `json:"long_activity_max_ms"`
	SkewBehindMs         int64   `json:"skew_behind_ms"`
	SkewAheadMs          int64   `json:"skew_ahead_ms"`
	DurationS            float64 `json:"duration_s"`
}

func workerSettings(c worker.Config) WorkerSettings {
	return WorkerSettings{Runtimes: c.Runtimes, Slots: c.Slots, Items: c.Items, Sessions: c.Sessions, Tagged: c.Tagged,
		LockTimeoutMs: c.LockTimeout.Milliseconds(), SessionLockTimeoutMs: c.SessionLockTimeout.Milliseconds(),
		ShortActivityMs: c.ShortActivity.Milliseconds(), LongEvery: c.LongEvery,
		LongActivityMinMs: c.LongActivityMin.Milliseconds(), LongActivityMaxMs: c.LongActivityMax.Milliseconds(),
		SkewBehindMs: c.SkewBehind.Milliseconds(), SkewAheadMs: c.SkewAhead.Milliseconds(), DurationS: c.Duration.Seconds()}
}

// WorkerCalibration is the measurement behind a calibrated lock timeout.
type WorkerCalibration struct {
	Schema        string  `json:"schema"`
	Samples       int     `json:"samples"`
	CycleMs       float64 `json:"cycle_ms"`
	LockTimeoutMs int64   `json:"lock_timeout_ms"`
}

// calibrateWorker measures the median of 9 uncontended fetch+ack cycles on
// schema and derives the lock timeout (see WorkerDefaults).
func calibrateWorker(ctx context.Context, src *dbconn.Source, schema string) (WorkerCalibration, error) {
	const samples = 9
	lat, err := worker.MeasureCycle(ctx, src, schema, samples)
	if err != nil {
		return WorkerCalibration{}, fmt.Errorf("worker: calibrate: %w", err)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	median := lat[samples/2]
	t := workerLockTimeoutFactor * median
	t = ((t + time.Second - 1) / time.Second) * time.Second
	t = min(max(t, WorkerMinLockTimeout), workerMaxLockTimeout)
	return WorkerCalibration{Schema: schema, Samples: samples, CycleMs: float64(median.Microseconds()) / 1000,
		LockTimeoutMs: t.Milliseconds()}, nil
}

// workerRun is the worker scenario at one schema version; its
// Histogram is of the remaining lease at return by the database clock.
type workerRun = SchemaRun[worker.Summary, worker.Event]

// WorkerVerdict says whether the runs show the bug before the fix and its
// absence after.
type WorkerVerdict = Verdict

// WorkerResult is what runWorker returns; it serialises to stable
// snake_case JSON.
type WorkerResult = Result[WorkerSettings, WorkerCalibration, worker.Summary, worker.Event, WorkerVerdict]

// runWorker runs the worker scenario cfg (Schema is ignored) against each
// schema of schemas (version -> schema, migrated: prepareWorker), in
// ascending version order, and judges the runs. With
// cfg.CalibrateLockTimeout the lock timeout is calibrated first; zero
// activity times and skews then scale with the timeout (workerTimes), and
// the other zero fields take worker's defaults, applied here once.
// progress, when not nil, receives one line per step.
func runWorker(ctx context.Context, src *dbconn.Source, schemas map[int64]string, cfg WorkerConfig, progress func(string)) (WorkerResult, error) {
	progress = quiet(progress)
	versions, err := checkSchemas(ctx, src, schemas, "worker", "WorkerRepro")
	if err != nil {
		return WorkerResult{}, err
	}
	res := WorkerResult{}
	if cfg.CalibrateLockTimeout {
		if cfg.LockTimeout != 0 {
			return res, fmt.Errorf("worker: LockTimeout %v with CalibrateLockTimeout: give one", cfg.LockTimeout)
		}
		c, err := calibrateWorker(ctx, src, schemas[versions[0]])
		if err != nil {
			return res, err
		}
		res.Calibration = &c
		cfg.LockTimeout = time.Duration(c.LockTimeoutMs) * time.Millisecond
		progress(fmt.Sprintf("worker calibration: one uncontended fetch+ack cycle takes %.1f ms (median of %d); lock timeout %d x that, in whole seconds, at least %v: %v",
			c.CycleMs, c.Samples, workerLockTimeoutFactor, WorkerMinLockTimeout, cfg.LockTimeout))
	}
	// Checked once here, on the first version's schema; each run sets its own.
	cfg.Schema = schemas[versions[0]]
	wcfg := workerTimes(cfg.WithDefaults())
	if err := wcfg.Validate(); err != nil {
		return res, err
	}
	res.Settings = workerSettings(wcfg)
	res.Runs, err = runEach(versions, schemas, func(v int64, schema string) (workerRun, error) {
		return runWorkerVersion(ctx, src, v, schema, wcfg, progress)
	})
	if err != nil {
		return res, err
	}
	shareHistogramAxis(res.Runs, wcfg.LockTimeout.Milliseconds(), worker.Remaining)
	res.Verdict = judgeWorker(res.Runs, versions[len(versions)-1])
	return res, nil
}

func runWorkerVersion(ctx context.Context, src *dbconn.Source, version int64, schema string, cfg worker.Config, progress func(string)) (workerRun, error) {
	cfg.Schema = schema
	run := workerRun{Version: version, Schema: schema}
	seed, err := worker.Seed(ctx, src, cfg)
	if err != nil {
		return run, fmt.Errorf("worker v%d: %w", version, err)
	}
	progress(fmt.Sprintf("worker v%d: %d runtimes x %d slots, %d items over %d sessions, lock timeout %v, clocks %v..+%v, for %v",
		version, cfg.Runtimes, cfg.Slots, cfg.Items, cfg.Sessions, cfg.LockTimeout, -cfg.SkewBehind, cfg.SkewAhead, cfg.Duration))
	log, err := worker.Run(ctx, src, cfg)
	if err != nil {
		return run, fmt.Errorf("worker v%d: %w", version, err)
	}
	run.Events = log.Events()
	run.Summary = worker.Summarize(run.Events, log.Elapsed())
	pending, err := worker.PendingItems(ctx, src, schema)
	if err != nil {
		return run, fmt.Errorf("worker v%d: %w", version, err)
	}
	run.Conservation = conservation(worker.Conservation(seed.Items, run.Events, pending))
	s := run.Summary
	progress(fmt.Sprintf("worker v%d: %d leases, %d dead at return, %d lost in delivery, %d refused acks (%d while valid), %d blocked fetches (max %d ms), %d delivered twice, %d completed",
		version, s.Fetches, s.DeadAtReturn, s.LostInDelivery, s.RefusedAcks, s.RefusedWhileValidAcks, s.BlockedFetches, s.MaxBlockedMs, s.DeliveredTwice, s.Completed))
	return run, nil
}

// judgeWorker applies the verdict criteria. A version below the fix must
// show the bug: at least minWorkerBugLeases leases, and at least one
// ack_worker refused or one fetch blocked on a session row. The fix must be
// clean: at least minWorkerFixLeases leases, no ack refused while its
// lease was valid, no blocked fetch, no lease dead at return, no item
// delivered twice, every item completed exactly once or still queued. An
// ack refused after its lease was lost, and a lease taken over between
// the return and its read (a starved worker's delivery), are the load's,
// not the function's: reported, not judged. Conservation is advisory below
// the fix, the newest version run.
func judgeWorker(runs []workerRun, fix int64) WorkerVerdict {
	j := newJudgement()
	for _, r := range runs {
		s := r.Summary
		rl := versionRole(r.Version, fix)
		add := j.run(rl, r.Version, r.Side)
		if rl == bugRole {
			add("leases returned", fmt.Sprintf(">= %d", minWorkerBugLeases), fmt.Sprint(s.Fetches), s.Fetches >= minWorkerBugLeases, false)
			add("refused ack_worker calls or blocked session fetches", ">= 1",
				fmt.Sprintf("%d refused, %d blocked", s.RefusedAcks, s.BlockedFetches), s.RefusedAcks+s.BlockedFetches >= 1, false)
			add("leases dead at return (advisory)", ">= 1", fmt.Sprintf("%d of %d", s.DeadAtReturn, s.Fetches), s.DeadAtReturn >= 1, true)
			add("items conserved (advisory)", "ok", r.Conservation, r.Conservation == "ok", true)
			continue
		}
		add("leases returned", fmt.Sprintf(">= %d", minWorkerFixLeases), fmt.Sprint(s.Fetches), s.Fetches >= minWorkerFixLeases, false)
		add("refused ack_worker calls while the lease was valid", "0",
			fmt.Sprintf("%d (of %d refused)", s.RefusedWhileValidAcks, s.RefusedAcks), s.RefusedWhileValidAcks == 0, false)
		add("refused ack_worker calls after the lease was lost (reported, not judged)", "-",
			fmt.Sprint(s.RefusedAcks-s.RefusedWhileValidAcks), true, true)
		add("blocked session fetches", "0", fmt.Sprintf("%d (max %d ms)", s.BlockedFetches, s.MaxBlockedMs), s.BlockedFetches == 0, false)
		add("leases dead at return", "0", fmt.Sprintf("%d of %d", s.DeadAtReturn, s.Fetches), s.DeadAtReturn == 0, false)
		add("leases taken over in their delivery (reported, not judged)", "-", fmt.Sprint(s.LostInDelivery), true, true)
		add("items delivered twice", "0", fmt.Sprint(s.DeliveredTwice), s.DeliveredTwice == 0, false)
		add("items conserved", "ok", r.Conservation, r.Conservation == "ok", false)
	}
	return j.verdict()
}

// workerRows are the rows of the worker scenario's side-by-side table.
func workerRows() []rowDef[worker.Summary] {
	return []rowDef[worker.Summary]{
		{"fetches returning a lease", func(s worker.Summary) string {
			return fmt.Sprintf("%d (of %d calls; %d of a session)", s.Fetches, s.FetchCalls, s.SessionFetches)
		}},
		{"dead at return (database clock)", func(s worker.Summary) string {
			return fmt.Sprintf("%d (%.1f%%)", s.DeadAtReturn, s.DeadAtReturnPct)
		}},
		{"taken over in delivery", func(s worker.Summary) string { return fmt.Sprint(s.LostInDelivery) }},
		{"refused ack_worker calls (lease valid)", func(s worker.Summary) string {
			return fmt.Sprintf("%d of %d (%d)", s.RefusedAcks, s.Acks, s.RefusedWhileValidAcks)
		}},
		{"blocked session fetches (max)", func(s worker.Summary) string { return countAndMs(s.BlockedFetches, s.MaxBlockedMs) }},
		{"items completed", func(s worker.Summary) string {
			return fmt.Sprintf("%d (%.1f/s)", s.Completed, s.CompletedPerS)
		}},
		{"items delivered twice", func(s worker.Summary) string { return fmt.Sprint(s.DeliveredTwice) }},
		{"remaining lease p1 / p50 / p99", func(s worker.Summary) string {
			if s.RemainingSamples == 0 {
				return "-"
			}
			return fmt.Sprintf("%d / %d / %d ms", s.RemainingP1Ms, s.RemainingP50Ms, s.RemainingP99Ms)
		}},
		{"item renewals (refused)", func(s worker.Summary) string { return fmt.Sprintf("%d (%d)", s.Renewals, s.RenewalsRefused) }},
		{"fetch latency p50 / p99", func(s worker.Summary) string {
			return fmt.Sprintf("%.1f / %.1f ms", s.FetchP50Ms, s.FetchP99Ms)
		}},
		{"errors", func(s worker.Summary) string {
			if s.OtherErrors == 0 {
				return "0"
			}
			return fmt.Sprintf("%d (%s)", s.OtherErrors, mdCell(s.FirstError))
		}},
	}
}

// printWorkerTable writes the side-by-side table of res to w, then the
// criteria that failed.
func printWorkerTable(w io.Writer, res WorkerResult) error {
	header, rows := sideBySide(res.Runs, workerRows())
	s := res.Settings
	lock := fmt.Sprintf("lock timeout %d ms", s.LockTimeoutMs)
	if c := res.Calibration; c != nil {
		lock += fmt.Sprintf(" (uncontended cycle %.1f ms)", c.CycleMs)
	}
	bug, fix := versionsRun(res.Runs)
	err := printSideBySide(w, header, rows, res.Verdict, runLabel(bug, ""), runLabel(fix, ""),
		fmt.Sprintf("%d runtimes x %d slots, %d items, %d sessions, %s, clocks -%d..+%d ms, %.0f s per version",
			s.Runtimes, s.Slots, s.Items, s.Sessions, lock, s.SkewBehindMs, s.SkewAheadMs, s.DurationS))
	if err != nil {
		return err
	}
	for _, c := range res.Verdict.Checks {
		if !c.Pass && !c.Advisory {
			fmt.Fprintf(w, "  failed: %s %s: want %s, got %s\n", runLabel(c.Version, c.Side), c.Name, c.Want, c.Got)
		}
	}
	return nil
}

// workerMarkdown renders res as a Markdown section, with a text histogram
// of the remaining lease at return per version.
func workerMarkdown(res WorkerResult) string {
	var b strings.Builder
	s := res.Settings
	ran := fmt.Sprintf("%d runtimes of %d worker slots (one connection and session owner each; per runtime a renew_session_lock loop "+
		"and cleanup_orphaned_sessions), a backlog of %d activities kept full, over %d sessions, tagged: %v; lock timeout %d ms, "+
		"session lock timeout %d ms; activities up to %d ms, one in %d long (%d-%d ms, renewed with renew_work_item_lock); "+
		"runtime clocks spread over -%d..+%d ms; %.0f s per version.",
		s.Runtimes, s.Slots, s.Items, s.Sessions, s.Tagged, s.LockTimeoutMs, s.SessionLockTimeoutMs, s.ShortActivityMs, s.LongEvery,
		s.LongActivityMinMs, s.LongActivityMaxMs, s.SkewBehindMs, s.SkewAheadMs, s.DurationS)
	calibrated := ""
	if c := res.Calibration; c != nil {
		calibrated = fmt.Sprintf("The lock timeout was calibrated: an uncontended fetch+ack cycle took %.1f ms (median of %d, schema %s); "+
			"%d times that, in whole seconds, at least %v: %d ms.", c.CycleMs, c.Samples, c.Schema, workerLockTimeoutFactor,
			WorkerMinLockTimeout, c.LockTimeoutMs)
	}
	writeSection(&b, "Worker scenario: simulated activity workers at versions "+runList(res.Runs), ran, calibrated, res.Runs, workerRows())
	b.WriteString("\n### Remaining lease when fetch_work_item returned (locked_until − database clock)\n\n")
	for _, r := range res.Runs {
		fmt.Fprintf(&b, "v%d (%s): %d leases, %d dead at return\n\n```\n%s```\n\n", r.Version, r.Schema, r.Summary.Fetches,
			r.Summary.DeadAtReturn, TextHistogram(r.Histogram, 40))
	}
	bug, fix := versionsRun(res.Runs)
	writeVerdictMarkdown(&b, res.Verdict, runLabel(bug, ""), runLabel(fix, ""))
	return b.String()
}

// TextHistogram draws h as text, one line per bin from the first to the
// last non-empty one: its range, a bar of at most width characters ('x'
// for dead leases, '#' for live ones) and its count; leases taken over
// before they could be read come first.
func TextHistogram(h Histogram, width int) string {
	var b strings.Builder
	maxC := h.Lost
	first, last := -1, -1
	for i, bin := range h.Bins {
		maxC = max(maxC, bin.Count)
		if bin.Count > 0 {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	bar := func(n int, c string) string {
		if n == 0 || maxC == 0 {
			return ""
		}
		return strings.Repeat(c, max(1, n*width/maxC))
	}
	if h.Lost > 0 {
		fmt.Fprintf(&b, "%17s  %-*s %d\n", "taken over", width, bar(h.Lost, "x"), h.Lost)
	}
	if first < 0 {
		return b.String() + "(no lease)\n"
	}
	for _, bin := range h.Bins[first : last+1] {
		c := "#"
		if bin.HiMs <= 0 {
			c = "x"
		}
		fmt.Fprintf(&b, "%17s  %-*s %d\n", fmt.Sprintf("(%d, %d]", bin.LoMs, bin.HiMs), width, bar(bin.Count, c), bin.Count)
	}
	return b.String()
}
