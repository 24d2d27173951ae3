package bench

// The runtime scenario: the real duroxide runtime (upstream.AddonPackage,
// through tools/upstream/runtime.js) on four schemas, alternating in every
// round: upstream's latest as duroxide-pg's own runner makes it (the real
// provider), the same with upstream's candidate fix (port) applied as its
// runner would, the pack's previous fix version and the pack's latest. Cells:
// orchestrations of three activities started at once, at orchestration /
// worker concurrency 1/1, 4/8 and 16/16, and one fan-out/fan-in of 500
// activities. Each run gets a fresh schema (dropped after it) so that no
// run inherits another's completed instances; pg_stat_statements (when the
// server loads it) is reset before each run and read after it, so every
// function's calls and time are that run's.

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/settings"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// ScenarioRuntime is the scenario's name.
const ScenarioRuntime = "runtime"

// The runtime scenario's sides.
const (
	runtimeUpstream  = "upstream"
	runtimeCandidate = "candidate"
	runtimePrevious  = "previous"
	runtimeLatest    = "latest"
)

// runtimeSides are the sides in the order the first round runs them (each
// later round starts one further along).
func runtimeSides() []string {
	return []string{runtimeUpstream, runtimeCandidate, runtimePrevious, runtimeLatest}
}

// runtimePackSides are the sides the pack made: no lease may be dead there.
func runtimePackSides() []string { return []string{runtimePrevious, runtimeLatest} }

// RuntimeVersions are the pack versions of the previous and latest sides:
// the fix before the pack's last one, and the pack's latest (read from
// sql/).
func RuntimeVersions() (previous, latest int64) {
	fixes := migrations.Fixes()
	latest = migrations.Latest()
	previous = latest
	for _, m := range fixes {
		if m.Version < latest {
			previous = m.Version
		}
	}
	return previous, latest
}

// FunctionStat is one function's share of a run, from pg_stat_statements:
// the statements calling it at top level.
type FunctionStat struct {
	Calls   int64   `json:"calls"`
	TotalMs float64 `json:"total_ms"`
}

// MeanMs is the mean time of a call.
func (f FunctionStat) MeanMs() float64 {
	if f.Calls == 0 {
		return 0
	}
	return f.TotalMs / float64(f.Calls)
}

// RuntimeSample is what one run of a runtime cell measured.
type RuntimeSample struct {
	Orchestrations int     `json:"orchestrations"`
	Completed      int     `json:"completed"`
	WallMs         float64 `json:"wall_ms"`
	// PerSecond is completed orchestrations per second of the run.
	PerSecond *float64 `json:"orchestrations_per_s"`
	// ServerCPUS is the server's CPU over the run (provider connection
	// included), CPUMsPerOrch that per completed orchestration.
	ServerCPUS   *float64 `json:"server_cpu_s"`
	CPUMsPerOrch *float64 `json:"server_cpu_ms_per_orchestration"`
	// Turns are the orchestration turns the runtime ran (the driver's
	// create calls), CPUMsPerTurn the server's CPU per turn.
	Turns        int      `json:"turns"`
	CPUMsPerTurn *float64 `json:"server_cpu_ms_per_turn"`
	// LeaseLines counts the runtime's WARN/ERROR lines of the lease kind.
	LeaseLines int                     `json:"lease_kind_lines"`
	Functions  map[string]FunctionStat `json:"functions,omitempty"`
}

// RuntimeCell is one load at one concurrency, on every side.
type RuntimeCell struct {
	OrchestrationConcurrency int `json:"orchestration_concurrency"`
	WorkerConcurrency        int `json:"worker_concurrency"`
	// Orchestrations of three activities started at once (OneAtATime: each
	// once the one before has completed), or (FanIn > 0) one orchestration
	// of FanIn activities.
	Orchestrations int                    `json:"orchestrations,omitempty"`
	OneAtATime     bool                   `json:"one_at_a_time,omitempty"`
	FanIn          int                    `json:"fan_in,omitempty"`
	Rounds         []Round[RuntimeSample] `json:"rounds"`
	// Medians by side, and the ratios latest/upstream, latest/previous.
	PerSecond    map[string]*float64 `json:"orchestrations_per_s"`
	CPUMsPerOrch map[string]*float64 `json:"server_cpu_ms_per_orchestration"`
	CPUMsPerTurn map[string]*float64 `json:"server_cpu_ms_per_turn"`
	WallMs       map[string]*float64 `json:"wall_ms"`
	// Functions sums every round of a side.
	Functions map[string]map[string]FunctionStat `json:"functions,omitempty"`
}

