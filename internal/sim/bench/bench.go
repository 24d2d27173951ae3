// Package bench measures what the pack's fix of fetch_orchestration_item
// (never waits, lease computed at return) does to speed: the schema version
// just before the fix against the fix (both read from sql/, see Versions),
// on one PostgreSQL server, both versions in the same run: every scenario
// is run round after round, before then after in each round (and the bare
// queue after them where there is one), and the report gives the
// median over the rounds of each figure and the ratio after/before.
// Numbers of different runs are never compared.
//
// Scenarios (see docs/BENCH.md):
//
//   - backlog: 200 instances, one pending message each and a 500-event
//     history, dispatchers N = 1, 4, 8, 16, lock timeout 100 ms; each ack
//     enqueues the instance's next message (steady state);
//   - hot: one instance with a 5000-event history that always has a
//     message, N = 16, lock timeout calibrated at start like the organic
//     repro's (dispatch.Calibrate: hotLockTimeoutFactor x one uncontended
//     fetch of the hot instance);
//   - queue_only: 2000 instances without history, N = 1 and 8, plus the
//     bare single-statement dequeue (bare.go) on the same tables;
//   - migrate: the wall time of Up from 0 to each of the two versions on a
//     fresh database;
//   - worker: the worker queue before and after the pack's worker fixes
//     (worker.go);
//   - scale: the cost of one fetch against the number of blocked messages
//     (K messages of instances that hold a live lease), idle dispatchers
//     polling over them, and the number of completed instances in the
//     database, before the first fetch fix and at the pack's latest
//     version (scale.go).
//
// Each dispatcher scenario has its own schema per side, seeded once
// (dispatch.Seed) and snapshotted; before every cell the schema is put back
// to that seeded state (reset), so every round of every N starts from the
// same rows whatever the previous run appended, poisoned or left locked.
package bench

import (
	"context"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/duroxide-pg/migrations/internal/packfacts"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/defaults"
	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
	"github.com/duroxide-pg/migrations/internal/sim/simconfig"
)

// Versions are the schema versions compared: the version before the pack's
// fix of fetch_orchestration_item, and that fix (read from sql/).
func Versions() (bug, fix int64, err error) { return packfacts.FetchFix() }

// WorkerVersions are the versions the worker scenario compares: the
// version before the pack's fixes of the worker queue, and the last of them
// (read from sql/).
func WorkerVersions() (bug, fix int64, err error) { return packfacts.WorkerFix() }

// Scenario names (also the JSON values).
const (
	backlog         = "backlog"
	ScenarioHot     = "hot"
	queueOnly       = "queue_only"
	ScenarioMigrate = "migrate"
	ScenarioWorker  = "worker"
	scale           = "scale"
)

// allScenarios lists every scenario in the order a round runs them.
func allScenarios() []string {
	return []string{backlog, ScenarioHot, queueOnly, ScenarioMigrate, ScenarioWorker, scale, ScenarioRuntime}
}

