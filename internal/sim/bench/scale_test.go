package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/duroxide-pg/migrations/internal/packfacts"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

func TestScaleComparesTheVersionBeforeTheFirstFetchFixWithTheLatest(t *testing.T) {
	before, after, verr := ScaleVersions()
	require.NoError(t, verr)
	bug, _, verr := packfacts.FetchFix()
	require.NoError(t, verr)
	require.Equal(t, bug, before)
	require.Equal(t, migrations.Latest(), after)
}

func TestScaleCellsOfTheDefaultsAreTheIssuesCells(t *testing.T) {
	var names []string
	for _, c := range scaleCells(Defaults(), 1, 2) {
		names = append(names, c.Name())
		require.Equal(t, int64(1), c.BeforeVersion)
		require.Equal(t, int64(2), c.AfterVersion)
	}
	require.Equal(t, []string{"spread K=1k", "spread K=10k", "spread K=100k", "idle N=32 K=100k",
		"fan_in K=1k", "fan_in K=10k", "fan_in K=100k", "completed C=0", "completed C=10k", "completed C=100k"}, names)
	cells := scaleCells(Defaults(), 1, 2)
	require.Equal(t, 500, cells[2].LeasedInstances, "spread: K over 500 leased instances")
	require.Equal(t, 1, cells[6].LeasedInstances, "fan-in: every message on one instance")
	require.Equal(t, int64(100), cells[3].PollIntervalMs, "idle dispatchers poll at the runtime's cycle")
}

func TestScaleConfigRejectsTooFewCallsForTheSteadyPlan(t *testing.T) {
	c := Defaults()
	c.ScaleCalls = steadyFirstCall - 1
	require.Error(t, c.Validate())
	c = Defaults()
	c.ScaleBlocked = []int{0}
	require.Error(t, c.Validate())
}

func TestPhasesSplitCustomPlanCallsFromSteadyOnes(t *testing.T) {
	us := []int64{9000, 1000, 2000, 3000, 4000, 5000, 7000, 8000, 9000}
	early, steady := phases(us)
	require.Equal(t, 2.5, *early, "calls 2-5: median of 1, 2, 3, 4 ms")
	require.Equal(t, 8.0, *steady, "calls 7-9: median of 7, 8, 9 ms")
	early, steady = phases(us[:5])
	require.NotNil(t, early)
	require.Nil(t, steady, "a session of 5 calls never reached the steady plan")
	require.Equal(t, "100k", count(100000))
	require.Equal(t, "1.5k", count(1500))
	require.Equal(t, "37", count(37))
}

// scaleSynthetic is a result with two blocked cells per seeding and two
// completed cells, after flat and faster than before except where noted.
func scaleSynthetic(t *testing.T) *Result {
	t.Helper()
	r := &Result{Settings: settingsOf(Defaults())}
	before, after, verr := ScaleVersions()
	require.NoError(t, verr)
	add := func(c ScaleCell, b, a scaleSample) {
		c.BeforeVersion, c.AfterVersion = before, after
		c.Rounds = []Round[scaleSample]{{Round: 1, Side: sideBefore, Sample: b}, {Round: 1, Side: sideAfter, Sample: a}}
		c.computeFigures(scaleFigures())
		r.Scale = append(r.Scale, c)
	}
	fetch := func(empty, row float64) scaleSample {
		return scaleSample{EmptyEarlyMs: fp(empty), EmptySteadyMs: fp(empty), RowEarlyMs: fp(row), RowSteadyMs: fp(row)}
	}
	add(ScaleCell{Kind: scaleBlockedKind, Seeding: seedSpread, Blocked: 1000}, fetch(1, 2), fetch(1, 2))
	add(ScaleCell{Kind: scaleBlockedKind, Seeding: seedSpread, Blocked: 100000}, fetch(700, 650), fetch(300, 290))
	add(ScaleCell{Kind: scaleBlockedKind, Seeding: seedFanIn, Blocked: 1000}, fetch(1, 2), fetch(0.5, 1))
	add(ScaleCell{Kind: scaleBlockedKind, Seeding: seedFanIn, Blocked: 100000}, fetch(30, 40), fetch(0.6, 1.5))
	cycle := func(f, a float64) scaleSample {
		return scaleSample{CycleFetchEarlyMs: fp(f), CycleFetchSteadyMs: fp(f), CycleAckSteadyMs: fp(a), CycleSteadyMs: fp(f + a),
			EmptyEarlyMs: fp(0.2), EmptySteadyMs: fp(0.2)}
	}
	add(ScaleCell{Kind: scaleCompletedKind, Completed: 0}, cycle(1, 0.5), cycle(1, 0.5))
	add(ScaleCell{Kind: scaleCompletedKind, Completed: 100000}, cycle(1.1, 0.5), cycle(12, 0.5))
	r.Targets = evaluateTargets(r)
	return r
}

