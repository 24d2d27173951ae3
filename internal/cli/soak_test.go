package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSoakUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--duration", "0s"},
		{"--duration", "banana"},
		{"--round", "10ms"},
		{"--version", "99"},
		{"--version", "3"},
		{"extra"},
	} {
		code, _, errOut := runCmd(t, runSoak, args...)
		require.Equal(t, ExitUsage, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, "harness: ", args)
	}
}

// A short soak (one round, no restart) at the latest version: every
// invariant holds and the summary has the counts.
func TestSoakShort(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "soak.json")
	code, stdout, stderr := runCmd(t, runSoak, "--duration", "3s", "--round", "3s", "--no-restart", "--seed", "7", "--json", out)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	for _, want := range []string{"fetches returning a lease", "faults injected", "invariants checked", "violations", "verdict: every invariant held"} {
		require.Contains(t, stdout, want)
	}
	t.Log("\n" + stdout)
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	var sum soakSummary
	require.NoError(t, json.Unmarshal(b, &sum))
	require.Equal(t, 1, sum.Rounds)
	require.Positive(t, sum.Checks)
	require.Zero(t, sum.Violations)
}