// Name is the cell's short name ("runtime 16/16 x400", "runtime fan-in 500").
func (c *RuntimeCell) Name() string {
	if c.FanIn > 0 {
		return fmt.Sprintf("runtime fan-in %d (%d/%d)", c.FanIn, c.OrchestrationConcurrency, c.WorkerConcurrency)
	}
	if c.OneAtATime {
		return fmt.Sprintf("runtime %d/%d x%d one at a time", c.OrchestrationConcurrency, c.WorkerConcurrency, c.Orchestrations)
	}
	return fmt.Sprintf("runtime %d/%d x%d", c.OrchestrationConcurrency, c.WorkerConcurrency, c.Orchestrations)
}

// RuntimeBench is the runtime scenario's result.
type RuntimeBench struct {
	Addon           string `json:"addon"`
	PreviousVersion int64  `json:"previous_version"`
	LatestVersion   int64  `json:"latest_version"`
	// Statements says where the per-function figures come from, or "n/a
	// (why)".
	Statements string        `json:"statements"`
	Cells      []RuntimeCell `json:"cells"`
	// Nested is the separate pass with pg_stat_statements.track = all on
	// the largest load cell, upstream and latest once each: the statements
	// inside the functions, by total time.
	Nested []NestedPass `json:"nested,omitempty"`
}

// NestedPass is one run with nested statement tracking.
type NestedPass struct {
	Cell       string          `json:"cell"`
	Side       string          `json:"side"`
	Statements []StatementStat `json:"statements"`
}

// StatementStat is one statement of pg_stat_statements.
type StatementStat struct {
	Query   string  `json:"query"`
	Calls   int64   `json:"calls"`
	TotalMs float64 `json:"total_ms"`
}

// nestedTop is how many statements a nested pass lists.
const nestedTop = 12

// runtimeCells are the scenario's cells from cfg.
func runtimeCells(cfg Config) []RuntimeCell {
	out := []RuntimeCell{{OrchestrationConcurrency: 1, WorkerConcurrency: 1, Orchestrations: cfg.RuntimeUncontended, OneAtATime: true}}
	for i, oc := range cfg.RuntimeOrchestrationConcurrency {
		out = append(out, RuntimeCell{OrchestrationConcurrency: oc, WorkerConcurrency: cfg.RuntimeWorkerConcurrency[i], Orchestrations: cfg.RuntimeOrchestrations[i]})
	}
	if cfg.RuntimeFanIn > 0 {
		n := len(cfg.RuntimeOrchestrationConcurrency) - 1
		out = append(out, RuntimeCell{OrchestrationConcurrency: cfg.RuntimeOrchestrationConcurrency[n], WorkerConcurrency: cfg.RuntimeWorkerConcurrency[n], FanIn: cfg.RuntimeFanIn})
	}
	return out
}

func (c Config) validateRuntime() error {
	n := len(c.RuntimeOrchestrationConcurrency)
	if n == 0 || len(c.RuntimeWorkerConcurrency) != n || len(c.RuntimeOrchestrations) != n {
		return fmt.Errorf("bench: the runtime scenario needs as many worker concurrencies and orchestration counts as orchestration concurrencies (%d, %d, %d)",
			n, len(c.RuntimeWorkerConcurrency), len(c.RuntimeOrchestrations))
	}
	if c.RuntimeUncontended < 1 {
		return fmt.Errorf("bench: the runtime scenario's uncontended cell needs at least one orchestration")
	}
	for i := range n {
		if c.RuntimeOrchestrationConcurrency[i] < 1 || c.RuntimeWorkerConcurrency[i] < 1 || c.RuntimeOrchestrations[i] < 1 {
			return fmt.Errorf("bench: runtime concurrencies and orchestration counts must be >= 1")
		}
	}
	return nil
}

// schemaCall finds schema.function( in a statement's text (a table's
// column list has a space before its parenthesis).
var schemaCall = regexp.MustCompile(`"?([a-z0-9_]+)"?\.([a-z0-9_]+)\(`)

