package repro

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// minimalPair is a minimal repro that showed the bug at the version before
// the fix and the fix at the fix.
func minimalPair() []MinimalResult {
	bug, fix := Versions()
	return []MinimalResult{
		{Instance: "a", StaleFetch: StaleFetch{Schema: "s1", Version: int64(bug), StaleMs: 10_000, LockTimeoutMs: 5000,
			Fetched: true, RemainingMs: -5000, AckError: "Invalid lock token"}},
		{Instance: "b", StaleFetch: StaleFetch{Schema: "s2", Version: int64(fix), StaleMs: 10_000, LockTimeoutMs: 5000,
			Fetched: true, RemainingMs: 4990, AckOK: true}},
	}
}

func TestMinimalRendersBothVersionsSideBySideWithTheVerdict(t *testing.T) {
	results := minimalPair()
	bug, fix := Versions()
	require.True(t, MinimalVerdict(results))
	require.False(t, MinimalVerdict([]MinimalResult{results[1], results[0]}), "the fix first and the bug second is no repro")

	var out bytes.Buffer
	require.NoError(t, PrintMinimal(&out, results))
	text := out.String()
	for _, want := range []string{"p_now_ms 10000 ms stale, lock timeout 5000 ms", fmt.Sprintf("version %d", bug),
		"-5000", "+4990", "Invalid lock token",
		fmt.Sprintf("verdict: version %d shows the bug; version %d is fixed", bug, fix)} {
		require.Contains(t, text, want)
	}

	md := minimalMarkdown(results)
	require.Contains(t, md, fmt.Sprintf("|  | version %d | version %d |", bug, fix))
	require.Contains(t, md, "| remaining lease at return (ms, db clock) | -5000 | +4990 |")
	require.Contains(t, md, "| ack with the returned token | Invalid lock token | ok |")
}

func TestWorkerMinimalVerdictNeedsBothSymptomsThenNeither(t *testing.T) {
	bug, fix := WorkerVersions()
	before := WorkerMinimalResult{HoldMs: 2000, Blocked: true, BlockedMs: 1900, CallMs: 2100, Returned: "s1",
		StaleFetch: StaleFetch{Version: int64(bug), LockTimeoutMs: 5000, Fetched: true, RemainingMs: -5000, AckError: "not found"}}
	after := WorkerMinimalResult{HoldMs: 2000, CallMs: 5, Returned: "s2",
		StaleFetch: StaleFetch{Version: int64(fix), LockTimeoutMs: 5000, Fetched: true, RemainingMs: 4995, AckOK: true}}
	require.True(t, WorkerMinimalVerdict([]WorkerMinimalResult{before, after}))
	unblocked := before
	unblocked.Blocked = false
	require.False(t, WorkerMinimalVerdict([]WorkerMinimalResult{unblocked, after}), "one symptom is not the bug")

	var out bytes.Buffer
	require.NoError(t, PrintWorkerMinimal(&out, []WorkerMinimalResult{before, after}))
	require.Contains(t, out.String(), "refused")
	require.Contains(t, out.String(), "yes, 1900 ms")
	require.Contains(t, out.String(), fmt.Sprintf("verdict: version %d shows the bug; version %d is fixed", bug, fix))
}

func TestReportWritesTheSectionsThatRanAndItsJSON(t *testing.T) {
	organic := sampleResult()
	r := Report{Organic: &organic, Minimal: minimalPair(), Verdict: map[string]bool{"organic": true, "minimal": true}}
	require.True(t, r.OK())
	dir := filepath.Join(t.TempDir(), "out")
	require.NoError(t, r.Write(dir))
	md, err := os.ReadFile(filepath.Join(dir, ReportFile))
	require.NoError(t, err)
	bug, fix := Versions()
	require.True(t, strings.HasPrefix(string(md),
		fmt.Sprintf("# duroxide-pg fetch_orchestration_item: lease dead on arrival at %d, valid at %d\n", bug, fix)),
		"the title names the versions read from sql/")
	require.Contains(t, string(md), "## Organic scenario")
	require.Contains(t, string(md), "## Minimal scenario: a stale p_now_ms")
	require.NotContains(t, string(md), "## Worker", "no section for a repro that did not run")

	path := filepath.Join(dir, "repro.json")
	require.NoError(t, r.WriteJSON(path))
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var back map[string]any
	require.NoError(t, json.Unmarshal(raw, &back))
	require.ElementsMatch(t, []string{"minimal", "organic", "verdict"}, keys(back))
	minimal := back["minimal"].([]any)[0].(map[string]any)
	require.ElementsMatch(t, []string{"schema", "version", "instance", "stale_ms", "lock_timeout_ms", "fetched", "remaining_ms",
		"ack_ok", "ack_error"}, keys(minimal), "the minimal result's JSON names are stable")

	r.Verdict["minimal"] = false
	require.False(t, r.OK())
}
