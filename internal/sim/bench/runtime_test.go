package bench

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// TestRuntimeSmokeRun runs the runtime scenario small: the real runtime on
// the four sides, one round, ten orchestrations and a fan-in of twenty.
func TestRuntimeSmokeRun(t *testing.T) {
	upstream.Require(t)
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg := Config{Rounds: 1, Duration: 100 * time.Millisecond, Scenarios: []string{ScenarioRuntime},
		RuntimeConfig: RuntimeConfig{RuntimeOrchestrationConcurrency: []int{2}, RuntimeWorkerConcurrency: []int{2}, RuntimeOrchestrations: []int{10}, RuntimeFanIn: 20, RuntimeUncontended: 3}}
	res, err := Run(ctx, s, cfg, nil)
	require.NoError(t, err)
	rb := res.Runtime
	require.NotNil(t, rb)
	require.Len(t, rb.Cells, 3, "the uncontended cell, one load cell and the fan-in")
	require.True(t, rb.Cells[0].OneAtATime)
	require.Equal(t, "runtime 1/1 x3 one at a time", rb.Cells[0].Name())
	prev, latest := RuntimeVersions()
	require.Equal(t, []int64{prev, latest}, []int64{rb.PreviousVersion, rb.LatestVersion})
	require.Less(t, prev, latest)
	for _, c := range rb.Cells {
		require.Len(t, c.Rounds, len(runtimeSides()), "%s: every side once", c.Name())
		for _, side := range runtimeSides() {
			if c.FanIn == 0 {
				require.NotNil(t, c.PerSecond[side], "%s %s", c.Name(), side)
				require.Greater(t, *c.PerSecond[side], 0.0)
			}
			require.NotNil(t, c.WallMs[side])
		}
		for _, r := range c.Rounds {
			if slices.Contains(runtimePackSides(), r.Side) {
				require.Zero(t, r.Sample.LeaseLines, "%s %s: no line of the lease kind on the pack", c.Name(), r.Side)
			}
		}
	}
	require.Contains(t, rb.Statements, "pg_stat_statements", "the test server loads it")
	for _, side := range runtimeSides() {
		require.Equal(t, int64(3), rb.Cells[0].Functions[side]["enqueue_orchestrator_work"].Calls, "%s: the uncontended cell started its three", side)
	}
	load := rb.Cells[1]
	for _, side := range runtimeSides() {
		f := load.Functions[side]["fetch_orchestration_item"]
		require.Positive(t, f.Calls, side)
		require.Equal(t, int64(10), load.Functions[side]["enqueue_orchestrator_work"].Calls, "%s: one start per orchestration", side)
		require.NotContains(t, load.Functions[side], "_duroxide_migrations", "tables are not functions")
	}
	require.Len(t, rb.Nested, 2, "the track = all pass: upstream and latest")
	for _, n := range rb.Nested {
		require.NotEmpty(t, n.Statements, n.Side)
	}
	for _, r := range load.Rounds {
		require.Positive(t, r.Sample.Turns, "turns are counted")
	}
	var out bytes.Buffer
	require.NoError(t, PrintTable(&out, &res))
	require.Contains(t, out.String(), "fetch_orchestration_item")
	md := markdown(&res, "")
	require.Contains(t, md, "## The real runtime")
	require.Contains(t, md, "track = all")
	require.True(t, strings.HasPrefix(md, "# Benchmark: what duroxide-pg users run today"), "the runtime comparison is the headline")
}

func TestRuntimeTargetsReportEachRatio(t *testing.T) {
	// Two rounds per side: the medians are the mean of the two.
	rounds := func(perSecond, cpu map[string][2]float64) []Round[RuntimeSample] {
		var out []Round[RuntimeSample]
		for side, ps := range perSecond {
			for i := range 2 {
				out = append(out, Round[RuntimeSample]{Round: i + 1, Side: side, Sample: RuntimeSample{PerSecond: fp(ps[i]), CPUMsPerOrch: fp(cpu[side][i])}})
			}
		}
		return out
	}
	rb := &RuntimeBench{PreviousVersion: 26, LatestVersion: 27, Cells: []RuntimeCell{
		{OrchestrationConcurrency: 1, WorkerConcurrency: 1, Orchestrations: 10, Rounds: rounds(
			map[string][2]float64{runtimeUpstream: {10, 10}, runtimePrevious: {12, 12}, runtimeLatest: {11, 11}},
			map[string][2]float64{runtimeUpstream: {20, 20}, runtimePrevious: {20, 20}, runtimeLatest: {19, 21}})},
		{OrchestrationConcurrency: 16, WorkerConcurrency: 16, Orchestrations: 10, Rounds: rounds(
			map[string][2]float64{runtimeUpstream: {10, 10}, runtimePrevious: {14, 14}, runtimeLatest: {12, 20}},
			map[string][2]float64{runtimeUpstream: {30, 30}, runtimePrevious: {30, 30}, runtimeLatest: {30, 36}})},
		{OrchestrationConcurrency: 16, WorkerConcurrency: 16, FanIn: 50},
	}}
	for i := range rb.Cells {
		rb.Cells[i].computeFigures()
	}
	got := map[string]Target{}
	for _, tg := range runtimeTargets(rb) {
		require.True(t, tg.Measured, tg.Name)
		require.NotContains(t, tg.Name, "one at a time", "no uncontended cell, no per-function target")
		require.NotContains(t, tg.Name, "fan-in", "the fan-in has no throughput target")
		got[tg.Name] = tg
	}
	met := map[string]bool{}
	for n, tg := range got {
		met[n] = tg.Met
	}
	require.Equal(t, map[string]bool{
		"runtime 1/1 x10: server CPU per orchestration, latest against upstream":     true,  // 1.00x
		"runtime 1/1 x10: orchestrations/s, latest against upstream":                 true,  // 1.10x
		"runtime 16/16 x10: server CPU per orchestration, latest against upstream":   false, // 1.10x
		"runtime 16/16 x10: orchestrations/s, latest against upstream":               true,  // 1.60x
		"runtime 1/1 x10: orchestrations/s, latest (0027) against previous (0026)":   false, // 0.92x
		"runtime 16/16 x10: orchestrations/s, latest (0027) against previous (0026)": true,  // 1.14x
	}, met)
	cpu1 := got["runtime 1/1 x10: server CPU per orchestration, latest against upstream"]
	require.Equal(t, "1.00x (2 rounds: 0.95-1.05x, ±5%)", cpu1.Got)
	require.Empty(t, cpu1.Reason, "met, and its rounds within ±10%")
	ps16 := got["runtime 16/16 x10: orchestrations/s, latest against upstream"]
	require.Equal(t, "1.60x (2 rounds: 1.20-2.00x, ±25%)", ps16.Got)
	require.Contains(t, ps16.Reason, "spread ±25% over 2 rounds, above ±10%")
	cpu16 := got["runtime 16/16 x10: server CPU per orchestration, latest against upstream"]
	require.Contains(t, cpu16.Reason, "server CPU-seconds per second of run", "a miss says where the time went")
}

