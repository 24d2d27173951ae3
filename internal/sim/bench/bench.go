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
	"flag"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/duroxide-pg/migrations/internal/packfacts"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
	"github.com/duroxide-pg/migrations/internal/sim/settings"
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

	// Each scenario's own settings, from its file (JSON: flattened, as
	// the fields of Config).
	BacklogConfig
	HotConfig
	QueueConfig
	WorkerConfig
	ScaleConfig
	RuntimeConfig

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
func Defaults() Config { return Config{}.WithDefaults() }

// WithDefaults fills the unset fields from Defaults: a count or a
// duration takes the default when it is 0 (a negative one stays, for
// Validate to reject), a list when it is nil (an empty list is taken as
// given). The hot lock timeout is unset when neither HotLockTimeout nor
// CalibrateHotLockTimeout is; it then takes Defaults' calibration.
// Every field is declared once, in settings or in its scenario's
// (TestDefaultsLeaveNoFieldZero checks that none is forgotten).
func (c Config) WithDefaults() Config {
	list(&c.Scenarios, allScenarios())
	c.settings().Fill()
	return c
}

// Register adds to fs the flags of the settings the command line sets
// (the scenarios declare which), bound to c, its values as defaults; a
// flag's value is held to its setting's least as it is parsed.
func (c *Config) Register(fs *flag.FlagSet) { c.settings().Register(fs) }

// settings are c's settings, every scenario's part included, bound to c:
// each one's default, least value and flag, declared once.
func (c *Config) settings() *settings.List {
	l := settings.New("bench: Config.")
	l.Int(&c.Rounds, "Rounds", 3, 0)
	l.Duration(&c.Duration, "Duration", 2500*time.Millisecond, 0).Flag("duration", "run time of one cell, per version and round")
	l.Int(&c.EventBytes, "EventBytes", 250, 0)
	l.Duration(&c.PollInterval, "PollInterval", dispatch.DefaultPollInterval, 0)
	for _, s := range scenarios() {
		s.settings(c, l)
	}
	return l
}

// list sets *field to def when it is nil (an empty list is taken as given).
func list[T any](field *[]T, def []T) {
	if *field == nil {
		*field = def
	}
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
	if c.Duration < MinDuration || c.Duration > MaxDuration {
		return fmt.Errorf("bench: a cell of %v: give between %v and %v, e.g. 2.5s", c.Duration, MinDuration, MaxDuration)
	}
	for _, s := range scenarios() {
		if err := s.validate(c, slices.Contains(c.Scenarios, s.name())); err != nil {
			return err
		}
	}
	return c.settings().Check()
}

func validScenario(s string) bool { return slices.Contains(allScenarios(), s) }

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

// Steps is the number of cell runs a config makes: each scenario's cell
// runs of one round, every round (Run reports each through note).
func (c Config) Steps() int {
	c = c.WithDefaults()
	per := 0
	for _, s := range c.chosen() {
		per += s.steps(c)
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
	r := &runState{srv: srv, src: src, cfg: cfg, cpu: cpu, res: &res, start: start, progress: progress,
		schemas: map[schemaKey]prepared{}, cellOf: map[string]*Cell{}}
	r.note = func(round int, label string) {
		step++
		progress(Progress{Step: step, Steps: cfg.Steps(), Round: round, Rounds: cfg.Rounds, Label: label, Elapsed: time.Since(start)})
	}
	r.before, r.after, r.pairErr = Versions()
	chosen := cfg.chosen()

	r.phase("migrating and seeding the schemas")
	for _, s := range chosen {
		if err := s.prepare(ctx, r); err != nil {
			return res, err
		}
	}
	// The cells, in report order (after prepare: the hot cell's lock
	// timeout may have been calibrated).
	cmp := Comparison[Sample]{BeforeVersion: r.before, AfterVersion: r.after}
	for _, s := range chosen {
		res.Cells = append(res.Cells, s.cells(r.cfg, cmp)...)
	}
	for i := range res.Cells {
		r.cellOf[res.Cells[i].Name()] = &res.Cells[i]
	}
	for round := 1; round <= cfg.Rounds; round++ {
		for _, s := range chosen {
			if err := s.round(ctx, r, round); err != nil {
				return res, err
			}
		}
	}
	for _, s := range chosen {
		if err := s.after(ctx, r); err != nil {
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