// runRuntime runs the runtime scenario on src's database.
func runRuntime(ctx context.Context, src *dbconn.Source, cfg Config, cpu *serverCPU, note func(round int, label string)) (*RuntimeBench, error) {
	p, err := upstream.Find()
	if err != nil {
		return nil, fmt.Errorf("bench: runtime scenario: %w", err)
	}
	prev, latest := RuntimeVersions()
	out := &RuntimeBench{Addon: upstream.AddonPackage, PreviousVersion: prev, LatestVersion: latest, Cells: runtimeCells(cfg)}
	conn, err := src.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("bench: runtime scenario: %w", err)
	}
	defer conn.Close(context.Background())
	statements := true
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		statements = false
		out.Statements = "n/a (" + err.Error() + ")"
	} else if _, err := conn.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
		statements = false
		out.Statements = "n/a (pg_stat_statements is not loaded: " + err.Error() + ")"
	} else {
		var track string
		_ = conn.QueryRow(ctx, "SHOW pg_stat_statements.track").Scan(&track)
		out.Statements = fmt.Sprintf("pg_stat_statements, track = %s, reset before each run", track)
	}
	sides := runtimeSides()
	run := 0
	for round := 1; round <= cfg.Rounds; round++ {
		for ci := range out.Cells {
			c := &out.Cells[ci]
			for k := range sides {
				side := sides[(k+round-1)%len(sides)]
				run++
				schema := fmt.Sprintf("bench_rt_%s_%d", side, run)
				note(round, fmt.Sprintf("%s %s", c.Name(), side))
				s, err := runtimeRun(ctx, p, conn, src, schema, side, c, cfg, cpu, statements)
				if err != nil {
					return nil, fmt.Errorf("bench: %s %s round %d: %w", c.Name(), side, round, err)
				}
				c.Rounds = append(c.Rounds, Round[RuntimeSample]{Round: round, Side: side, Sample: s})
			}
		}
	}
	for i := range out.Cells {
		out.Cells[i].computeFigures()
	}
	if statements {
		if out.Nested, err = nestedPasses(ctx, p, conn, src, out, cfg, note); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// nestedPasses runs the largest load cell once more on upstream and latest
// with track = all (set on the database, so the runtime's new sessions
// take it), and lists each run's costliest statements.
func nestedPasses(ctx context.Context, p *upstream.Provider, conn *pgx.Conn, src *dbconn.Source, rb *RuntimeBench, cfg Config, note func(round int, label string)) ([]NestedPass, error) {
	var cell *RuntimeCell
	for i := range rb.Cells {
		if rb.Cells[i].FanIn == 0 && !rb.Cells[i].OneAtATime && (cell == nil || rb.Cells[i].Orchestrations > cell.Orchestrations) {
			cell = &rb.Cells[i]
		}
	}
	if cell == nil {
		return nil, nil
	}
	var db string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		return nil, err
	}
	set := func(track string) error {
		_, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET pg_stat_statements.track = "+track)
		return err
	}
	if err := set("'all'"); err != nil {
		return nil, fmt.Errorf("bench: pg_stat_statements.track = all: %w", err)
	}
	defer func() { _ = set("DEFAULT") }()
	var out []NestedPass
	for _, side := range []string{runtimeUpstream, runtimeLatest} {
		note(cfg.Rounds, fmt.Sprintf("%s %s, track = all", cell.Name(), side))
		schema := "bench_rt_nested_" + side
		if _, err := runtimeRun(ctx, p, conn, src, schema, side, cell, cfg, nil, true); err != nil {
			return nil, fmt.Errorf("bench: %s %s (track = all): %w", cell.Name(), side, err)
		}
		top, err := topStatements(ctx, conn)
		if err != nil {
			return nil, err
		}
		out = append(out, NestedPass{Cell: cell.Name(), Side: side, Statements: top})
	}
	return out, nil
}

// topStatements are this database's costliest statements since the reset.
func topStatements(ctx context.Context, conn *pgx.Conn) ([]StatementStat, error) {
	rows, err := conn.Query(ctx, `SELECT regexp_replace(query, '\s+', ' ', 'g'), calls, total_exec_time FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		ORDER BY total_exec_time DESC LIMIT $1`, nestedTop)
	if err != nil {
		return nil, fmt.Errorf("pg_stat_statements: %w", err)
	}
	defer rows.Close()
	var out []StatementStat
	for rows.Next() {
		var st StatementStat
		if err := rows.Scan(&st.Query, &st.Calls, &st.TotalMs); err != nil {
			return nil, err
		}
		if len(st.Query) > 110 {
			st.Query = st.Query[:110] + "..."
		}
		out = append(out, st)
	}
	return out, rows.Err()
}

