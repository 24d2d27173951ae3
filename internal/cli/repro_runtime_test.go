package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/sim/repro"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

func TestRuntimeReproUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"repro", "runtime", "--runtime-hold", "5s"},
		{"repro", "runtime", "--runtime-holds", "0"},
	} {
		code, _, errOut := run(t, args...)
		require.Equal(t, ExitUsage, code, "%v", args)
		require.Contains(t, errOut, "runtime repro:")
	}
}

// TestRuntimeReproShowsTheSymptomOnUpstreamOnly runs `harness repro
// runtime` with the real runtime, two holds of 6 s, on every side: the
// runtime's turns are refused on the real provider's schema, not on the
// pack's, and upstream's candidate (with or without the amendment offered
// upstream), which only tries its schema-scoped key, completes once it is
// free.
func TestRuntimeReproShowsTheSymptomOnUpstreamOnly(t *testing.T) {
	upstream.Require(t)
	srv := startServer(t)
	out := filepath.Join(t.TempDir(), "repro.json")
	code, stdout, stderr := run(t, "repro", "runtime", "--runtime-holds", "2", "--runtime-hold", "6s", "--sides", "upstream,candidate,pack,amended",
		"--json", out, "--dsn", srv.DSN("postgres"))
	require.Equal(t, exitOK, code, "stdout: %s\nstderr: %s", stdout, stderr)
	require.Contains(t, stdout, "the deterministic form")
	require.Contains(t, stdout, "verdict: reproduced on upstream, fixed on the pack")
	raw, err := os.ReadFile(out)
	require.NoError(t, err)
	var report struct {
		Runtime repro.RuntimeResult `json:"runtime"`
	}
	require.NoError(t, json.Unmarshal(raw, &report))
	r := report.Runtime
	up, ok := r.Side(repro.SideUpstream)
	require.True(t, ok)
	require.Equal(t, "hashtext(instance_id)", up.HeldKey)
	require.GreaterOrEqual(t, up.RefusedTurns, 2, "a refused turn per hold on upstream")
	require.Equal(t, []int64{0, 1}, []int64{up.Holds[0].AttemptCount, up.Holds[1].AttemptCount}, "attempt_count climbs by one a hold")
	for _, key := range []string{repro.SideCandidate, repro.SidePack, repro.SideAmended} {
		s, ok := r.Side(key)
		require.True(t, ok, key)
		require.Contains(t, s.HeldKey, "'<schema>' || '.'", "%s: the key its fetch takes is held", key)
		require.Zero(t, s.LeaseLines, key)
		require.Equal(t, "Completed", s.Status, key)
		require.Equal(t, 1, s.CompletedAfterHold, key)
	}
}