// Config is a benchmark run. Zero fields take Defaults' values, except the
// slices, which are taken as given when not nil.
type Config struct {
	// Rounds is how many times each cell runs per version (>= 1; the
	// harness command asks for at least 3).
	Rounds int `json:"rounds"`
	// Duration is how long one cell runs, per version and round.
	Duration time.Duration `json:"-"`
	// Scenarios to run, from allScenarios.
	Scenarios []string `json:"scenarios"`

	BacklogInstances   int           `json:"backlog_instances"`
	BacklogHistory     int           `json:"backlog_history_events"`
	BacklogDispatchers []int         `json:"backlog_dispatchers"`
	BacklogLockTimeout time.Duration `json:"-"`

	HotHistory     int `json:"hot_history_events"`
	HotDispatchers int `json:"hot_dispatchers"`
	// HotLockTimeout is the hot scenario's lock timeout, unless
	// CalibrateHotLockTimeout (the default) measures it at start, like the
	// organic repro (dispatch.Calibrate); it must then be 0.
	HotLockTimeout          time.Duration `json:"-"`
	CalibrateHotLockTimeout bool          `json:"-"`

	QueueInstances   int           `json:"queue_instances"`
	QueueDispatchers []int         `json:"queue_dispatchers"`
	QueueLockTimeout time.Duration `json:"-"`

	// WorkerDispatchers are the worker counts of the worker scenario (each
	// run without and with sessions), WorkerItems its backlog and
	// WorkerLockTimeout its lock timeout (see worker.go).
	WorkerDispatchers []int         `json:"worker_dispatchers"`
	WorkerItems       int           `json:"worker_items"`
	WorkerLockTimeout time.Duration `json:"-"`

	// The scale scenario (scale.go): ScaleBlocked are the K values (blocked
	// messages), each seeded spread over ScaleSpreadInstances leased
	// instances and all on one fan-in instance; ScaleClaimable the
	// claimable instances queued behind them for the one-row fetch;
	// ScaleCompleted the completed-instance counts, each with
	// ScaleCompletedHistory history events; ScaleCalls the fetch calls per
	// figure on one session (at least 7: calls 2-5 are the early figure,
	// 7 on the steady one); ScaleIdleDispatchers idle dispatchers poll for
	// ScaleIdleDuration at the largest K; ScaleLargeHistory is the history
	// (events of about EventBytes) of the instance whose fetch the
	// completed cells time against the small cycled one's, to split a
	// fetch's cost between history load and candidate search.
	ScaleBlocked          []int         `json:"scale_blocked"`
	ScaleSpreadInstances  int           `json:"scale_spread_instances"`
	ScaleClaimable        int           `json:"scale_claimable"`
	ScaleCompleted        []int         `json:"scale_completed"`
	ScaleCompletedHistory int           `json:"scale_completed_history_events"`
	ScaleCalls            int           `json:"scale_calls"`
	ScaleIdleDispatchers  int           `json:"scale_idle_dispatchers"`
	ScaleIdleDuration     time.Duration `json:"-"`
	ScaleLargeHistory     int           `json:"scale_large_history_events"`

	// The runtime scenario (runtime.go): the real runtime at each
	// orchestration concurrency of RuntimeOrchestrationConcurrency, with the
	// worker concurrency and the orchestration count at the same index;
	// then one fan-out/fan-in of RuntimeFanIn activities at the last
	// concurrency; first, the uncontended cell: RuntimeUncontended
	// orchestrations at 1/1, each started once the one before has
	// completed. RuntimeWait bounds one run.
	RuntimeOrchestrationConcurrency []int         `json:"runtime_orchestration_concurrency"`
	RuntimeWorkerConcurrency        []int         `json:"runtime_worker_concurrency"`
	RuntimeOrchestrations           []int         `json:"runtime_orchestrations"`
	RuntimeFanIn                    int           `json:"runtime_fan_in"`
	RuntimeUncontended              int           `json:"runtime_uncontended"`
	RuntimeWait                     time.Duration `json:"-"`

	// EventBytes is the approximate size of one seeded history event.
	EventBytes int `json:"event_bytes"`
	// PollInterval is the dispatchers' (and the bare workers') minimum
	// poll interval.
	PollInterval time.Duration `json:"-"`
}

// Defaults is the full benchmark (`harness-lab bench`): 3 rounds of 2.5 s per
// cell, every scenario as the issues set it. On the 2-core development
// machine the whole run takes about 9 minutes, 5 of them the scale
// scenario (seeding 100k blocked messages and 100k completed instances
// with their histories per version, and the slow fetches it measures; see
// docs/BENCH.md).
func Defaults() Config {
	return Config{
		Rounds:                          3,
		Duration:                        2500 * time.Millisecond,
		Scenarios:                       allScenarios(),
		BacklogInstances:                200,
		BacklogHistory:                  500,
		BacklogDispatchers:              []int{1, 4, 8, 16},
		BacklogLockTimeout:              100 * time.Millisecond,
		HotHistory:                      5000,
		HotDispatchers:                  16,
		CalibrateHotLockTimeout:         true,
		QueueInstances:                  2000,
		QueueDispatchers:                []int{1, 8},
		QueueLockTimeout:                100 * time.Millisecond,
		WorkerDispatchers:               []int{1, 8},
		WorkerItems:                     500,
		WorkerLockTimeout:               defaultWorkerLockTimeout,
		ScaleBlocked:                    []int{1000, 10000, 100000},
		ScaleSpreadInstances:            500,
		ScaleClaimable:                  3,
		ScaleCompleted:                  []int{0, 10000, 100000},
		ScaleCompletedHistory:           10,
		ScaleCalls:                      12,
		ScaleIdleDispatchers:            32,
		ScaleIdleDuration:               3 * time.Second,
		ScaleLargeHistory:               500,
		RuntimeOrchestrationConcurrency: []int{1, 4, 16},
		RuntimeWorkerConcurrency:        []int{1, 8, 16},
		RuntimeOrchestrations:           []int{100, 200, 400},
		RuntimeFanIn:                    500,
		RuntimeUncontended:              60,
		RuntimeWait:                     3 * time.Minute,
		EventBytes:                      250,
		PollInterval:                    dispatch.DefaultPollInterval,
	}
}

