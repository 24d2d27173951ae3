package repro

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// poolResult is a result as the form gives it when it passes: refused acks
// on upstream and its candidate, none on the pack, every hold done.
func poolResult() RuntimePoolResult {
	holds := []RuntimePoolHold{
		{HeldMs: 6500, ReadyAtTake: 520, BlockedOnLock: 1, BlockedWaits: []string{"RowShareLock on runtime_pool_upstream.worker_queue"}},
		{HeldMs: 6500, ReadyAtTake: 390, BlockedOnLock: 1, BlockedWaits: []string{"RowShareLock on runtime_pool_upstream.worker_queue"}},
		{HeldMs: 6500, ReadyAtTake: 260, BlockedOnLock: 1, BlockedWaits: []string{"RowShareLock on runtime_pool_upstream.worker_queue"}},
	}
	side := func(key string, invalid int) RuntimePoolSide {
		s := RuntimePoolSide{Side: key, Schema: "runtime_pool_" + key, Made: "made for " + key,
			Holds: holds, HoldsDone: 3, Expected: 600, Completed: 600, Status: "Completed",
			InvalidLockTokens: invalid, RefusedTurns: invalid / 4, LeaseLines: invalid,
			SlowAcquires: 15, SlowAcquireMaxMs: 6529, SlowAcquireP50Ms: 6506}
		s.Leases = FetchLeases{Leases: 600, Stale: 12, MaxStaleMs: 6490}
		if invalid > 0 {
			s.Leases.StaleDead, s.Leases.DeadAtReturn = 12, 12
			s.Sample = []string{"WARN duroxide::runtime::dispatchers::orchestration: ack_orchestration_item failed with non-retryable error error=ack_orchestration_item: Invalid lock token"}
		}
		return s
	}
	r := RuntimePoolResult{Addon: "addon", Settings: RuntimePoolDefaults().echo(),
		sidesVerdict: sidesVerdict[RuntimePoolSide]{Sides: []RuntimePoolSide{side(SideUpstream, 48), side(SideCandidate, 44), side(SidePack, 0)}}}
	r.judge()
	return r
}

func TestRuntimePoolVerdictNeedsBothUpstreamSidesRefusedAndTheStressedPackClean(t *testing.T) {
	require.True(t, poolResult().OK())
	for name, spoil := range map[string]func(*RuntimePoolResult){
		"upstream logged no Invalid lock token":  func(r *RuntimePoolResult) { r.Sides[0].InvalidLockTokens = 0 },
		"the candidate logged none":              func(r *RuntimePoolResult) { r.Sides[1].InvalidLockTokens = 0 },
		"upstream did not run":                   func(r *RuntimePoolResult) { r.Sides = r.Sides[1:] },
		"no upstream fetch met the condition":    func(r *RuntimePoolResult) { r.Sides[0].Leases.Stale, r.Sides[0].Leases.StaleDead = 0, 0 },
		"a stale upstream lease alive at return": func(r *RuntimePoolResult) { r.Sides[0].Leases.StaleDead = 11 },
		"no candidate fetch met the condition":   func(r *RuntimePoolResult) { r.Sides[1].Leases.Stale, r.Sides[1].Leases.StaleDead = 0, 0 },
	} {
		r := poolResult()
		spoil(&r)
		r.judge()
		require.False(t, r.Reproduced, name)
		require.True(t, r.Fixed, name)
		require.False(t, r.OK(), name)
	}
	for name, spoil := range map[string]func(*RuntimePoolSide){
		"a line of the lease kind":       func(s *RuntimePoolSide) { s.LeaseLines = 1 },
		"an orchestration not completed": func(s *RuntimePoolSide) { s.Completed = 599 },
		"a wrong output":                 func(s *RuntimePoolSide) { s.Wrong = 1 },
		"no orchestration at all":        func(s *RuntimePoolSide) { s.Expected, s.Completed = 0, 0 },
		"no fetch met the condition":     func(s *RuntimePoolSide) { s.Leases.Stale = 0 },
		"a lease dead at return":         func(s *RuntimePoolSide) { s.Leases.DeadAtReturn = 1 },
	} {
		r := poolResult()
		spoil(&r.Sides[2])
		r.judge()
		require.True(t, r.Reproduced, name)
		require.False(t, r.Fixed, name)
	}
	r := poolResult()
	r.Sides = r.Sides[:2]
	r.judge()
	require.False(t, r.Fixed, "no pack side")

	// Without the candidate, upstream alone decides; with the amended
	// candidate, it must run as clean as the pack.
	r = poolResult()
	r.Sides = []RuntimePoolSide{r.Sides[0], r.Sides[2]}
	r.judge()
	require.True(t, r.OK(), "upstream and the pack only")
	r = poolResult()
	amended := r.Sides[2]
	amended.Side = SideAmended
	r.Sides = append(r.Sides, amended)
	r.judge()
	require.True(t, r.OK(), "the amended candidate clean")
	r.Sides[3].LeaseLines = 1
	r.judge()
	require.True(t, r.Reproduced)
	require.False(t, r.Fixed, "the amended candidate had a lease line")
}