func TestUncontendedTargetsJudgeEveryFunctionAndNameTheFixThatIntendsAMiss(t *testing.T) {
	fns := func(means map[string]float64, calls int64) map[string]FunctionStat {
		out := map[string]FunctionStat{}
		for n, m := range means {
			out[n] = FunctionStat{Calls: calls, TotalMs: m * float64(calls)}
		}
		return out
	}
	c := &RuntimeCell{OrchestrationConcurrency: 1, WorkerConcurrency: 1, Orchestrations: 60, OneAtATime: true,
		Rounds: []Round[RuntimeSample]{{Side: runtimeUpstream}, {Side: runtimeLatest}},
		Functions: map[string]map[string]FunctionStat{
			runtimeUpstream: fns(map[string]float64{"fetch_history": 0.10, "ack_worker": 0.20, "get_custom_status": 0.10, "fetch_orchestration_item": 0.5}, 100),
			runtimeLatest:   fns(map[string]float64{"fetch_history": 0.105, "ack_worker": 0.40, "get_custom_status": 0.13, "fetch_orchestration_item": 0.7}, 100),
		}}
	c.Functions[runtimeUpstream]["get_queue_depths"] = FunctionStat{Calls: 1, TotalMs: 1}
	c.Functions[runtimeLatest]["get_queue_depths"] = FunctionStat{Calls: 1, TotalMs: 5}
	got := map[string]Target{}
	for _, tg := range uncontendedTargets(c, 27) {
		got[strings.TrimPrefix(strings.TrimSuffix(tg.Name, " mean per call, latest against upstream"), "runtime 1/1 x60 one at a time: ")] = tg
	}
	require.Len(t, got, 4, "a function of one call a run is not judged")
	require.True(t, got["fetch_history"].Met, "1.05x")
	require.False(t, got["get_custom_status"].Met, "1.30x")
	require.Empty(t, got["get_custom_status"].Reason, "no fix intends it")
	require.False(t, got["ack_worker"].Met)
	require.Contains(t, got["ack_worker"].Reason, "0027_fetch_by_instance_head.sql", "0027's Costs line names it")
	require.Contains(t, got["fetch_orchestration_item"].Reason, "0020_fetch_lease_valid_at_return.sql redefines it")
	require.Equal(t, "2.00x (0.400 against 0.200 ms)", got["ack_worker"].Got)
}

func TestARuntimeMissSaysWhereTheTimeWent(t *testing.T) {
	sample := func(cpuS, wallMs float64) RuntimeSample { return RuntimeSample{ServerCPUS: fp(cpuS), WallMs: wallMs} }
	c := &RuntimeCell{OrchestrationConcurrency: 16, WorkerConcurrency: 16, Orchestrations: 400,
		Rounds: []Round[RuntimeSample]{{Side: runtimeUpstream, Sample: sample(8, 10000)}, {Side: runtimeLatest, Sample: sample(3, 6000)}},
		Functions: map[string]map[string]FunctionStat{
			runtimeUpstream: {"fetch_orchestration_item": {Calls: 900, TotalMs: 9000}, "ack_worker": {Calls: 1200, TotalMs: 200}},
			runtimeLatest:   {"fetch_orchestration_item": {Calls: 900, TotalMs: 1000}, "ack_worker": {Calls: 1200, TotalMs: 500}, "fetch_work_item": {Calls: 10, TotalMs: 50}},
		}}
	got := c.missReason(runtimeLatest, runtimeUpstream, 1)
	require.Equal(t, "server CPU-seconds per second of run: 0.50 at latest, 0.80 at upstream; "+
		"ms/run latest against upstream: ack_worker +300, fetch_work_item +50; fetch_orchestration_item -8000", got)
}