// runtimeRun makes schema for side, runs the cell's load on it with the
// real runtime, reads the statements' figures and drops the schema.
func runtimeRun(ctx context.Context, p *upstream.Provider, conn *pgx.Conn, src *dbconn.Source, schema, side string, c *RuntimeCell, cfg Config, cpu *serverCPU, statements bool) (RuntimeSample, error) {
	prev, latest := RuntimeVersions()
	var err error
	switch side {
	case runtimeUpstream:
		err = p.Migrate(ctx, src, schema)
	case runtimeCandidate:
		if err = p.Migrate(ctx, src, schema); err == nil {
			err = upstream.ApplyCandidate(ctx, src, schema)
		}
	case runtimePrevious:
		err = migrate.To(ctx, src.Config(), schema, prev)
	default:
		err = migrate.To(ctx, src.Config(), schema, latest)
	}
	if err != nil {
		return RuntimeSample{}, err
	}
	defer func() {
		_, _ = conn.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	}()
	if statements {
		if _, err := conn.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
			return RuntimeSample{}, err
		}
	}
	scenario := upstream.Scenario{Name: "load", Key: "load", Count: c.Orchestrations, Sequential: c.OneAtATime}
	if c.FanIn > 0 {
		scenario = upstream.Scenario{Name: "fanout", Key: "load", Count: c.FanIn}
	}
	w := cpu.begin()
	res, err := p.RunRuntime(ctx, src, upstream.RuntimeRun{
		Schema:    schema,
		Runtime:   upstream.RuntimeOptions{OrchestrationConcurrency: c.OrchestrationConcurrency, WorkerConcurrency: c.WorkerConcurrency},
		Scenarios: []upstream.Scenario{scenario},
		Wait:      cfg.RuntimeWait,
	})
	cpuS := w.end()
	if err != nil {
		return RuntimeSample{}, err
	}
	o := res.Results["load"]
	s := RuntimeSample{LeaseLines: len(res.LeaseLines())}
	if c.FanIn > 0 {
		s.Orchestrations, s.WallMs = 1, float64(res.RunMs)
		if o.Status() == "Completed" {
			s.Completed = 1
		}
	} else {
		s.Orchestrations = c.Orchestrations
		if n, ok := o["completed"].(float64); ok {
			s.Completed = int(n)
		}
		if ms, ok := o["wallMs"].(float64); ok {
			s.WallMs = ms
		}
	}
	if s.Completed < s.Orchestrations {
		return s, fmt.Errorf("%d of %d orchestrations completed (%v)", s.Completed, s.Orchestrations, o)
	}
	if s.WallMs > 0 {
		s.PerSecond = fp(float64(s.Completed) * 1000 / s.WallMs)
	}
	s.Turns = res.Turns
	if cpuS >= 0 {
		s.ServerCPUS = fp(cpuS)
		s.CPUMsPerOrch = fp(cpuS * 1000 / float64(s.Completed))
		if s.Turns > 0 {
			s.CPUMsPerTurn = fp(cpuS * 1000 / float64(s.Turns))
		}
	}
	if statements {
		if s.Functions, err = functionStats(ctx, conn, schema); err != nil {
			return s, err
		}
	}
	return s, nil
}