func TestRuntimePoolConfigRefusesSettingsThatCannotShowTheSymptom(t *testing.T) {
	require.NoError(t, RuntimePoolDefaults().Validate())
	for name, spoil := range map[string]func(*RuntimePoolConfig){
		"a hold within the lock timeout":         func(c *RuntimePoolConfig) { c.Hold = RuntimeLockTimeout },
		"a hold past the pool's acquire timeout": func(c *RuntimePoolConfig) { c.Hold = PoolAcquireTimeout },
		"no hold":                                func(c *RuntimePoolConfig) { c.Holds = 0 },
		"a negative gap":                         func(c *RuntimePoolConfig) { c.Gap = -time.Second },
		"no pool":                                func(c *RuntimePoolConfig) { c.PoolMax = 0 },
		"more connections than worker slots":     func(c *RuntimePoolConfig) { c.PoolMax = c.WorkerConcurrency + 1 },
		"no orchestration slot":                  func(c *RuntimePoolConfig) { c.OrchestrationConcurrency = 0 },
		"a backlog drained before the last hold": func(c *RuntimePoolConfig) { c.Orchestrations = c.minOrchestrations() - 1 },
	} {
		c := RuntimePoolDefaults()
		spoil(&c)
		require.Error(t, c.Validate(), name)
	}
	c := RuntimePoolDefaults()
	c.PoolMax, c.WorkerConcurrency = 2, 2
	require.NoError(t, c.Validate(), "a pool of two, both taken by worker slots")
}

func TestRuntimePoolReadsTheRuntimesLog(t *testing.T) {
	warn := func(target, msg string, fields map[string]string) upstream.LogLine {
		return upstream.LogLine{Level: "WARN", Target: target, Message: msg, Fields: fields}
	}
	const orch = "duroxide::runtime::dispatchers::orchestration"
	invalid := map[string]string{"error": "ack_orchestration_item: Invalid lock token"}
	acquire := func(secs string) upstream.LogLine {
		return warn("sqlx::pool::acquire", slowAcquireMessage, map[string]string{"aquired_after_secs": secs, "slow_acquire_threshold_secs": "2.0"})
	}
	// One refused turn as the runtime logs it (the ack, the failure event
	// it commits in its place, both refused), three slow acquires, and the
	// driver's report of an instance that failed.
	res := &upstream.RuntimeResult{
		Results: map[string]upstream.Outcome{"pool": {
			"status": "Incomplete", "completed": float64(599), "wrong": float64(0),
			"statuses":           map[string]any{"Completed": float64(599), "Failed": float64(1)},
			"notCompletedSample": []any{map[string]any{"id": "pool-7", "status": "Failed", "error": "boom"}},
		}},
		Logs: []upstream.LogLine{
			acquire("6.5101"), acquire("6.497"), acquire("2.25"),
			warn(orch, "ack_orchestration_item failed with non-retryable error", invalid),
			warn(orch, "Failed to ack orchestration item, failing orchestration", invalid),
			warn(orch, "ack_orchestration_item failed with non-retryable error", invalid),
			warn(orch, "Failed to commit failure event, abandoning lock", invalid),
			warn("sqlx::query", "slow statement: execution time exceeded alert threshold", nil),
		},
	}
	var s RuntimePoolSide
	s.read(res)
	require.Equal(t, "Incomplete", s.Status)
	require.Equal(t, 599, s.Completed)
	require.Equal(t, map[string]int{"Completed": 599, "Failed": 1}, s.Statuses)
	require.Equal(t, []string{"pool-7 ended Failed: boom"}, s.Odd)
	require.Equal(t, 4, s.InvalidLockTokens)
	require.Equal(t, 1, s.RefusedTurns)
	require.Equal(t, 4, s.LeaseLines)
	require.Len(t, s.Sample, 3)
	require.Equal(t, 3, s.SlowAcquires)
	require.Equal(t, []int64{6510, 6497, 2250}, s.SlowAcquireMs)
	require.Equal(t, int64(6510), s.SlowAcquireMaxMs)
	require.Equal(t, int64(6497), s.SlowAcquireP50Ms)
	require.Equal(t, 3, s.Tally["WARN sqlx::pool::acquire: "+slowAcquireMessage])
}