// WithDefaults fills the unset fields from Defaults: a count or a
// duration takes the default when it is 0 (a negative one stays, for
// Validate to reject), a list when it is nil (an empty list is taken as
// given). The hot lock timeout is unset when neither HotLockTimeout nor
// CalibrateHotLockTimeout is; it then takes Defaults' calibration.
// Every field is named here once (TestWithDefaultsFillsEveryZeroFieldAndKeepsGivenLists checks
// that a zero Config becomes Defaults()).
func (c Config) WithDefaults() Config {
	d := Defaults()
	defaults.Set(&c.Rounds, d.Rounds)
	defaults.Set(&c.Duration, d.Duration)
	list(&c.Scenarios, d.Scenarios)
	defaults.Set(&c.BacklogInstances, d.BacklogInstances)
	defaults.Set(&c.BacklogHistory, d.BacklogHistory)
	list(&c.BacklogDispatchers, d.BacklogDispatchers)
	defaults.Set(&c.BacklogLockTimeout, d.BacklogLockTimeout)
	defaults.Set(&c.HotHistory, d.HotHistory)
	defaults.Set(&c.HotDispatchers, d.HotDispatchers)
	if c.HotLockTimeout == 0 {
		c.CalibrateHotLockTimeout = true
	}
	defaults.Set(&c.QueueInstances, d.QueueInstances)
	list(&c.QueueDispatchers, d.QueueDispatchers)
	defaults.Set(&c.QueueLockTimeout, d.QueueLockTimeout)
	list(&c.WorkerDispatchers, d.WorkerDispatchers)
	defaults.Set(&c.WorkerItems, d.WorkerItems)
	defaults.Set(&c.WorkerLockTimeout, d.WorkerLockTimeout)
	list(&c.ScaleBlocked, d.ScaleBlocked)
	defaults.Set(&c.ScaleSpreadInstances, d.ScaleSpreadInstances)
	defaults.Set(&c.ScaleClaimable, d.ScaleClaimable)
	list(&c.ScaleCompleted, d.ScaleCompleted)
	defaults.Set(&c.ScaleCompletedHistory, d.ScaleCompletedHistory)
	defaults.Set(&c.ScaleCalls, d.ScaleCalls)
	defaults.Set(&c.ScaleIdleDispatchers, d.ScaleIdleDispatchers)
	defaults.Set(&c.ScaleIdleDuration, d.ScaleIdleDuration)
	defaults.Set(&c.ScaleLargeHistory, d.ScaleLargeHistory)
	list(&c.RuntimeOrchestrationConcurrency, d.RuntimeOrchestrationConcurrency)
	list(&c.RuntimeWorkerConcurrency, d.RuntimeWorkerConcurrency)
	list(&c.RuntimeOrchestrations, d.RuntimeOrchestrations)
	defaults.Set(&c.RuntimeFanIn, d.RuntimeFanIn)
	defaults.Set(&c.RuntimeUncontended, d.RuntimeUncontended)
	defaults.Set(&c.RuntimeWait, d.RuntimeWait)
	defaults.Set(&c.EventBytes, d.EventBytes)
	defaults.Set(&c.PollInterval, d.PollInterval)
	return c
}

// list sets *field to def when it is nil (an empty list is taken as given).
func list[T any](field *[]T, def []T) {
	if *field == nil {
		*field = def
	}
}

// negativeField names the first count or duration of c below 0 ("" when
// none is).
func (c Config) negativeField() string {
	v := reflect.ValueOf(c)
	for i := range v.NumField() {
		if f := v.Field(i); (f.Kind() == reflect.Int || f.Kind() == reflect.Int64) && f.Int() < 0 {
			return v.Type().Field(i).Name
		}
	}
	return ""
}

// MinDuration and MaxDuration bound a cell's duration (and the scale
// scenario's idle polling).
const (
	MinDuration = 100 * time.Millisecond
	MaxDuration = 10 * time.Minute
)

// Validate rejects a config that cannot run. It is the one check of a
// config: the lab command parses its flags into one and calls it (a
// zero field is refused here; Run fills zero fields from Defaults
// first).
func (c Config) Validate() error {
	for _, s := range c.Scenarios {
		if !validScenario(s) {
			return fmt.Errorf("bench: unknown scenario %q (have %s)", s, strings.Join(allScenarios(), ", "))
		}
	}
	for _, n := range append(append(append([]int(nil), c.BacklogDispatchers...), c.QueueDispatchers...), c.WorkerDispatchers...) {
		if n < 1 {
			return fmt.Errorf("bench: dispatcher counts must be >= 1, got %d", n)
		}
	}
	if c.Duration < MinDuration || c.Duration > MaxDuration {
		return fmt.Errorf("bench: a cell of %v: give between %v and %v, e.g. 2.5s", c.Duration, MinDuration, MaxDuration)
	}
	if c.ScaleCalls < steadyFirstCall || c.ScaleIdleDispatchers < 1 || c.ScaleIdleDuration < MinDuration {
		return fmt.Errorf("bench: scale: %d calls per figure (at least %d, so that the steady-state plan is measured), %d idle dispatchers (at least 1) for %v (at least %v)",
			c.ScaleCalls, steadyFirstCall, c.ScaleIdleDispatchers, c.ScaleIdleDuration, MinDuration)
	}
	switch {
	case c.CalibrateHotLockTimeout && c.HotLockTimeout != 0:
		return fmt.Errorf("bench: HotLockTimeout %v with CalibrateHotLockTimeout: give one", c.HotLockTimeout)
	case c.has(ScenarioHot) && !c.CalibrateHotLockTimeout && c.HotLockTimeout < time.Millisecond:
		return fmt.Errorf("bench: HotLockTimeout %v: give at least 1ms, or CalibrateHotLockTimeout", c.HotLockTimeout)
	}
	if c.has(ScenarioRuntime) {
		if err := c.validateRuntime(); err != nil {
			return err
		}
	}
	if c.has(scale) {
		if err := c.validateScale(); err != nil {
			return err
		}
	}
	if f := c.negativeField(); f != "" {
		return fmt.Errorf("bench: Config.%s must not be negative", f)
	}
	return nil
}

