package repro

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

func runtimeSides() (up, pack RuntimeSide) {
	up = RuntimeSide{Side: SideUpstream, Schema: "u", HeldKey: "hashtext(instance_id)",
		Holds:        []RuntimeHold{{HeldMs: 7000, FetchWaited: true}, {HeldMs: 7000, FetchWaited: true, AttemptCount: 1}, {HeldMs: 7000, FetchWaited: true, AttemptCount: 2}},
		RefusedTurns: 3, LeaseLines: 12, Status: "Completed", Leases: FetchLeases{Leases: 4, Stale: 3, StaleDead: 3, DeadAtReturn: 3, MaxStaleMs: 7020}, Tries: 1}
	pack = RuntimeSide{Side: SidePack, Schema: "p", HeldKey: "hashtext('<schema>' || '.' || instance_id)",
		Holds: []RuntimeHold{{HeldMs: 7000, FetchesSeen: 140}}, CompletedAfterHold: 1, Status: "Completed", Leases: FetchLeases{Leases: 1}, Tries: 1}
	return up, pack
}

func TestRuntimeVerdictNeedsEveryHoldRefusedAndAttemptsClimbing(t *testing.T) {
	cfg := RuntimeDefaults()
	up, _ := runtimeSides()
	require.True(t, reproducedOnRuntime(up, cfg))
	for name, spoil := range map[string]func(*RuntimeSide){
		"a hold without a waiting fetch": func(s *RuntimeSide) { s.Holds[1].FetchWaited = false },
		"attempt_count did not climb":    func(s *RuntimeSide) { s.Holds[2].AttemptCount = 1 },
		"fewer refused turns than holds": func(s *RuntimeSide) { s.RefusedTurns = 2 },
		"completed while held":           func(s *RuntimeSide) { s.CompletedAfterHold = 2 },
		"fewer holds than asked":         func(s *RuntimeSide) { s.Holds = s.Holds[:2] },
		"fewer stale leases than holds":  func(s *RuntimeSide) { s.Leases.Stale, s.Leases.StaleDead = 2, 2 },
		"a stale lease alive at return":  func(s *RuntimeSide) { s.Leases.StaleDead = 2 },
	} {
		s, _ := runtimeSides()
		spoil(&s)
		require.False(t, reproducedOnRuntime(s, cfg), name)
	}
}

func TestRuntimeConfigRefusesAHoldWithinTheLockTimeout(t *testing.T) {
	require.NoError(t, RuntimeDefaults().Validate())
	require.Error(t, RuntimeConfig{Hold: RuntimeLockTimeout, Holds: 1}.Validate())
	require.Error(t, RuntimeConfig{Hold: 2 * RuntimeLockTimeout, Holds: 0}.Validate())
}

func TestRuntimePrintSaysTheFormAndTheVerdict(t *testing.T) {
	up, pack := runtimeSides()
	candidate := pack
	candidate.Side, candidate.Schema = SideCandidate, "c"
	r := RuntimeResult{Addon: "addon", HoldMs: 7000, Holds: 3, LockTimeoutMs: 5000,
		sidesVerdict: sidesVerdict[RuntimeSide]{Sides: []RuntimeSide{up, candidate, pack}, Reproduced: true, Fixed: true}}
	var b bytes.Buffer
	require.NoError(t, PrintRuntime(&b, r))
	for _, want := range []string{"the deterministic form", "yes yes yes", "0 1 2", "after hold 1", "only once the key was let go",
		"hashtext(instance_id)", "hashtext('<schema>' || '.' || instance_id)",
		"verdict: reproduced on upstream, fixed on the pack; upstream's candidate skips the held key and completes once it is free (reported)"} {
		require.Contains(t, b.String(), want)
	}
	r.Fixed = false
	require.False(t, r.OK())

	// A run that did not meet the condition proves nothing: it is run
	// again, and said so when it stays that way.
	require.True(t, pack.exercised(3))
	idle := pack
	idle.Holds, idle.Tries = []RuntimeHold{{HeldMs: 7000}}, 3
	require.True(t, idle.retry(3))
	require.False(t, up.retry(3))
	waitless := up
	waitless.Holds = []RuntimeHold{{FetchWaited: true}, {}, {FetchWaited: true}}
	waitless.Tries = 3
	require.True(t, waitless.retry(3))
	r = RuntimeResult{Addon: "addon", HoldMs: 7000, Holds: 3, LockTimeoutMs: 5000,
		sidesVerdict: sidesVerdict[RuntimeSide]{Sides: []RuntimeSide{waitless, idle}}}
	b.Reset()
	require.NoError(t, PrintRuntime(&b, r))
	require.Contains(t, b.String(), "verdict: NOT EXERCISED on upstream (3 runs: no fetch queued on the held key in every hold), NOT EXERCISED on the pack (3 runs: no fetch found the key held)")
	bad := pack
	bad.Holds = []RuntimeHold{{}}
	bad.LeaseLines = 1
	require.False(t, bad.retry(3), "a side that must be fixed and ran badly is not run again")
}
