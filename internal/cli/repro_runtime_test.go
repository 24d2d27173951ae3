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
// runtime` with the real runtime, two holds of 6 s: the runtime's turns
// are refused on the real provider's schema, not on the pack's.
func TestRuntimeReproShowsTheSymptomOnUpstreamOnly(t *testing.T) {
	upstream.Require(t)
	srv := startServer(t)
	out := filepath.Join(t.TempDir(), "repro.json")
	code, stdout, stderr := run(t, "repro", "runtime", "--runtime-holds", "2", "--runtime-hold", "6s", "--json", out, "--dsn", srv.DSN("postgres"))
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
	require.GreaterOrEqual(t, r.Upstream.RefusedTurns, 2, "a refused turn per hold on upstream")
	require.Equal(t, []int64{0, 1}, []int64{r.Upstream.Holds[0].AttemptCount, r.Upstream.Holds[1].AttemptCount}, "attempt_count climbs by one a hold")
	require.Zero(t, r.Pack.LeaseLines)
	require.Equal(t, "Completed", r.Pack.Status)
	require.Equal(t, 1, r.Pack.CompletedAfterHold)
}