func validScenario(s string) bool { return slices.Contains(allScenarios(), s) }

func (c Config) has(s string) bool { return slices.Contains(c.Scenarios, s) }

// Cell is one scenario at one dispatcher count: its settings, every round
// of every side, and the figures (medians, ratios).
type Cell struct {
	Scenario      string  `json:"scenario"`
	Dispatchers   int     `json:"dispatchers,omitempty"`
	Instances     int     `json:"instances,omitempty"`
	HistoryEvents int     `json:"history_events"`
	LockTimeoutMs int64   `json:"lock_timeout_ms,omitempty"`
	DurationS     float64 `json:"duration_s,omitempty"`
	// Comparison holds the versions of the two sides (for a migrate cell,
	// the version Up goes to on each side), the rounds and the figures.
	Comparison[Sample]
}

// Name is the cell's short name ("backlog N=8").
func (c *Cell) Name() string {
	if c.Scenario == ScenarioMigrate {
		return "migrate Up 0->N"
	}
	return fmt.Sprintf("%s N=%d", c.Scenario, c.Dispatchers)
}

// ServerInfo says what the run ran on.
type ServerInfo struct {
	Backend string `json:"backend"`
	Version string `json:"server_version"`
	// CPU is how the server CPU figures were read, or "n/a (why)".
	CPU string `json:"cpu_source"`
	// CPUs is the client machine's CPU count (runtime.NumCPU).
	CPUs int `json:"cpus"`
}

// Result is a whole run; it serialises to stable snake_case JSON.
type Result struct {
	Settings  Settings   `json:"settings"`
	Server    ServerInfo `json:"server"`
	StartedAt time.Time  `json:"started_at"`
	TotalS    float64    `json:"total_s"`
	Cells     []Cell     `json:"cells"`
	// Worker holds the worker scenario's cells, which compare other
	// versions (WorkerVersions) than the cells above.
	Worker []WorkerCell `json:"worker_cells,omitempty"`
	// Scale holds the scale scenario's cells, which compare the version
	// before the first fetch fix with the pack's latest (ScaleVersions).
	Scale []ScaleCell `json:"scale_cells,omitempty"`
	// Runtime holds the runtime scenario: the real runtime on upstream's
	// latest schema, the pack's previous fix and its latest.
	Runtime *RuntimeBench `json:"runtime,omitempty"`
	// HotCalibration is the measurement behind the hot scenario's lock
	// timeout, when it was calibrated (Config.CalibrateHotLockTimeout).
	HotCalibration *dispatch.Calibration `json:"hot_calibration,omitempty"`
	Targets        []Target              `json:"targets"`
}

// Settings echoes the config in readable units.
type Settings struct {
	Config
	DurationS            float64 `json:"cell_duration_s"`
	BacklogLockTimeoutMs int64   `json:"backlog_lock_timeout_ms"`
	HotLockTimeoutMs     int64   `json:"hot_lock_timeout_ms"`
	QueueLockTimeoutMs   int64   `json:"queue_lock_timeout_ms"`
	PollIntervalMs       int64   `json:"poll_interval_ms"`
	ScaleIdleDurationS   float64 `json:"scale_idle_duration_s"`
}

func settingsOf(c Config) Settings {
	return Settings{Config: c, DurationS: c.Duration.Seconds(),
		BacklogLockTimeoutMs: c.BacklogLockTimeout.Milliseconds(), HotLockTimeoutMs: c.HotLockTimeout.Milliseconds(),
		QueueLockTimeoutMs: c.QueueLockTimeout.Milliseconds(), PollIntervalMs: c.PollInterval.Milliseconds(),
		ScaleIdleDurationS: c.ScaleIdleDuration.Seconds()}
}

// Cell returns the cell of scenario at n dispatchers (n is ignored for
// migrate), or nil.
func (r *Result) Cell(scenario string, n int) *Cell {
	for i := range r.Cells {
		c := &r.Cells[i]
		if c.Scenario == scenario && (scenario == ScenarioMigrate || c.Dispatchers == n) {
			return c
		}
	}
	return nil
}

// Progress is one step of a run, reported before the step starts.
type Progress struct {
	Step, Steps int
	Round       int
	Rounds      int
	Label       string
	Elapsed     time.Duration
}