func TestScaleTargetsAreMarkedWithTheirReasons(t *testing.T) {
	r := scaleSynthetic(t)
	by := map[string]Target{}
	for _, tg := range r.Targets {
		by[tg.Name] = tg
	}
	spread := by["scale spread: one-row fetch at K=100k within 2x of K=1k (after)"]
	require.True(t, spread.Measured)
	require.False(t, spread.Met, "290 ms against 2 ms")
	require.Contains(t, spread.Got, "145.00x (290 vs 2 ms)")
	require.Contains(t, spread.Reason, "linear in K")
	fanIn := by["scale fan_in: one-row fetch at K=100k within 2x of K=1k (after)"]
	require.True(t, fanIn.Met, "1.5 ms against 1 ms")
	require.Empty(t, fanIn.Reason)
	require.True(t, by["scale spread K=100k: after never slower than before"].Met)
	require.True(t, by["scale fan_in K=1k: after never slower than before"].Met)
	flat := by["scale: fetch and cycle cost flat from 0 to 100k completed instances (after)"]
	require.False(t, flat.Met, "the cycle's fetch grew 12x")
	require.Contains(t, flat.Reason, "completed instances")
	for _, tg := range r.Targets {
		if strings.HasPrefix(tg.Name, "scale") {
			require.True(t, tg.Measured, tg.Name)
			require.True(t, tg.Met || tg.Reason != "", "a missed target says why: %s", tg.Name)
		}
	}

	var svg bytes.Buffer
	require.NoError(t, scaleSVG(&svg, r))
	require.Equal(t, 8, strings.Count(svg.String(), "<polyline"), "one-row and empty, before and after, both seedings")
	md := markdown(r, "")
	require.Contains(t, md, "### scale")
	require.Contains(t, md, "](scale.svg)")
	require.Contains(t, md, "| spread K=100k | empty fetch, early (calls 2-5) | 700 ms | 300 ms | 0.43x |")
}

func TestScaleSeedingMatchesTheRuntimesShapes(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := s.CreateDatabase(ctx, "harness_bench_scale_", "")
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.DropDatabase(context.Background(), db) })
	src := testdb.MustSource(t, s.DSN(db))
	before, _, verr := ScaleVersions()
	require.NoError(t, verr)
	require.NoError(t, migrateSchema(ctx, src, "seeded", before))

	n, err := seedScale(ctx, src, "seeded", scaleShape{Leased: 5, Blocked: 37, Ready: 2, Completed: 4, CompletedHistory: 10,
		Large: 1, LargeHistory: 50, EventBytes: 250})
	require.NoError(t, err)
	require.Equal(t, 37, n, "exactly K messages behind live leases")

	conn, err := src.Connect(ctx)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var item, event string
	require.NoError(t, conn.QueryRow(ctx, "SELECT work_item FROM seeded.orchestrator_queue WHERE instance_id = 'scale-blk-2' ORDER BY id LIMIT 1").Scan(&item))
	require.Equal(t, orch.ExternalEventWorkItem("scale-blk-2", dispatch.EventName, "b-2"), item, "the SQL builds the work item the simulators build")
	var leased, completed, histories int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(DISTINCT instance_id) FROM seeded.orchestrator_queue").Scan(&leased))
	require.Equal(t, 5, leased, "spread round-robin over the leased instances")
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM seeded.executions WHERE status = 'Completed' AND duroxide_version_minor IS NOT NULL").Scan(&completed))
	require.Equal(t, 4, completed)
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM seeded.history WHERE instance_id LIKE 'scale-done-%'").Scan(&histories))
	require.Equal(t, 40, histories)
	require.NoError(t, conn.QueryRow(ctx, "SELECT event_data FROM seeded.history WHERE instance_id = 'scale-done-1' AND event_id = 10").Scan(&event))
	require.Contains(t, event, `"type" : "OrchestrationCompleted"`)
	var bigEvents, bigBytes int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*), sum(length(event_data)) FROM seeded.history WHERE instance_id = 'scale-big-1'").Scan(&bigEvents, &bigBytes))
	require.Equal(t, 50, bigEvents)
	require.InDelta(t, 250, bigBytes/bigEvents, 60, "events of about EventBytes")

	it, err := orch.New("seeded").Fetch(ctx, conn, time.Now().UnixMilli(), 30000, orch.RuntimeFilter())
	require.NoError(t, err)
	require.Nil(t, it, "nothing claimable: the ready instances have no message until readyMessages")
	require.NoError(t, readyMessages(ctx, conn, "seeded", 2))
	it, err = orch.New("seeded").Fetch(ctx, conn, time.Now().UnixMilli(), 30000, orch.RuntimeFilter())
	require.NoError(t, err)
	require.NotNil(t, it, "a ready instance behind the blocked messages, inside the version filter")
	require.True(t, strings.HasPrefix(it.InstanceID, readyPrefix), it.InstanceID)
	require.NoError(t, clearReady(ctx, conn, "seeded"))
	n, err = countBlocked(ctx, conn, "seeded", time.Now().UnixMilli())
	require.NoError(t, err)
	require.Equal(t, 37, n, "clearing the ready instances leaves the blocked messages")
}

