package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/harness/testenv/upstream"
)

// TestRuntimeSmokeRun runs the runtime scenario small: the real runtime on
// the three sides, one round, ten orchestrations and a fan-in of twenty.
func TestRuntimeSmokeRun(t *testing.T) {
	upstream.Require(t)
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg := Config{Rounds: 1, Duration: 100 * time.Millisecond, Scenarios: []string{Runtime},
		RuntimeOrchestrationConcurrency: []int{2}, RuntimeWorkerConcurrency: []int{2}, RuntimeOrchestrations: []int{10}, RuntimeFanIn: 20}
	res, err := Run(ctx, s, cfg, nil)
	require.NoError(t, err)
	rb := res.Runtime
	require.NotNil(t, rb)
	require.Len(t, rb.Cells, 2, "one load cell and the fan-in")
	prev, latest := RuntimeVersions()
	require.Equal(t, []int64{prev, latest}, []int64{rb.PreviousVersion, rb.LatestVersion})
	require.Less(t, prev, latest)
	for _, c := range rb.Cells {
		require.Len(t, c.Rounds, 3, "%s: every side once", c.Name())
		for _, side := range RuntimeSides() {
			if c.FanIn == 0 {
				require.NotNil(t, c.PerSecond[side], "%s %s", c.Name(), side)
				require.Greater(t, *c.PerSecond[side], 0.0)
			}
			require.NotNil(t, c.WallMs[side])
		}
		for _, r := range c.Rounds {
			if r.Side != RuntimeUpstream {
				require.Zero(t, r.Sample.LeaseLines, "%s %s: no line of the lease kind on the pack", c.Name(), r.Side)
			}
		}
	}
	require.Contains(t, rb.Statements, "pg_stat_statements", "the test server loads it")
	load := rb.Cells[0]
	for _, side := range RuntimeSides() {
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
	md := Markdown(&res, "")
	require.Contains(t, md, "## The real runtime")
	require.Contains(t, md, "track = all")
	require.True(t, strings.HasPrefix(md, "# Benchmark: what duroxide-pg users run today"), "the runtime comparison is the headline")
}

func TestRuntimeTargetsReportEachRatio(t *testing.T) {
	rb := &RuntimeBench{PreviousVersion: 26, LatestVersion: 27, Cells: []RuntimeCell{
		{OrchestrationConcurrency: 1, WorkerConcurrency: 1, Orchestrations: 10,
			PerSecond: map[string]*float64{RuntimeUpstream: fp(10), RuntimePrevious: fp(12), RuntimeLatest: fp(11)}},
		{OrchestrationConcurrency: 16, WorkerConcurrency: 16, Orchestrations: 10,
			PerSecond:    map[string]*float64{RuntimeUpstream: fp(10), RuntimePrevious: fp(14), RuntimeLatest: fp(16)},
			CPUMsPerOrch: map[string]*float64{RuntimeUpstream: fp(30), RuntimeLatest: fp(20)}},
	}}
	got := map[string]bool{}
	for _, tg := range runtimeTargets(rb) {
		require.True(t, tg.Measured, tg.Name)
		got[tg.Name] = tg.Met
	}
	require.Equal(t, map[string]bool{
		"runtime 16/16: orchestrations/s, latest against upstream":                   true,  // 1.6x
		"runtime 16/16: server CPU per orchestration, latest against upstream":       false, // 0.67x
		"runtime 1/1: orchestrations/s, latest against upstream":                     true,  // 1.1x
		"runtime 1/1 x10: orchestrations/s, latest (0027) against previous (0026)":   false, // 0.92x
		"runtime 16/16 x10: orchestrations/s, latest (0027) against previous (0026)": true,
	}, got)
}