// Steps is the number of cell runs a config makes.
func (c Config) Steps() int {
	c = c.WithDefaults()
	per := 0
	if c.has(backlog) {
		per += 2 * len(c.BacklogDispatchers)
	}
	if c.has(ScenarioHot) {
		per += 2
	}
	if c.has(queueOnly) {
		per += 3 * len(c.QueueDispatchers)
	}
	if c.has(ScenarioMigrate) {
		per += 2
	}
	if c.has(ScenarioWorker) {
		per += c.workerSteps()
	}
	if c.has(scale) {
		per += 2 * len(scaleCells(c, 0, 0))
	}
	if c.has(ScenarioRuntime) {
		per += len(runtimeSides()) * len(runtimeCells(c))
	}
	return per * c.Rounds
}

// prepared is a seeded schema and what reset needs.
type prepared struct {
	schema string
	// history is the number of seeded events per instance (0: none).
	history int
}

// Databases is the server a run works on: it creates the run's throwaway
// databases, opens connections to them and drops them again (a
// *pgtest.Server is one).
type Databases interface {
	CreateDatabase(ctx context.Context, prefix, template string) (string, error)
	DropDatabase(ctx context.Context, name string) error
	Source(name string) (*dbconn.Source, error)
}

// Run runs the benchmark cfg on srv: it creates a database (dropped at the
// end), migrates and seeds one schema per scenario and version, then runs
// the rounds. progress, when not nil, is called before every step. The
// caller fills Result.Server.Backend, which srv does not know.
func Run(ctx context.Context, srv Databases, cfg Config, progress func(Progress)) (Result, error) {
	cfg, err := simconfig.Ready(cfg)
	if err != nil {
		return Result{}, err
	}
	if progress == nil {
		progress = func(Progress) {}
	}
	start := time.Now()
	res := Result{Settings: settingsOf(cfg), StartedAt: start.UTC().Truncate(time.Second),
		Server: ServerInfo{CPUs: runtime.NumCPU()}}

	db, err := srv.CreateDatabase(ctx, "harness_bench_", "")
	if err != nil {
		return res, err
	}
	defer func() { _ = srv.DropDatabase(context.Background(), db) }()
	src, err := srv.Source(db)
	if err != nil {
		return res, err
	}
	res.Server.Version = serverVersion(ctx, src)
	cpu, cpuSource := newServerCPU(ctx, src)
	res.Server.CPU = cpuSource

	step := 0
	note := func(round int, label string) {
		step++
		progress(Progress{Step: step, Steps: cfg.Steps(), Round: round, Rounds: cfg.Rounds, Label: label, Elapsed: time.Since(start)})
	}

	// Schemas: one per dispatcher scenario and version, plus the bare queue's.
	type key struct {
		scenario string
		side     string
	}
	schemas := map[key]prepared{}
	prep := func(scenario, side string, version int64, dcfg dispatch.Config, dropHistory bool) error {
		schema := fmt.Sprintf("bench_%s_%s", scenario, side)
		if err := migrateSchema(ctx, src, schema, version); err != nil {
			return err
		}
		dcfg.Schema = schema
		if _, err := dispatch.Seed(ctx, src, dcfg); err != nil {
			return fmt.Errorf("bench: seed %s: %w", schema, err)
		}
		p := prepared{schema: schema, history: dcfg.HistoryEvents}
		if dropHistory {
			p.history = 0
		}
		if err := snapshot(ctx, src, p, dropHistory); err != nil {
			return err
		}
		schemas[key{scenario, side}] = p
		return nil
	}
	bugVersion, fixVersion, err := Versions()
	if err != nil && (cfg.has(backlog) || cfg.has(ScenarioHot) || cfg.has(queueOnly) || cfg.has(ScenarioMigrate)) {
		return res, err
	}
	versions := map[string]int64{sideBefore: bugVersion, sideAfter: fixVersion}
	progress(Progress{Steps: cfg.Steps(), Rounds: cfg.Rounds, Label: "migrating and seeding the schemas", Elapsed: time.Since(start)})
	for _, side := range []string{sideBefore, sideAfter} {
		if cfg.has(backlog) {
			if err := prep(backlog, side, versions[side], backlogConfig(cfg, 1), false); err != nil {
				return res, err
			}
		}
		if cfg.has(ScenarioHot) {
			if err := prep(ScenarioHot, side, versions[side], hotConfig(cfg), false); err != nil {
				return res, err
			}
		}
		if cfg.has(queueOnly) {
			if err := prep(queueOnly, side, versions[side], queueConfig(cfg, 1), true); err != nil {
				return res, err
			}
		}
	}
	if cfg.has(queueOnly) {
		if err := prep(queueOnly, sideBare, fixVersion, queueConfig(cfg, 1), true); err != nil {
			return res, err
		}
	}

	if cfg.has(ScenarioHot) && cfg.CalibrateHotLockTimeout {
		progress(Progress{Steps: cfg.Steps(), Rounds: cfg.Rounds, Label: "calibrating the hot lock timeout", Elapsed: time.Since(start)})
		cal, err := calibrateHot(ctx, src, schemas[key{ScenarioHot, sideBefore}], cfg)
		if err != nil {
			return res, err
		}
		res.HotCalibration = &cal
		cfg.HotLockTimeout = cal.LockTimeout
		res.Settings.HotLockTimeoutMs = cal.LockTimeoutMs
	}

	var wb *workerBench
	if cfg.has(ScenarioWorker) {
		if wb, err = newWorkerBench(ctx, src, cfg); err != nil {
			return res, err
		}
	}

	// The cells, in report order.
	cellOf := map[string]*Cell{}
	res.Cells = cells(cfg, bugVersion, fixVersion)
	for i := range res.Cells {
		cellOf[res.Cells[i].Name()] = &res.Cells[i]
	}
	dispatchCell := func(round int, scenario string, n int, dcfg dispatch.Config) error {
		c := cellOf[(&Cell{Scenario: scenario, Dispatchers: n}).Name()]
		return c.runRound(round, c.Name(), note, func(side string) (Sample, error) {
			return runDispatch(ctx, src, schemas[key{scenario, side}], dcfg, cpu)
		})
	}
	for round := 1; round <= cfg.Rounds; round++ {
		if cfg.has(backlog) {
			for _, n := range cfg.BacklogDispatchers {
				if err := dispatchCell(round, backlog, n, backlogConfig(cfg, n)); err != nil {
					return res, err
				}
			}
		}
		if cfg.has(ScenarioHot) {
			if err := dispatchCell(round, ScenarioHot, cfg.HotDispatchers, hotConfig(cfg)); err != nil {
				return res, err
			}
		}
		if cfg.has(queueOnly) {
			for _, n := range cfg.QueueDispatchers {
				if err := dispatchCell(round, queueOnly, n, queueConfig(cfg, n)); err != nil {
					return res, err
				}
				c := cellOf[(&Cell{Scenario: queueOnly, Dispatchers: n}).Name()]
				note(round, c.Name()+" bare")
				sample, err := runBareCell(ctx, src, schemas[key{queueOnly, sideBare}], n, cfg, cpu)
				if err != nil {
					return res, fmt.Errorf("bench: %s bare round %d: %w", c.Name(), round, err)
				}
				c.record(round, sideBare, sample)
			}
		}
		if cfg.has(ScenarioMigrate) {
			c := cellOf[(&Cell{Scenario: ScenarioMigrate}).Name()]
			err := c.runRound(round, c.Name(), note, func(side string) (Sample, error) {
				ms, err := timeMigration(ctx, srv, c.Version(side))
				return Sample{WallMs: fp(ms)}, err
			})
			if err != nil {
				return res, err
			}
		}
		if wb != nil {
			if err := wb.round(ctx, round, note); err != nil {
				return res, err
			}
		}
	}
	if wb != nil {
		res.Worker = wb.finish()
	}
	if cfg.has(scale) {
		if res.Scale, err = runScale(ctx, src, cfg, cpu, note); err != nil {
			return res, err
		}
	}
	if cfg.has(ScenarioRuntime) {
		if res.Runtime, err = runRuntime(ctx, src, cfg, cpu, note); err != nil {
			return res, err
		}
	}
	for i := range res.Cells {
		res.Cells[i].computeFigures()
	}
	res.Targets = append(evaluateTargets(&res), runtimeTargets(res.Runtime)...)
	res.TotalS = time.Since(start).Seconds()
	return res, nil
}

