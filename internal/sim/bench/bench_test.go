package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
)

// One throwaway server for the package's tests and benchmarks, started on
// first use (the pure tests never start it) and stopped in TestMain.
var (
	srvOnce sync.Once
	srv     *pgtest.Server
	srvErr  error
)

func server(tb testing.TB) *pgtest.Server {
	tb.Helper()
	srvOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		opts := pgtest.OptionsFromEnv()
		opts.Preload = []string{"pg_stat_statements"} // the runtime scenario's per-function figures
		srv, srvErr = pgtest.Start(ctx, opts)
	})
	if srvErr != nil {
		if errors.Is(srvErr, pgtest.ErrUnavailable) {
			tb.Skipf("no PostgreSQL server available: %v", srvErr)
		}
		tb.Fatalf("start PostgreSQL: %v", srvErr)
	}
	return srv
}

func TestMain(m *testing.M) {
	code := m.Run()
	if srv != nil {
		_ = srv.Close(context.Background())
	}
	os.Exit(code)
}

func TestMedianAndRatio(t *testing.T) {
	require.Nil(t, median(nil))
	require.Nil(t, median([]*float64{nil, nil}))
	require.Equal(t, 3.0, *median([]*float64{fp(5), fp(1), fp(3)}))
	require.Equal(t, 2.5, *median([]*float64{fp(4), nil, fp(1), fp(3), fp(2)}))
	require.Equal(t, 7.0, *median([]*float64{nil, fp(7)}))

	require.InDelta(t, 2.0, *ratio(fp(10), fp(5)), 1e-9)
	require.Nil(t, ratio(fp(1), fp(0)))
	require.Nil(t, ratio(nil, fp(1)))
	require.Nil(t, ratio(fp(1), nil))
	require.Equal(t, "x / 0", ratioText(nil, fp(3), fp(0)))
	require.Equal(t, "0 / 0", ratioText(nil, fp(0), fp(0)))
	require.Equal(t, "n/a", ratioText(nil, nil, fp(1)))
	require.Equal(t, "1.50x", ratioText(fp(1.5), fp(3), fp(2)))
}

func TestParseStat(t *testing.T) {
	line := "1234 (postgres: a) b) S 99 1234 1234 0 -1 4194560 100 0 0 0 250 40 7 3 20 0 1 0 100 0 0"
	st, err := parseStat(line)
	require.NoError(t, err)
	require.Equal(t, procStat{ppid: 99, utime: 250, stime: 40, cutime: 7, cstime: 3}, st)
	_, err = parseStat("1 (x) S 1")
	require.Error(t, err)
}