func TestRuntimePoolPrintSaysTheFormEachSideAndTheVerdict(t *testing.T) {
	r := poolResult()
	var b bytes.Buffer
	require.NoError(t, PrintRuntimePool(&b, r))
	out := b.String()
	for _, want := range []string{
		"pool-wait form", "no advisory lock", "a pool of 1 connection(s)", "worker_queue's table lock 6.5s at a time, 3 times",
		"upstream", "candidate", "pack", "runtime_pool_candidate",
		"3 of 3", "520 390 260", "15, 6506 / 6529 ms", "600 of 600 (0)",
		"from a timestamp older than the lock timeout (5s)  12 (lag max 6490 ms)",
		"candidate: WARN duroxide::runtime::dispatchers::orchestration: ack_orchestration_item failed",
		"verdict: reproduced on upstream and its candidate, fixed on the pack\n",
	} {
		require.Contains(t, out, want)
	}
	lines := strings.Split(out, "\n")
	var invalid string
	for _, l := range lines {
		if strings.HasPrefix(l, `"Invalid lock token" lines`) {
			invalid = l
		}
	}
	require.Equal(t, []string{`"Invalid`, "lock", "token\"", "lines", "48", "44", "0"}, strings.Fields(invalid), "one column per side, in order")

	r.Sides[2].LeaseLines = 2
	r.Sides[1].InvalidLockTokens = 0
	r.judge()
	b.Reset()
	require.NoError(t, PrintRuntimePool(&b, r))
	require.Contains(t, b.String(), "verdict: reproduced on upstream, NOT REPRODUCED on upstream's candidate, NOT FIXED on the pack\n")

	// The pack ran well, but no fetch met the condition in its runs: they
	// show nothing about the fix, and say so rather than NOT FIXED; so does
	// a side that must show the bug.
	r = poolResult()
	r.Sides[2].Leases.Stale, r.Sides[2].Tries = 0, 3
	r.judge()
	require.False(t, r.OK())
	require.True(t, r.Sides[2].retry(), "a clean run that proves nothing is run again")
	b.Reset()
	require.NoError(t, PrintRuntimePool(&b, r))
	require.Contains(t, b.String(), "verdict: reproduced on upstream and its candidate, NOT EXERCISED on the pack (3 tries: no fetch returned a lease from a timestamp older than the lock timeout)\n")
	r = poolResult()
	r.Sides[0].Leases = FetchLeases{Leases: 600}
	r.Sides[0].Tries = 3
	r.judge()
	require.True(t, r.Sides[0].retry())
	b.Reset()
	require.NoError(t, PrintRuntimePool(&b, r))
	require.Contains(t, b.String(), "verdict: NOT EXERCISED on upstream (3 tries: no fetch returned a lease from a timestamp older than the lock timeout), reproduced on upstream's candidate, fixed on the pack\n")
	// A side that must be fixed and ran badly is not run again.
	r = poolResult()
	r.Sides[2].Leases.Stale, r.Sides[2].LeaseLines = 0, 1
	require.False(t, r.Sides[2].retry())

	md := runtimePoolMarkdown(poolResult())
	require.True(t, strings.HasPrefix(md, "## The real runtime, pool-wait form"), md)
	require.Contains(t, md, "```\nruntime repro, pool-wait form")
	require.True(t, strings.HasSuffix(md, "fixed on the pack\n```\n"), md)
}

// The form with the real runtime runs through the command: internal/cli's
// TestRuntimeReproPoolFormShowsTheSymptomWithNoAdvisoryLock.