// cells are the dispatcher and migrate cells of cfg, in report order, each
// comparing versions before and after, with no round run yet.
func cells(cfg Config, before, after int64) []Cell {
	var out []Cell
	cmp := Comparison[Sample]{BeforeVersion: before, AfterVersion: after}
	dur := cfg.Duration.Seconds()
	if cfg.has(backlog) {
		for _, n := range cfg.BacklogDispatchers {
			out = append(out, Cell{Scenario: backlog, Dispatchers: n, Instances: cfg.BacklogInstances, HistoryEvents: cfg.BacklogHistory,
				LockTimeoutMs: cfg.BacklogLockTimeout.Milliseconds(), DurationS: dur, Comparison: cmp})
		}
	}
	if cfg.has(ScenarioHot) {
		out = append(out, Cell{Scenario: ScenarioHot, Dispatchers: cfg.HotDispatchers, Instances: 1, HistoryEvents: cfg.HotHistory,
			LockTimeoutMs: cfg.HotLockTimeout.Milliseconds(), DurationS: dur, Comparison: cmp})
	}
	if cfg.has(queueOnly) {
		for _, n := range cfg.QueueDispatchers {
			out = append(out, Cell{Scenario: queueOnly, Dispatchers: n, Instances: cfg.QueueInstances, HistoryEvents: 0,
				LockTimeoutMs: cfg.QueueLockTimeout.Milliseconds(), DurationS: dur, Comparison: cmp})
		}
	}
	if cfg.has(ScenarioMigrate) {
		out = append(out, Cell{Scenario: ScenarioMigrate, Comparison: cmp})
	}
	return out
}

func backlogConfig(cfg Config, n int) dispatch.Config {
	return dispatch.Config{
		Common:      simconfig.Common{LockTimeout: cfg.BacklogLockTimeout, PollInterval: cfg.PollInterval, Duration: cfg.Duration},
		Dispatchers: n, Instances: cfg.BacklogInstances, HistoryEvents: cfg.BacklogHistory, EventBytes: cfg.EventBytes}
}