// synthetic is a result with known figures: backlog N=1 and 8, hot, queue
// N=1 with the bare queue, migrate; 3 rounds each.
func synthetic(t *testing.T) *Result {
	t.Helper()
	cfg := Defaults()
	cfg.BacklogDispatchers = []int{1, 8}
	r := &Result{Settings: settingsOf(cfg), Server: ServerInfo{Backend: "local", Version: "16.0", CPU: "n/a (test)", CPUs: 2},
		StartedAt: time.Date(2025, 1, 2, 3, 4, 0, 0, time.UTC), TotalS: 123.4}
	sample := func(cps, p99 float64, dead float64) Sample {
		return Sample{ElapsedS: 2.5, Cycles: int(cps * 2.5), CyclesPerS: fp(cps), FetchP50Ms: fp(p99 / 3), FetchP99Ms: fp(p99),
			DeadOnArrival: fp(dead), AckFailures: fp(dead), MaxAttemptCount: fp(1 + dead)}
	}
	bug, fix, verr := Versions()
	require.NoError(t, verr)
	add := func(c Cell, before, after []Sample, base []Sample) {
		c.BeforeVersion, c.AfterVersion = bug, fix
		for i := range before {
			c.Rounds = append(c.Rounds, roundSample{Round: i + 1, Side: sideBefore, Sample: before[i]},
				roundSample{Round: i + 1, Side: sideAfter, Sample: after[i]})
			if base != nil {
				c.Rounds = append(c.Rounds, roundSample{Round: i + 1, Side: sideBare, Sample: base[i]})
			}
		}
		c.computeFigures()
		r.Cells = append(r.Cells, c)
	}
	add(Cell{Scenario: backlog, Dispatchers: 1, Instances: 200, HistoryEvents: 500, LockTimeoutMs: 100},
		[]Sample{sample(50, 30, 0), sample(60, 20, 0), sample(55, 25, 0)},
		[]Sample{sample(52, 30, 0), sample(58, 20, 0), sample(56, 25, 0)}, nil)
	add(Cell{Scenario: backlog, Dispatchers: 8, Instances: 200, HistoryEvents: 500, LockTimeoutMs: 100},
		[]Sample{sample(5, 300, 60), sample(6, 400, 50), sample(4, 350, 70)},
		[]Sample{sample(100, 40, 0), sample(110, 50, 0), sample(90, 45, 0)}, nil)
	add(Cell{Scenario: ScenarioHot, Dispatchers: 16, Instances: 1, HistoryEvents: 5000, LockTimeoutMs: 30},
		[]Sample{sample(0, 900, 10), sample(0, 800, 12), sample(0.4, 700, 9)},
		[]Sample{sample(20, 60, 0), sample(22, 70, 1), sample(21, 65, 0)}, nil)
	add(Cell{Scenario: queueOnly, Dispatchers: 1, Instances: 2000, LockTimeoutMs: 100},
		[]Sample{sample(400, 2, 0), sample(420, 2, 0), sample(410, 2, 0)},
		[]Sample{sample(380, 2, 0), sample(390, 2, 0), sample(385, 2, 0)},
		[]Sample{sample(900, 1, 0), sample(1000, 1, 0), sample(950, 1, 0)})
	add(Cell{Scenario: ScenarioMigrate},
		[]Sample{{WallMs: fp(100)}, {WallMs: fp(110)}, {WallMs: fp(90)}},
		[]Sample{{WallMs: fp(105)}, {WallMs: fp(115)}, {WallMs: fp(95)}}, nil)
	r.Targets = evaluateTargets(r)
	return r
}

func TestFiguresAndTargets(t *testing.T) {
	r := synthetic(t)
	b8 := r.Cell(backlog, 8).Figure("cycles_per_s")
	require.Equal(t, 5.0, *b8.Before)
	require.Equal(t, 100.0, *b8.After)
	require.InDelta(t, 20.0, *b8.Ratio, 1e-9)
	require.Nil(t, r.Cell(backlog, 8).Figure("wall_ms"), "a figure no side measured is left out")
	require.Nil(t, r.Cell(backlog, 8).Figure("empty_fetch_p99_ms"))
	hot := r.Cell(ScenarioHot, 16).Figure("cycles_per_s")
	require.Equal(t, 0.0, *hot.Before)
	require.Nil(t, hot.Ratio)
	q := r.Cell(queueOnly, 1).Figure("cycles_per_s")
	require.Equal(t, 950.0, *q.Bare)
	require.InDelta(t, 385.0/950, *q.RatioToBare, 1e-9)
	m := r.Cell(ScenarioMigrate, 0).Figure("wall_ms")
	require.InDelta(t, 105.0/100, *m.Ratio, 1e-9)

	byName := map[string]Target{}
	for _, tg := range r.Targets {
		byName[tg.Name] = tg
		require.True(t, tg.Measured, tg.Name)
	}
	require.True(t, byName["backlog N=8: cycles/s, after vs before"].Met)
	require.True(t, byName["backlog N=8: fetch p99, after vs before"].Met)
	require.True(t, byName["backlog N=1: cycles/s, after vs before"].Met)
	require.True(t, byName["hot: cycles/s, after vs before"].Met, "before completing nothing is an unbounded ratio")
	require.Contains(t, byName["hot: cycles/s, after vs before"].Got, "unbounded")
	require.False(t, byName["hot: dead-on-arrival leases after the fix"].Met, "one round had a dead lease")
	require.Equal(t, "0, 1, 0 per round (1 of 0 fetches)", byName["hot: dead-on-arrival leases after the fix"].Got)
	require.False(t, byName["queue_only N=1: cycles/s, after vs bare queue"].Met)
}

