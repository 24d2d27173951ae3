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

// minimalSides is a minimal repro that showed the bug at upstream's latest
// and at its candidate fix, and the fix at the pack.
func minimalSides() []MinimalResult {
	bug := StaleFetch{StaleMs: 10_000, LockTimeoutMs: 5000, Fetched: true, RemainingMs: -5000, AckError: "Invalid lock token"}
	fixed := StaleFetch{StaleMs: 10_000, LockTimeoutMs: 5000, Fetched: true, RemainingMs: 4990, AckOK: true}
	up, candidate, pack := bug, bug, fixed
	up.Schema, up.Side, up.Made = "s1", SideUpstream, "the real provider"
	candidate.Schema, candidate.Side, candidate.Made, candidate.RemainingMs = "s2", SideCandidate, "the real provider, then the candidate", -4995
	pack.Schema, pack.Side, pack.Made = "s3", SidePack, "the pack"
	return []MinimalResult{{Instance: "a", StaleFetch: up}, {Instance: "b", StaleFetch: candidate}, {Instance: "c", StaleFetch: pack}}
}

func TestMinimalRendersEverySideWithTheVerdict(t *testing.T) {
	results := minimalSides()
	require.True(t, MinimalResults(results).OK())
	require.False(t, MinimalResults(results[1:]).OK(), "without upstream's side there is no verdict")
	swapped := minimalSides()
	swapped[0].StaleFetch, swapped[2].StaleFetch = results[2].StaleFetch, results[0].StaleFetch
	swapped[0].Side, swapped[2].Side = SideUpstream, SidePack
	require.False(t, MinimalResults(swapped).OK(), "the fix at upstream and the bug at the pack is no repro")
	clean := minimalSides()
	clean[1].StaleFetch = results[2].StaleFetch
	clean[1].Side = SideCandidate
	require.False(t, MinimalResults(clean).OK(), "the candidate must show the bug: its lease comes from the caller's timestamp")
	amended := append(minimalSides(), MinimalResult{Instance: "d", StaleFetch: results[2].StaleFetch})
	amended[3].Side = SideAmended
	require.True(t, MinimalResults(amended).OK(), "the amended candidate is fixed")

	var out bytes.Buffer
	require.NoError(t, PrintMinimal(&out, results))
	text := out.String()
	for _, want := range []string{"p_now_ms 10000 ms stale, lock timeout 5000 ms", "upstream", "candidate", "pack",
		"-5000", "-4995", "+4990", "Invalid lock token", "candidate: the real provider, then the candidate",
		"verdict: upstream shows the bug; candidate shows the bug; pack is fixed"} {
		require.Contains(t, text, want)
	}

	md := minimalMarkdown(results)
	require.Contains(t, md, "|  | upstream | candidate | pack |")
	require.Contains(t, md, "| remaining lease at return (ms, db clock) | -5000 | -4995 | +4990 |")
	require.Contains(t, md, "| ack with the returned token | Invalid lock token | Invalid lock token | ok |")
}

func TestWorkerMinimalVerdictNeedsBothSymptomsThenNeither(t *testing.T) {
	bug, fix, verr := WorkerVersions()
	require.NoError(t, verr)
	before := WorkerMinimalResult{HoldMs: 2000, Blocked: true, BlockedMs: 1900, CallMs: 2100, Returned: "s1",
		StaleFetch: StaleFetch{Version: int64(bug), LockTimeoutMs: 5000, Fetched: true, RemainingMs: -5000, AckError: "not found"}}
	after := WorkerMinimalResult{HoldMs: 2000, CallMs: 5, Returned: "s2",
		StaleFetch: StaleFetch{Version: int64(fix), LockTimeoutMs: 5000, Fetched: true, RemainingMs: 4995, AckOK: true}}
	require.True(t, WorkerMinimalResults([]WorkerMinimalResult{before, after}).OK())
	unblocked := before
	unblocked.Blocked = false
	require.False(t, WorkerMinimalResults([]WorkerMinimalResult{unblocked, after}).OK(), "one symptom is not the bug")

	var out bytes.Buffer
	require.NoError(t, PrintWorkerMinimal(&out, []WorkerMinimalResult{before, after}))
	require.Contains(t, out.String(), "refused")
	require.Contains(t, out.String(), "yes, 1900 ms")
	require.Contains(t, out.String(), fmt.Sprintf("verdict: version %d shows the bug; version %d is fixed", bug, fix))
}

func TestReportWritesTheSectionsThatRanAndItsJSON(t *testing.T) {
	organic := sampleResult()
	r := Report{Organic: &organic, Minimal: minimalSides(), Verdict: map[string]bool{"organic": true, "minimal": true}}
	require.True(t, r.OK())
	dir := filepath.Join(t.TempDir(), "out")
	require.NoError(t, r.Write(dir))
	md, err := os.ReadFile(filepath.Join(dir, ReportFile))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(md),
		"# duroxide-pg fetch_orchestration_item: lease dead on arrival at upstream, valid at the pack\n"),
		"the title names the sides")
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
	require.ElementsMatch(t, []string{"schema", "side", "made", "instance", "stale_ms", "lock_timeout_ms", "fetched", "remaining_ms",
		"ack_ok", "ack_error"}, keys(minimal), "the minimal result's JSON names are stable")

	r.Verdict["minimal"] = false
	require.False(t, r.OK())
}