func hotConfig(cfg Config) dispatch.Config {
	return dispatch.Config{
		Common:      simconfig.Common{LockTimeout: cfg.HotLockTimeout, PollInterval: cfg.PollInterval, Duration: cfg.Duration},
		Dispatchers: cfg.HotDispatchers, Instances: 1, HistoryEvents: cfg.HotHistory, EventBytes: cfg.EventBytes}
}

// queueConfig seeds one event per instance (dispatch.Seed's minimum), which
// prep then deletes: the instances run without history.
func queueConfig(cfg Config, n int) dispatch.Config {
	return dispatch.Config{
		Common:      simconfig.Common{LockTimeout: cfg.QueueLockTimeout, PollInterval: cfg.PollInterval, Duration: cfg.Duration},
		Dispatchers: n, Instances: cfg.QueueInstances, HistoryEvents: 1, EventBytes: 1}
}

func migrateSchema(ctx context.Context, src *dbconn.Source, schema string, version int64) error {
	if err := migrate.To(ctx, src.Config(), schema, version); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// timeMigration creates a fresh database, times Up 0 -> version in it
// (opening the runner included) and drops it.
func timeMigration(ctx context.Context, srv Databases, version int64) (float64, error) {
	db, err := srv.CreateDatabase(ctx, "harness_bench_migrate_", "")
	if err != nil {
		return 0, err
	}
	defer func() { _ = srv.DropDatabase(context.Background(), db) }()
	src, err := srv.Source(db)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := migrateSchema(ctx, src, migrate.DefaultSchema, version); err != nil {
		return 0, err
	}
	return float64(time.Since(start).Microseconds()) / 1000, nil
}

// snapshotTables are the tables a reset restores from their snapshot.
func snapshotTables() []string { return []string{"instances", "executions", "orchestrator_queue"} }

// emptiedTables are the tables a reset empties (before restoring the
// snapshotted ones).
func emptiedTables() []string {
	return []string{"instances", "executions", "orchestrator_queue", "worker_queue", "instance_locks", "kv_store", "sessions"}
}

// snapshot records the seeded state of p.schema (bench_snap_<table>
// tables in the same schema); dropHistory first deletes the seeded history.
func snapshot(ctx context.Context, src *dbconn.Source, p prepared, dropHistory bool) error {
	conn, err := src.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	q := func(t string) string { return pgx.Identifier{p.schema, t}.Sanitize() }
	if dropHistory {
		if _, err := conn.Exec(ctx, "DELETE FROM "+q("history")); err != nil {
			return fmt.Errorf("bench: snapshot %s: %w", p.schema, err)
		}
	}
	for _, t := range snapshotTables() {
		if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+q("bench_snap_"+t)+"; CREATE TABLE "+q("bench_snap_"+t)+
			" AS SELECT * FROM "+q(t)); err != nil {
			return fmt.Errorf("bench: snapshot %s.%s: %w", p.schema, t, err)
		}
	}
	return nil
}

// reset puts p.schema back to its seeded state: the snapshotted tables
// restored, locks, worker queue, KV and sessions emptied, history cut back
// to the seeded events, then VACUUM ANALYZE, so that dead rows of earlier
// runs do not weigh on the next.
func reset(ctx context.Context, src *dbconn.Source, p prepared) error {
	conn, err := src.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	q := func(t string) string { return pgx.Identifier{p.schema, t}.Sanitize() }
	emptied := emptiedTables()
	quoted := make([]string, len(emptied))
	for i, t := range emptied {
		quoted[i] = q(t)
	}
	stmts := []string{"BEGIN", "TRUNCATE " + strings.Join(quoted, ", ")}
	for _, t := range snapshotTables() {
		stmts = append(stmts, "INSERT INTO "+q(t)+" SELECT * FROM "+q("bench_snap_"+t))
	}
	stmts = append(stmts, fmt.Sprintf("DELETE FROM %s WHERE event_id > %d", q("history"), p.history), "COMMIT")
	if _, err := conn.Exec(ctx, strings.Join(stmts, "; ")); err != nil {
		return fmt.Errorf("bench: reset %s: %w", p.schema, err)
	}
	if _, err := conn.Exec(ctx, "VACUUM ANALYZE "+q("history")+", "+strings.Join(quoted, ", ")); err != nil {
		return fmt.Errorf("bench: vacuum %s: %w", p.schema, err)
	}
	return nil
}

func runDispatch(ctx context.Context, src *dbconn.Source, p prepared, dcfg dispatch.Config, cpu *serverCPU) (Sample, error) {
	if err := reset(ctx, src, p); err != nil {
		return Sample{}, err
	}
	dcfg.Schema = p.schema
	w := cpu.begin()
	log, err := dispatch.Run(ctx, src, dcfg)
	if err != nil {
		return Sample{}, err
	}
	cpuS := w.end()
	s := sampleFromEvents(log.Events(), log.Elapsed())
	s.setCPU(cpuS)
	return s, nil
}