func TestReportRendering(t *testing.T) {
	r := synthetic(t)
	bug, fix, verr := Versions()
	require.NoError(t, verr)
	var out bytes.Buffer
	require.NoError(t, PrintTable(&out, r))
	text := out.String()
	for _, want := range []string{"backlog N=8", "completed cycles/s", "20.00x", "bare", "0.41x", "[MISS]", "[ met]", "migrate Up 0->N", "1.05x",
		"after/before", "after/bare", fmt.Sprintf("before (schema %d) and after (schema %d)", bug, fix)} {
		require.Contains(t, text, want)
	}

	dir := t.TempDir()
	require.NoError(t, WriteReport(dir, r))
	md, err := os.ReadFile(filepath.Join(dir, ReportFile))
	require.NoError(t, err)
	for _, want := range []string{fmt.Sprintf("# Benchmark: schema %d against %d", bug, fix), "## Targets", "](throughput.svg)", "### backlog", "### queue_only",
		"| cell | figure | before | after | after/before | bare | after/bare |",
		"| backlog N=8 | completed cycles/s | 5 | 100 | 20.00x |", "## Per round", "| hot N=16 | before | 0 | 0 | 0.40 |",
		fmt.Sprintf("wall time of Up 0 -> %d (before column) and 0 -> %d (after column)", bug, fix)} {
		require.Contains(t, string(md), want)
	}
	svg, err := os.ReadFile(filepath.Join(dir, ChartFile))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(svg), "<svg"))
	require.True(t, strings.HasSuffix(string(svg), "</svg>\n"))
	require.Equal(t, 2, strings.Count(string(svg), "<polyline"))
	require.Contains(t, string(svg), fmt.Sprintf("version %d", bug), "the legend names the versions read from sql/")
	require.Contains(t, string(svg), fmt.Sprintf("version %d", fix))

	raw, err := os.ReadFile(filepath.Join(dir, JSONFile))
	require.NoError(t, err)
	var back map[string]any
	require.NoError(t, json.Unmarshal(raw, &back))
	for _, k := range []string{"settings", "server", "cells", "targets", "total_s", "started_at"} {
		require.Contains(t, back, k)
	}
	for _, k := range []string{`"before"`, `"after"`, `"ratio_after_before"`, `"cycles_per_s"`, `"fetch_p99_ms"`, `"empty_fetch_p99_ms"`, `"dead_on_arrival"`,
		`"ack_failures"`, `"max_attempt_count"`, `"server_cpu_s"`, `"ratio_after_bare"`, `"backlog_dispatchers"`, `"cell_duration_s"`,
		fmt.Sprintf(`"before_version": %d`, bug), fmt.Sprintf(`"after_version": %d`, fix), `"side": "before"`, `"side": "after"`} {
		require.Contains(t, string(raw), k)
	}
	for _, gone := range []string{`"v19"`, `"v20"`, `"ratio_20_19"`, `"ratio_20_baseline"`, `"ratio_after_baseline"`} {
		require.NotContains(t, string(raw), gone, "the JSON names sides, not versions")
	}
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, Defaults().Validate())
	c := Defaults()
	c.Scenarios = []string{"nope"}
	require.Error(t, c.Validate())
	c = Defaults()
	c.BacklogDispatchers = []int{0}
	require.Error(t, c.Validate())
	require.Equal(t, 3*(8+2+6+2+8+2*10+4*5), Defaults().Steps(), "scale: 3 spread, 1 idle, 3 fan-in and 3 completed cells; runtime: 4 sides of the uncontended cell, 3 loads and the fan-in")
	c = Defaults()
	c.RuntimeUncontended = -1
	require.ErrorContains(t, c.Validate(), "uncontended")
	c = Defaults()
	c.HotLockTimeout = time.Second
	require.ErrorContains(t, c.Validate(), "give one", "a fixed hot lock timeout and calibration at once")
	c = Defaults()
	c.RuntimeOrchestrations = []int{100}
	require.ErrorContains(t, c.Validate(), "as many worker concurrencies and orchestration counts")
}