// scaleConfig is the scale scenario alone at tiny sizes.
func scaleConfig() Config {
	c := smokeConfig()
	c.Scenarios = []string{scale}
	c.ScaleBlocked = []int{10, 100, 1000}
	return c
}

func TestScaleRunProducesEveryFigureAndTarget(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := scaleConfig()
	start := time.Now()
	res, err := Run(ctx, s, cfg, nil)
	require.NoError(t, err)
	t.Logf("scale run at tiny sizes took %v", time.Since(start).Round(time.Millisecond))
	require.Len(t, res.Scale, 3+1+3+2)
	for _, c := range res.Scale {
		name := c.Name()
		require.Len(t, c.Rounds, 2*cfg.Rounds, name)
		switch c.Kind {
		case scaleBlockedKind:
			require.Equal(t, map[string]int{sideBefore: c.Blocked, sideAfter: c.Blocked}, c.SeededBlocked, "%s: seeding created exactly K blocked messages", name)
			for _, r := range c.Rounds {
				require.Equal(t, cfg.ScaleCalls, r.Sample.EmptyCalls, name)
				require.Zero(t, r.Sample.EmptyRowsReturned, "%s %s: the empty fetch returned no row", name, r.Side)
				require.Equal(t, r.Sample.RowCalls, r.Sample.RowRowsReturned, "%s %s: every one-row fetch returned a row", name, r.Side)
			}
			for _, key := range []string{"empty_fetch_early_ms", "empty_fetch_steady_ms", "row_fetch_early_ms", "row_fetch_steady_ms"} {
				f := c.Figure(key)
				require.NotNil(t, f, "%s %s", name, key)
				require.NotNil(t, f.Before, "%s %s", name, key)
				require.NotNil(t, f.After, "%s %s", name, key)
			}
		case scaleIdleKind:
			require.Equal(t, cfg.ScaleIdleDispatchers, c.Dispatchers)
			f := c.Figure("polls_per_s")
			require.NotNil(t, f, name)
			require.Greater(t, *f.After, 0.0, "%s: the idle dispatchers polled", name)
		case scaleCompletedKind:
			for _, r := range c.Rounds {
				require.Equal(t, cfg.ScaleCalls, r.Sample.CycleAcks, "%s %s: every cycle acked", name, r.Side)
				require.Equal(t, cfg.ScaleCalls, r.Sample.LargeRowsReturned, "%s %s: every large-history fetch returned it", name, r.Side)
			}
			for _, key := range []string{"cycle_fetch_steady_ms", "cycle_ack_steady_ms", "cycle_steady_ms", "empty_fetch_steady_ms", "large_history_fetch_steady_ms"} {
				require.NotNil(t, c.Figure(key), "%s %s", name, key)
			}
		}
	}
	var scaleTargets int
	for _, tg := range res.Targets {
		if strings.HasPrefix(tg.Name, "scale") {
			scaleTargets++
			require.True(t, tg.Measured, tg.Name)
			require.True(t, tg.Met || tg.Reason != "", "%s is met or says why not", tg.Name)
		}
	}
	require.Equal(t, 4+6+1, scaleTargets, "K growth x4, never slower per blocked cell, flat over completed")

	var out bytes.Buffer
	require.NoError(t, PrintTable(&out, &res))
	t.Log("\n" + out.String())
	require.Contains(t, out.String(), "spread K=1k")
	dir := t.TempDir()
	require.NoError(t, WriteReport(dir, &res))
	md, err := os.ReadFile(filepath.Join(dir, ReportFile))
	require.NoError(t, err)
	require.Contains(t, string(md), "### scale")
	svg, err := os.ReadFile(filepath.Join(dir, ScaleFile))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(svg), "<svg"))
	raw, err := os.ReadFile(filepath.Join(dir, JSONFile))
	require.NoError(t, err)
	before, after, verr := ScaleVersions()
	require.NoError(t, verr)
	for _, k := range []string{`"scale_cells"`, `"seeded_blocked"`, `"empty_fetch_steady_ms"`, `"row_fetch_early_ms"`, `"server_cpu_s_per_s"`,
		`"cycle_ack_steady_ms"`, fmt.Sprintf(`"before_version": %d`, before), fmt.Sprintf(`"after_version": %d`, after)} {
		require.Contains(t, string(raw), k)
	}
}

func TestHotLockTimeoutIsCalibratedAtStart(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := smokeConfig()
	cfg.Scenarios, cfg.HotLockTimeout, cfg.CalibrateHotLockTimeout = []string{ScenarioHot}, 0, true
	res, err := Run(ctx, s, cfg, nil)
	require.NoError(t, err)
	require.NotNil(t, res.HotCalibration, "the hot lock timeout is calibrated")
	require.Equal(t, res.HotCalibration.LockTimeoutMs, res.Settings.HotLockTimeoutMs)
	require.Equal(t, res.HotCalibration.LockTimeoutMs, res.Cell(ScenarioHot, cfg.HotDispatchers).LockTimeoutMs, "the hot cell runs with it")
	var out bytes.Buffer
	require.NoError(t, PrintTable(&out, &res))
	require.Contains(t, out.String(), "calibrated at start like the organic repro")
}