func runBareCell(ctx context.Context, src *dbconn.Source, p prepared, n int, cfg Config, cpu *serverCPU) (Sample, error) {
	if err := reset(ctx, src, p); err != nil {
		return Sample{}, err
	}
	w := cpu.begin()
	s, err := runBare(ctx, src, p.schema, n, cfg.Duration, cfg.QueueLockTimeout, cfg.PollInterval)
	if err != nil {
		return Sample{}, err
	}
	s.setCPU(w.end())
	return s, nil
}

func serverVersion(ctx context.Context, src *dbconn.Source) string {
	conn, err := src.Connect(ctx)
	if err != nil {
		return "unknown"
	}
	defer conn.Close(context.Background())
	var v string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "unknown"
	}
	return v
}

// Target is one of the targets: reported, not asserted.
type Target struct {
	Name string `json:"name"`
	Want string `json:"want"`
	Got  string `json:"got"`
	Met  bool   `json:"met"`
	// Measured is false when the figures it needs were not measured (the
	// scenario did not run, or a side had no value).
	Measured bool `json:"measured"`
	// Reason says why a target was missed (or what it depends on), where
	// the figures alone do not.
	Reason string `json:"reason,omitempty"`
}

// evaluateTargets checks the targets against the medians.
func evaluateTargets(r *Result) []Target {
	if len(r.Cells) == 0 {
		// Only the worker or the scale scenario ran.
		return scaleTargets(r)
	}
	var out []Target
	ratioTarget := func(name, scenario string, n int, key string, atLeast bool, bound float64) {
		t := Target{Name: name}
		if atLeast {
			t.Want = fmt.Sprintf(">= %.2fx", bound)
		} else {
			t.Want = fmt.Sprintf("<= %.2fx", bound)
		}
		c := r.Cell(scenario, n)
		if c == nil || c.Figure(key) == nil {
			t.Got = "not measured"
			out = append(out, t)
			return
		}
		f := c.Figure(key)
		switch {
		case f.Before == nil || f.After == nil:
			t.Got = "not measured"
		case f.Ratio != nil:
			t.Measured = true
			t.Got = fmt.Sprintf("%.2fx (%s vs %s)", *f.Ratio, num(f.After), num(f.Before))
			t.Met = (atLeast && *f.Ratio >= bound) || (!atLeast && *f.Ratio <= bound)
		default: // before is 0
			t.Measured = true
			t.Got = fmt.Sprintf("unbounded (%s vs 0)", num(f.After))
			t.Met = atLeast && *f.After > 0
		}
		out = append(out, t)
	}
	if len(r.Settings.BacklogDispatchers) > 0 {
		ratioTarget("backlog N=8: cycles/s, after vs before", backlog, 8, "cycles_per_s", true, 1.5)
		ratioTarget("backlog N=8: fetch p99, after vs before", backlog, 8, "fetch_p99_ms", false, 0.5)
		ratioTarget("backlog N=1: cycles/s, after vs before", backlog, 1, "cycles_per_s", true, 0.95)
	}
	ratioTarget("hot: cycles/s, after vs before", ScenarioHot, r.Settings.HotDispatchers, "cycles_per_s", true, 20)
	hot := Target{Name: "hot: dead-on-arrival leases after the fix", Want: "0 in every round", Got: "not measured"}
	if c := r.Cell(ScenarioHot, r.Settings.HotDispatchers); c != nil {
		if m := c.maxOver(sideAfter, "dead_on_arrival"); m != nil {
			var per []string
			total := 0.0
			for _, rs := range c.Rounds {
				if rs.Side == sideAfter && rs.Sample.DeadOnArrival != nil {
					per = append(per, num(rs.Sample.DeadOnArrival))
					total += *rs.Sample.DeadOnArrival
				}
			}
			hot.Measured, hot.Met = true, *m == 0
			hot.Got = fmt.Sprintf("%s per round (%s of %s fetches)", strings.Join(per, ", "), num(&total), fetchesOf(c, sideAfter))
		}
	}
	out = append(out, hot)
	q := Target{Name: "queue_only N=1: cycles/s, after vs bare queue", Want: ">= 0.50x", Got: "not measured"}
	if c := r.Cell(queueOnly, 1); c != nil {
		if f := c.Figure("cycles_per_s"); f != nil && f.RatioToBare != nil {
			q.Measured = true
			q.Met = *f.RatioToBare >= 0.5
			q.Got = fmt.Sprintf("%.2fx (%s vs %s)", *f.RatioToBare, num(f.After), num(f.Bare))
		}
	}
	out = append(out, q)
	return append(out, scaleTargets(r)...)
}

func fetchesOf(c *Cell, side string) string {
	n := 0
	for _, rs := range c.Rounds {
		if rs.Side == side {
			n += rs.Sample.Fetches
		}
	}
	return fmt.Sprint(n)
}
