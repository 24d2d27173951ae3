package repro

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

func runtimeSides() (up, pack RuntimeSide) {
	up = RuntimeSide{Side: SideUpstream, Schema: "u", HeldKey: "hashtext(instance_id)", Holds: []RuntimeHold{{7000, true, 0}, {7000, true, 1}, {7000, true, 2}},
		RefusedTurns: 3, LeaseLines: 12, Status: "Completed"}
	pack = RuntimeSide{Side: SidePack, Schema: "p", HeldKey: "hashtext('<schema>' || '.' || instance_id)", Holds: []RuntimeHold{{7000, false, 0}}, CompletedAfterHold: 1, Status: "Completed"}
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
	r := RuntimeResult{Addon: "addon", HoldMs: 7000, LockTimeoutMs: 5000,
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
}