// smokeConfig is the whole benchmark shrunk to about a second of cells.
func smokeConfig() Config {
	return Config{
		Rounds: 1, Duration: 250 * time.Millisecond, // long enough for a worker cycle on a loaded CI machine
		// The runtime scenario has its own smoke run (TestRuntimeSmokeRun).
		Scenarios: slices.DeleteFunc(allScenarios(), func(s string) bool { return s == ScenarioRuntime }),
		// Lock timeouts of a second: the smoke run's claim is that after the
		// fix, with an ample lock timeout, no ack fails; 100 ms was not
		// ample on a loaded 2-core machine (one refused ack in a run).
		BacklogConfig: BacklogConfig{BacklogInstances: 10, BacklogHistory: 20, BacklogDispatchers: []int{2}, BacklogLockTimeout: time.Second},
		HotConfig:     HotConfig{HotHistory: 40, HotDispatchers: 2, HotLockTimeout: time.Second},
		QueueConfig:   QueueConfig{QueueInstances: 20, QueueDispatchers: []int{1}, QueueLockTimeout: time.Second},
		WorkerConfig:  WorkerConfig{WorkerDispatchers: []int{2}, WorkerItems: 20},
		ScaleConfig: ScaleConfig{ScaleBlocked: []int{10, 100}, ScaleSpreadInstances: 5, ScaleClaimable: 2, ScaleCompleted: []int{0, 20},
			ScaleCalls: 7, ScaleIdleDispatchers: 2, ScaleIdleDuration: 200 * time.Millisecond},
	}
}

func TestSmokeRun(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := smokeConfig()
	var steps []Progress
	start := time.Now()
	res, err := Run(ctx, s, cfg, func(p Progress) { steps = append(steps, p) })
	require.NoError(t, err)
	t.Logf("smoke run took %v", time.Since(start).Round(time.Millisecond))
	require.Equal(t, cfg.Steps(), steps[len(steps)-1].Step)
	require.Len(t, res.Cells, 4)
	require.Len(t, res.Worker, 2, "worker N=2 without and with sessions")
	for _, c := range res.Worker {
		f := c.Figure("cycles_per_s")
		require.NotNil(t, f, c.Name())
		require.Greater(t, *f.After, 0.0, c.Name())
		require.Equal(t, 0.0, *c.Figure("refused_acks").After, c.Name())
	}
	for _, c := range res.Cells {
		require.NotEmpty(t, c.Figures, c.Name())
		if c.Scenario == ScenarioMigrate {
			require.NotNil(t, c.Figure("wall_ms").Before)
			require.NotNil(t, c.Figure("wall_ms").After)
			continue
		}
		f := c.Figure("cycles_per_s")
		require.NotNil(t, f.Before, c.Name())
		require.NotNil(t, f.After, c.Name())
	}
	// After the fix, with an ample lock timeout, everything works.
	for _, c := range res.Cells {
		if c.Scenario == ScenarioMigrate {
			continue
		}
		require.Greater(t, *c.Figure("cycles_per_s").After, 0.0, c.Name())
		require.Equal(t, 0.0, *c.Figure("ack_failures").After, c.Name())
	}
	q := res.Cell(queueOnly, 1).Figure("cycles_per_s")
	require.NotNil(t, q.Bare)
	require.Greater(t, *q.Bare, 0.0)
	require.Len(t, res.Scale, 7, "spread K=10 and 100, idle, fan-in K=10 and 100, completed C=0 and 20")
	require.Len(t, res.Targets, 6+4+4+1, "the dispatcher targets, then scale: K growth x4, never slower x4, flat over completed")

	var out bytes.Buffer
	require.NoError(t, PrintTable(&out, &res))
	require.NoError(t, WriteReport(t.TempDir(), &res))
}