// functionStats sums pg_stat_statements by the function of schema each
// statement calls (statements calling none are left out).
func functionStats(ctx context.Context, conn *pgx.Conn, schema string) (map[string]FunctionStat, error) {
	rows, err := conn.Query(ctx, `SELECT query, calls, total_exec_time FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	if err != nil {
		return nil, fmt.Errorf("pg_stat_statements: %w", err)
	}
	defer rows.Close()
	out := map[string]FunctionStat{}
	for rows.Next() {
		var q string
		var calls int64
		var total float64
		if err := rows.Scan(&q, &calls, &total); err != nil {
			return nil, err
		}
		for _, m := range schemaCall.FindAllStringSubmatch(q, -1) {
			if m[1] == schema {
				f := out[m[2]]
				f.Calls += calls
				f.TotalMs += total
				out[m[2]] = f
				break
			}
		}
	}
	return out, rows.Err()
}

func (c *RuntimeCell) computeFigures() {
	c.PerSecond, c.CPUMsPerOrch, c.WallMs, c.CPUMsPerTurn = map[string]*float64{}, map[string]*float64{}, map[string]*float64{}, map[string]*float64{}
	c.Functions = map[string]map[string]FunctionStat{}
	by := map[string][]RuntimeSample{}
	for _, r := range c.Rounds {
		by[r.Side] = append(by[r.Side], r.Sample)
	}
	for side, samples := range by {
		var ps, cpu, wall, turn []*float64
		fns := map[string]FunctionStat{}
		for _, s := range samples {
			ps, cpu, wall, turn = append(ps, s.PerSecond), append(cpu, s.CPUMsPerOrch), append(wall, fp(s.WallMs)), append(turn, s.CPUMsPerTurn)
			for name, f := range s.Functions {
				g := fns[name]
				g.Calls += f.Calls
				g.TotalMs += f.TotalMs
				fns[name] = g
			}
		}
		c.PerSecond[side], c.CPUMsPerOrch[side], c.WallMs[side], c.CPUMsPerTurn[side] = median(ps), median(cpu), median(wall), median(turn)
		if len(fns) > 0 {
			c.Functions[side] = fns
		}
	}
}

// runtimeSpreadBound is how far, either way, a ratio's rounds may stray
// from it before the report says more rounds are needed.
const runtimeSpreadBound = 0.10

// runtimeTargets are the targets for the real runtime (issue 33, item 5),
// reported: at every load cell but the fan-in, the pack's latest against
// upstream's schema costs the server at most as much CPU per
// orchestration and completes at least as many orchestrations a second
// (1.50x at 16/16, where the convoy was), and is never slower than the
// pack's previous fix. Each ratio says its spread over the rounds.
func runtimeTargets(rb *RuntimeBench) []Target {
	if rb == nil {
		return nil
	}
	cpu := func(s RuntimeSample) *float64 { return s.CPUMsPerOrch }
	perSecond := func(s RuntimeSample) *float64 { return s.PerSecond }
	var out []Target
	for i := range rb.Cells {
		c := &rb.Cells[i]
		if c.FanIn > 0 {
			continue
		}
		out = append(out, c.ratioTarget(fmt.Sprintf("%s: server CPU per orchestration, latest against upstream", c.Name()), "<= 1.00x",
			c.CPUMsPerOrch, cpu, runtimeLatest, runtimeUpstream, func(r float64) bool { return r <= 1.0 }))
		want, bound := ">= 1.00x", 1.0
		if c.OrchestrationConcurrency >= 16 {
			want, bound = ">= 1.50x", 1.5
		}
		out = append(out, c.ratioTarget(fmt.Sprintf("%s: orchestrations/s, latest against upstream", c.Name()), want,
			c.PerSecond, perSecond, runtimeLatest, runtimeUpstream, func(r float64) bool { return r >= bound }))
	}
	for i := range rb.Cells {
		if rb.Cells[i].OneAtATime {
			out = append(out, uncontendedTargets(&rb.Cells[i], rb.LatestVersion)...)
		}
	}
	for i := range rb.Cells {
		c := &rb.Cells[i]
		if c.FanIn > 0 {
			continue
		}
		out = append(out, c.ratioTarget(fmt.Sprintf("%s: orchestrations/s, latest (%04d) against previous (%04d)", c.Name(), rb.LatestVersion, rb.PreviousVersion), ">= 1.00x",
			c.PerSecond, perSecond, runtimeLatest, runtimePrevious, func(r float64) bool { return r >= 1.0 }))
	}
	return out
}

// ratioTarget judges the ratio of num's median to den's in fig, and says
// the spread of the same ratio taken round by round (each round runs
// every side once), with a note when a round strays more than
// runtimeSpreadBound from the median ratio.
func (c *RuntimeCell) ratioTarget(name, want string, fig map[string]*float64, of func(RuntimeSample) *float64, num, den string, ok func(float64) bool) Target {
	t := Target{Name: name, Want: want}
	r := ratio(fig[num], fig[den])
	if r == nil {
		return t
	}
	t.Measured, t.Met, t.Got = true, ok(*r), fmt.Sprintf("%.2fx", *r)
	var notes []string
	lo, hi, n := c.roundRatios(of, num, den)
	if n > 0 {
		spread := max(hi / *r - 1, 1 - lo / *r)
		t.Got += fmt.Sprintf(" (%d rounds: %.2f-%.2fx, ±%.0f%%)", n, lo, hi, spread*100)
		if spread > runtimeSpreadBound {
			notes = append(notes, fmt.Sprintf("spread ±%.0f%% over %d rounds, above ±%.0f%%: more rounds (--rounds) would settle it", spread*100, n, runtimeSpreadBound*100))
		}
	}
	if !t.Met {
		notes = append(notes, c.missReason(num, den, n))
	}
	t.Reason = strings.Join(notes, "; ")
	return t
}

// roundRatios are the lowest and highest ratio of num's figure to den's in
// one round, over the n rounds that measured both.
func (c *RuntimeCell) roundRatios(of func(RuntimeSample) *float64, num, den string) (lo, hi float64, n int) {
	by := map[int]map[string]*float64{}
	for _, r := range c.Rounds {
		if by[r.Round] == nil {
			by[r.Round] = map[string]*float64{}
		}
		by[r.Round][r.Side] = of(r.Sample)
	}
	for _, sides := range by {
		q := ratio(sides[num], sides[den])
		if q == nil {
			continue
		}
		if n == 0 || *q < lo {
			lo = *q
		}
		if n == 0 || *q > hi {
			hi = *q
		}
		n++
	}
	return lo, hi, n
}

// Rounds is how many rounds each cell ran per side (the most any side
// ran).
func (rb *RuntimeBench) Rounds() int {
	n := 0
	for i := range rb.Cells {
		by := map[string]int{}
		for _, r := range rb.Cells[i].Rounds {
			by[r.Side]++
			n = max(n, by[r.Side])
		}
	}
	return n
}

// missReason says, from the cell's own figures, where a ratio of num to
// den went: how busy the server was over each side's runs (a server far
// from using its cores is not what bounds the throughput), and the
// functions whose total time per run grew or shrank the most.
func (c *RuntimeCell) missReason(num, den string, rounds int) string {
	busy := func(side string) string {
		var cpu, wall float64
		for _, r := range c.Rounds {
			if r.Side == side && r.Sample.ServerCPUS != nil && r.Sample.WallMs > 0 {
				cpu, wall = cpu+*r.Sample.ServerCPUS, wall+r.Sample.WallMs/1000
			}
		}
		if wall == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2f", cpu/wall)
	}
	parts := []string{fmt.Sprintf("server CPU-seconds per second of run: %s at %s, %s at %s", busy(num), num, busy(den), den)}
	type delta struct {
		name string
		ms   float64
	}
	var ds []delta
	per := float64(max(rounds, 1))
	for n := range c.Functions[num] {
		ds = append(ds, delta{n, (c.Functions[num][n].TotalMs - c.Functions[den][n].TotalMs) / per})
	}
	for n := range c.Functions[den] {
		if _, ok := c.Functions[num][n]; !ok {
			ds = append(ds, delta{n, -c.Functions[den][n].TotalMs / per})
		}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].ms > ds[j].ms })
	var more, less []string
	for _, d := range ds {
		if d.ms >= 1 && len(more) < 3 {
			more = append(more, fmt.Sprintf("%s +%.0f", d.name, d.ms))
		}
	}
	for i := len(ds) - 1; i >= 0 && len(less) < 2; i-- {
		if ds[i].ms <= -1 {
			less = append(less, fmt.Sprintf("%s %.0f", ds[i].name, ds[i].ms))
		}
	}
	if len(more) > 0 {
		parts = append(parts, fmt.Sprintf("ms/run %s against %s: %s", num, den, strings.Join(more, ", ")))
	}
	if len(less) > 0 {
		parts = append(parts, strings.Join(less, ", "))
	}
	return strings.Join(parts, "; ")
}

// uncontendedMinCalls is how many calls per run a function needs, on
// both sides, for its mean to be judged.
const uncontendedMinCalls = 10

// uncontendedTargets are the uncontended cell's per-function targets:
// every function's mean within 1.10x of upstream's, except where a fix up
// to latest says it changes the function (its "-- Fixes:" line) or makes
// it slower on purpose (its "-- Costs:" line): such a miss is reported
// with that fix as its reason.
func uncontendedTargets(c *RuntimeCell, latest int64) []Target {
	rounds := map[string]int64{}
	for _, r := range c.Rounds {
		rounds[r.Side]++
	}
	var names []string
	for n, l := range c.Functions[runtimeLatest] {
		u := c.Functions[runtimeUpstream][n]
		if u.Calls >= uncontendedMinCalls*rounds[runtimeUpstream] && l.Calls >= uncontendedMinCalls*rounds[runtimeLatest] {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var out []Target
	for _, n := range names {
		u, l := c.Functions[runtimeUpstream][n].MeanMs(), c.Functions[runtimeLatest][n].MeanMs()
		t := Target{Name: fmt.Sprintf("%s: %s mean per call, latest against upstream", c.Name(), n), Want: "<= 1.10x"}
		if u > 0 {
			r := l / u
			t.Measured, t.Met, t.Got = true, r <= 1.10, fmt.Sprintf("%.2fx (%.3f against %.3f ms)", r, l, u)
		}
		if t.Measured && !t.Met {
			if m, ok := migrations.FixOf(n); ok && m.Version <= latest {
				t.Reason = fmt.Sprintf("intended: %s redefines it", m.File)
			} else if m, ok := migrations.IntendedCost(n, latest); ok {
				t.Reason = fmt.Sprintf("intended: %s says it pays for that fix (its -- Costs: line)", m.File)
			}
		}
		out = append(out, t)
	}
	return out
}

func fmtFig(v *float64, format string) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf(format, *v)
}

func fmtRatio(num, den *float64) string {
	if r := ratio(num, den); r != nil {
		return fmt.Sprintf("%.2fx", *r)
	}
	return "n/a"
}

// runtimeHeadline are the rows of the before/after table: per cell, the
// sides' medians and the ratios.
func runtimeHeadline(rb *RuntimeBench) (header []string, rows [][]string) {
	header = []string{"cell", "figure", "upstream", "upstream's candidate", fmt.Sprintf("previous %04d", rb.PreviousVersion), fmt.Sprintf("latest %04d", rb.LatestVersion),
		"latest/upstream", "latest/candidate", "latest/previous"}
	for i := range rb.Cells {
		c := &rb.Cells[i]
		first := true
		add := func(label, format string, fig map[string]*float64) {
			name := ""
			if first {
				name, first = c.Name(), false
			}
			rows = append(rows, []string{name, label, fmtFig(fig[runtimeUpstream], format), fmtFig(fig[runtimeCandidate], format),
				fmtFig(fig[runtimePrevious], format), fmtFig(fig[runtimeLatest], format),
				fmtRatio(fig[runtimeLatest], fig[runtimeUpstream]), fmtRatio(fig[runtimeLatest], fig[runtimeCandidate]), fmtRatio(fig[runtimeLatest], fig[runtimePrevious])})
		}
		if c.FanIn > 0 {
			add("wall time (ms)", "%.0f", c.WallMs)
			add("server CPU (ms)", "%.0f", c.CPUMsPerOrch)
		} else {
			add("orchestrations/s", "%.1f", c.PerSecond)
			add("server CPU per orchestration (ms)", "%.1f", c.CPUMsPerOrch)
		}
		add("server CPU per turn (ms)", "%.2f", c.CPUMsPerTurn)
	}
	return header, rows
}

// runtimeFunctionRows are the per-function rows of one cell: calls per
// run and mean ms per call on each side, the mean's ratios.
func runtimeFunctionRows(c *RuntimeCell, rounds int) (header []string, rows [][]string) {
	header = []string{"function", "calls/run upstream", "candidate", "previous", "latest", "mean ms upstream", "candidate", "previous", "latest", "latest/upstream", "total ms/run upstream", "latest"}
	names := map[string]bool{}
	for _, fns := range c.Functions {
		for n := range fns {
			names[n] = true
		}
	}
	var sorted []string
	for n := range names {
		sorted = append(sorted, n)
	}
	// The biggest total first, on the upstream side (else the latest).
	total := func(n string) float64 {
		return c.Functions[runtimeUpstream][n].TotalMs + c.Functions[runtimeLatest][n].TotalMs
	}
	sort.Slice(sorted, func(i, j int) bool { return total(sorted[i]) > total(sorted[j]) })
	per := float64(max(rounds, 1))
	for _, n := range sorted {
		u, k, p, l := c.Functions[runtimeUpstream][n], c.Functions[runtimeCandidate][n], c.Functions[runtimePrevious][n], c.Functions[runtimeLatest][n]
		mean := func(f FunctionStat) *float64 {
			if f.Calls == 0 {
				return nil
			}
			return fp(f.MeanMs())
		}
		rows = append(rows, []string{n,
			fmt.Sprintf("%.0f", float64(u.Calls)/per), fmt.Sprintf("%.0f", float64(k.Calls)/per), fmt.Sprintf("%.0f", float64(p.Calls)/per), fmt.Sprintf("%.0f", float64(l.Calls)/per),
			fmtFig(mean(u), "%.3f"), fmtFig(mean(k), "%.3f"), fmtFig(mean(p), "%.3f"), fmtFig(mean(l), "%.3f"), fmtRatio(mean(l), mean(u)),
			fmt.Sprintf("%.0f", u.TotalMs/per), fmt.Sprintf("%.0f", l.TotalMs/per)})
	}
	return header, rows
}

func runtimeTitle(rb *RuntimeBench) string {
	return fmt.Sprintf("runtime: the real duroxide runtime (%s), before = upstream's latest schema as its own runner makes it (1..21, 23), after = the pack's latest (%04d); candidate = upstream's schema with upstream's candidate fix (port) applied as its runner would; previous = the pack's fix before it (%04d); sides alternating in every round, medians",
		rb.Addon, rb.LatestVersion, rb.PreviousVersion)
}

// printRuntimeTable writes the runtime scenario's tables.
func printRuntimeTable(w io.Writer, rb *RuntimeBench, rounds int) error {
	if rb == nil {
		return nil
	}
	fmt.Fprintf(w, "\n%s\n\n", runtimeTitle(rb))
	header, rows := runtimeHeadline(rb)
	if err := printRows(w, header, rows); err != nil {
		return err
	}
	for i := range rb.Cells {
		c := &rb.Cells[i]
		if len(c.Functions) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s: per function (%s)\n", c.Name(), rb.Statements)
		header, rows := runtimeFunctionRows(c, rounds)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(header, "\t"))
		for _, r := range rows {
			fmt.Fprintln(tw, strings.Join(r, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// runtimeMarkdown renders the runtime scenario as a markdown section.
func runtimeMarkdown(rb *RuntimeBench, rounds int, wait time.Duration) string {
	if rb == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## The real runtime: what users run today against the pack\n\n%s. Each run: a fresh schema (the real provider's runner, or `migrate up --to`), the runtime's dispatchers at the cell's concurrency, the load started at once, the runtime's own log read for lines of the lease kind; a run that does not complete within %v fails the bench. Per-function figures: %s; a function's calls and time are those of the statements calling it at top level.\n\n",
		runtimeTitle(rb), wait, rb.Statements)
	header, rows := runtimeHeadline(rb)
	writeMarkdownTable(&b, header, rows)
	for i := range rb.Cells {
		c := &rb.Cells[i]
		if len(c.Functions) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n### %s: per function\n\n", c.Name())
		header, rows := runtimeFunctionRows(c, rounds)
		writeMarkdownTable(&b, header, rows)
	}
	for _, n := range rb.Nested {
		fmt.Fprintf(&b, "\n### Inside the functions: %s, %s, `track = all` (a separate run; nested tracking adds its cost to every inner statement, so these times are not compared with the tables above)\n\n", n.Cell, n.Side)
		b.WriteString("| statement | calls | total ms | mean ms |\n|---|---|---|---|\n")
		for _, st := range n.Statements {
			mean := 0.0
			if st.Calls > 0 {
				mean = st.TotalMs / float64(st.Calls)
			}
			fmt.Fprintf(&b, "| `%s` | %d | %.0f | %.3f |\n", strings.ReplaceAll(st.Query, "|", "\\|"), st.Calls, st.TotalMs, mean)
		}
	}
	b.WriteString("\n")
	return b.String()
}

// RuntimeConfig is the runtime scenario's part of Config: the real
// runtime at each orchestration concurrency of
// RuntimeOrchestrationConcurrency, with the worker concurrency and the
// orchestration count at the same index; then one fan-out/fan-in of
// RuntimeFanIn activities at the last concurrency; first, the uncontended
// cell: RuntimeUncontended orchestrations at 1/1, each started once the
// one before has completed. RuntimeWait bounds one run.
type RuntimeConfig struct {
	RuntimeOrchestrationConcurrency []int         `json:"runtime_orchestration_concurrency"`
	RuntimeWorkerConcurrency        []int         `json:"runtime_worker_concurrency"`
	RuntimeOrchestrations           []int         `json:"runtime_orchestrations"`
	RuntimeFanIn                    int           `json:"runtime_fan_in"`
	RuntimeUncontended              int           `json:"runtime_uncontended"`
	RuntimeWait                     time.Duration `json:"-"`
}

// runtimeScenario runs RuntimeConfig on upstream's schema, the previous
// fix and the latest, in rounds of its own after the others'.
type runtimeScenario struct{ noCells }

func (runtimeScenario) settings(c *Config, l *settings.List) {
	l.Ints(&c.RuntimeOrchestrationConcurrency, "RuntimeOrchestrationConcurrency", []int{1, 4, 16}, 0)
	l.Ints(&c.RuntimeWorkerConcurrency, "RuntimeWorkerConcurrency", []int{1, 8, 16}, 0)
	l.Ints(&c.RuntimeOrchestrations, "RuntimeOrchestrations", []int{100, 200, 400}, 0)
	l.Int(&c.RuntimeFanIn, "RuntimeFanIn", 500, 0)
	l.Int(&c.RuntimeUncontended, "RuntimeUncontended", 60, 0)
	l.Duration(&c.RuntimeWait, "RuntimeWait", 3*time.Minute, 0)
}

func (runtimeScenario) name() string { return ScenarioRuntime }

func (runtimeScenario) summary() string {
	prev, latest := RuntimeVersions()
	return fmt.Sprintf("the real runtime: upstream's schema against %d and %d", prev, latest)
}

func (runtimeScenario) steps(c Config) int { return len(runtimeSides()) * len(runtimeCells(c)) }

func (runtimeScenario) validate(c Config, chosen bool) error {
	if !chosen {
		return nil
	}
	return c.validateRuntime()
}

func (runtimeScenario) after(ctx context.Context, r *runState) error {
	var err error
	r.res.Runtime, err = runRuntime(ctx, r.src, r.cfg, r.cpu, r.note)
	return err
}
