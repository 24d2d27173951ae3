package lab

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/realfaults"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
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
		{"--each"},
		{"--doc", "docs/RELIABILITY.md"},
		{"--runtime", "--orchestrations", "0"},
		{"--runtime", "--version", "20"},
		{"--runtime", "--duration", "0s"},
		{"--runtime", "extra"},
	} {
		code, _, errOut := run(t, append([]string{"soak"}, args...)...)
		require.Equal(t, cli.ExitUsage, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, "harness-lab: ", args)
	}
}

// A short soak (one round, no restart) at the latest version: every
// invariant holds and the summary has the counts.
func TestSoakShort(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "soak.json")
	code, stdout, stderr := run(t, "soak", "--duration", "3s", "--round", "3s", "--no-restart", "--seed", "7", "--json", out)
	require.Equal(t, cli.ExitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
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

// A short soak of the real runtime: one round of a scenario drawn by the
// seed, its table on stdout and in the marked section of a document, and
// the verdict (nothing lost, doubled or wrong on the pack's side).
func TestSoakRuntimeShort(t *testing.T) {
	upstream.Require(t)
	doc := filepath.Join(t.TempDir(), "doc.md")
	require.NoError(t, os.WriteFile(doc, []byte("before\n"+realfaults.BeginMarker+"\nold\n"+realfaults.EndMarker+"\nafter\n"), 0o644))
	code, stdout, stderr := run(t, "soak", "--runtime", "--duration", "1s", "--orchestrations", "30", "--seed", "3", "--doc", doc)
	require.Equal(t, cli.ExitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	t.Log("\n" + stdout)
	require.Contains(t, stdout, "| scenario | faults injected | side |")
	require.Contains(t, stdout, "verdict: on the pack's side nothing was lost")
	b, err := os.ReadFile(doc)
	require.NoError(t, err)
	require.Regexp(t, `(?s)^before\n`+regexp.QuoteMeta(realfaults.BeginMarker)+`\n30 orchestrations per side.*\| pack \| 30 \|.*`+regexp.QuoteMeta(realfaults.EndMarker)+`\nafter\n$`, string(b))
	require.NotContains(t, string(b), "\nold\n", "the section's old text is gone")
}