// Defaults is a zero Config with its defaults: every field of it, the
// scenarios' own included, must then be set, or some scenario's
// settings forgot one. The hot lock timeout alone is zero: it is
// calibrated.
func TestDefaultsLeaveNoFieldZero(t *testing.T) {
	var zero []string
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		for i := range v.NumField() {
			f, field := v.Field(i), v.Type().Field(i)
			switch {
			case field.Anonymous && f.Kind() == reflect.Struct:
				walk(f)
			case f.IsZero() && field.Name != "HotLockTimeout":
				zero = append(zero, field.Name)
			}
		}
	}
	d := Defaults()
	walk(reflect.ValueOf(d))
	require.Empty(t, zero, "fields Defaults leaves zero")
	require.True(t, d.CalibrateHotLockTimeout)
	require.Equal(t, 3*(8+2+6+2+8+2*10+4*5), d.Steps(), "the full benchmark's cells, as before")
}

func TestWithDefaultsFillsEveryZeroFieldAndKeepsGivenLists(t *testing.T) {
	c := Config{Rounds: 0, HotConfig: HotConfig{HotDispatchers: 4}, QueueConfig: QueueConfig{QueueDispatchers: []int{}}, Duration: time.Second}.WithDefaults()
	require.Equal(t, Defaults().Rounds, c.Rounds, "a zero count takes the default")
	require.Equal(t, 4, c.HotDispatchers, "a count given stays")
	require.Equal(t, time.Second, c.Duration, "a duration given stays")
	require.Empty(t, c.QueueDispatchers, "an empty list is taken as given")
	require.Equal(t, Defaults().BacklogDispatchers, c.BacklogDispatchers, "a nil list takes the default")
	require.True(t, c.CalibrateHotLockTimeout, "no hot lock timeout given: calibrated, as by default")
	neg := Config{Rounds: -1}.WithDefaults()
	require.Equal(t, -1, neg.Rounds, "a negative count is not replaced")
	require.EqualError(t, neg.Validate(), "bench: Config.Rounds must not be negative")
	fixed := Config{HotConfig: HotConfig{HotLockTimeout: time.Second}}.WithDefaults()
	require.False(t, fixed.CalibrateHotLockTimeout, "a hot lock timeout given is used as given")
	require.NoError(t, fixed.Validate())
}

// Validate is the one check of a config, the lab command's included: the
// bounds it holds whichever scenarios run.
func TestValidateHoldsTheCommandsBounds(t *testing.T) {
	for name, edit := range map[string]func(*Config){
		"a cell under 100ms":         func(c *Config) { c.Duration = 99 * time.Millisecond },
		"a cell over 10m":            func(c *Config) { c.Duration = 11 * time.Minute },
		"3 scale calls":              func(c *Config) { c.ScaleCalls = 3 },
		"no idle dispatcher":         func(c *Config) { c.ScaleIdleDispatchers = 0 },
		"idle polling under 100ms":   func(c *Config) { c.ScaleIdleDuration = time.Millisecond },
		"a negative hot timeout":     func(c *Config) { c.HotLockTimeout, c.CalibrateHotLockTimeout = -time.Second, false },
		"a dispatcher count below 1": func(c *Config) { c.QueueDispatchers = []int{0} },
	} {
		c := Defaults()
		c.Scenarios = []string{backlog}
		edit(&c)
		require.Error(t, c.Validate(), name)
	}
	c := Defaults()
	c.Scenarios = nil
	require.NoError(t, c.Validate(), "the defaults, with no scenario of package bench named (the lab's own scenarios only)")
}
