package lab

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/sim/repro"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

func TestRuntimeReproUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"repro", "runtime", "--runtime-hold", "5s"},
		{"repro", "runtime", "--runtime-holds", "0"},
		{"repro", "runtime", "--form", "pool", "--pool-hold", "5s"},
		{"repro", "runtime", "--form", "pool", "--pool-hold", "30s"},
		{"repro", "runtime", "--form", "pool", "--pool-holds", "0"},
		{"repro", "runtime", "--form", "pool", "--pool-orchestrations", "10"},
	} {
		code, _, errOut := run(t, args...)
		require.Equal(t, cli.ExitUsage, code, "%v", args)
		require.Contains(t, errOut, "runtime ", "%v", args)
		require.Contains(t, errOut, "repro:", "%v", args)
	}
	code, _, errOut := run(t, "repro", "runtime", "--form", "sideways")
	require.Equal(t, cli.ExitUsage, code)
	require.Contains(t, errOut, `--form "sideways": use held-key, pool, all`)
}

// TestRuntimeReproShowsTheSymptomOnUpstreamOnly runs `harness-lab repro
// runtime` with the real runtime, two holds of 6 s, on every side: the
// runtime's turns are refused on the real provider's schema, not on the
// pack's, and upstream's candidate (with or without the amendment offered
// upstream), which only tries its schema-scoped key, completes once it is
// free.
func TestRuntimeReproShowsTheSymptomOnUpstreamOnly(t *testing.T) {
	upstream.Require(t)
	srv := startServer(t)
	out := filepath.Join(t.TempDir(), "repro.json")
	code, stdout, stderr := run(t, "repro", "runtime", "--form", "held-key", "--runtime-holds", "2", "--runtime-hold", "6s", "--sides", "upstream,candidate,pack,amended",
		"--json", out, "--dsn", srv.DSN("postgres"))
	require.Equal(t, cli.ExitOK, code, "stdout: %s\nstderr: %s", stdout, stderr)
	require.Contains(t, stdout, "the deterministic form")
	require.Contains(t, stdout, "verdict: reproduced on upstream, fixed on the pack")
	require.NotContains(t, stdout, "pool-wait form", "--form held-key runs that form only")
	raw, err := os.ReadFile(out)
	require.NoError(t, err)
	var report struct {
		Runtime     repro.RuntimeResult      `json:"runtime"`
		RuntimePool *repro.RuntimePoolResult `json:"runtime_pool"`
		Verdict     map[string]bool          `json:"verdict"`
	}
	require.NoError(t, json.Unmarshal(raw, &report))
	require.Equal(t, map[string]bool{"runtime": true}, report.Verdict)
	require.Nil(t, report.RuntimePool)
	r := report.Runtime
	up, ok := r.Side(repro.SideUpstream)
	require.True(t, ok)
	require.Equal(t, "hashtext(instance_id)", up.HeldKey)
	require.GreaterOrEqual(t, up.RefusedTurns, 2, "a refused turn per hold on upstream")
	require.Equal(t, []int64{0, 1}, []int64{up.Holds[0].AttemptCount, up.Holds[1].AttemptCount}, "attempt_count climbs by one a hold")
	// The verdict is on the runs that met the form's condition: upstream's
	// fetch queued on the key in both holds and took each lease from a
	// timestamp older than the lock timeout, dead at return.
	require.True(t, up.Holds[0].FetchWaited && up.Holds[1].FetchWaited, "upstream: a fetch queued on the key in every hold (%d runs)", up.Tries)
	require.GreaterOrEqual(t, up.Leases.Stale, 2, "upstream: a lease from a stale timestamp per hold")
	require.Equal(t, up.Leases.Stale, up.Leases.StaleDead, "upstream: every such lease dead at return")
	for _, key := range []string{repro.SideCandidate, repro.SidePack, repro.SideAmended} {
		s, ok := r.Side(key)
		require.True(t, ok, key)
		require.Positive(t, s.Holds[0].FetchesSeen, "%s: a fetch found the key held (%d runs)", key, s.Tries)
		require.Zero(t, s.Leases.DeadAtReturn, "%s: no lease dead at return, of %d", key, s.Leases.Leases)
		require.Contains(t, s.HeldKey, "'<schema>' || '.'", "%s: the key its fetch takes is held", key)
		require.Zero(t, s.LeaseLines, key)
		require.Equal(t, "Completed", s.Status, key)
		require.Equal(t, 1, s.CompletedAfterHold, key)
	}
}

// TestRuntimeReproPoolFormShowsTheSymptomWithNoAdvisoryLock runs `harness
// repro runtime --form pool` with the real runtime on every side: two holds
// of worker_queue's table lock of 6.5 s, 800 orchestrations (about a minute
// here). The runtime's fetches wait for the pool's one connection with
// their timestamps minted: upstream's latest and its candidate return
// expired leases and the runtime's acks are refused; the pack's latest and
// the amended candidate complete every orchestration with no line of the
// lease kind.
func TestRuntimeReproPoolFormShowsTheSymptomWithNoAdvisoryLock(t *testing.T) {
	upstream.Require(t)
	srv := startServer(t)
	out := filepath.Join(t.TempDir(), "repro.json")
	const orchestrations = 800
	code, stdout, stderr := run(t, "repro", "runtime", "--form", "pool", "--pool-holds", "2", "--pool-orchestrations", strconv.Itoa(orchestrations),
		"--sides", "upstream,candidate,pack,amended", "--json", out, "--dsn", srv.DSN("postgres"))
	require.Equal(t, cli.ExitOK, code, "stdout: %s\nstderr: %s", stdout, stderr)
	require.Contains(t, stdout, "pool-wait form")
	require.NotContains(t, stdout, "the deterministic form", "--form pool runs that form only")
	require.Contains(t, stdout, "verdict: reproduced on upstream and its candidate, fixed on the pack and the amended candidate")
	raw, err := os.ReadFile(out)
	require.NoError(t, err)
	var report struct {
		Runtime     *repro.RuntimeResult    `json:"runtime"`
		RuntimePool repro.RuntimePoolResult `json:"runtime_pool"`
		Verdict     map[string]bool         `json:"verdict"`
	}
	require.NoError(t, json.Unmarshal(raw, &report))
	require.Equal(t, map[string]bool{"runtime_pool": true}, report.Verdict)
	require.Nil(t, report.Runtime)
	r := report.RuntimePool
	require.Equal(t, 2, r.Settings.Holds)
	require.Equal(t, 1, r.Settings.PoolMax)
	require.Len(t, r.Sides, 4)
	// The verdict is on the fetches that met the condition: each side,
	// within its tries, had some, and says how many.
	for _, s := range r.Sides {
		require.Len(t, s.Holds, 2, s.Side)
		require.Positive(t, s.Leases.Stale, "%s: no fetch returned a lease from a timestamp older than the lock timeout in %d tries (%d leases, lag max %d ms)",
			s.Side, s.Tries, s.Leases.Leases, s.Leases.MaxStaleMs)
		require.LessOrEqual(t, s.Tries, repro.RuntimePoolTries, s.Side)
		t.Logf("%s: %d of %d leases from a stale timestamp (lag max %d ms), %d of them dead at return, %d dead in all; %d Invalid lock token lines; %d tries",
			s.Side, s.Leases.Stale, s.Leases.Leases, s.Leases.MaxStaleMs, s.Leases.StaleDead, s.Leases.DeadAtReturn, s.InvalidLockTokens, s.Tries)
	}
	for _, key := range []string{repro.SideUpstream, repro.SideCandidate} {
		s, _ := r.Side(key)
		require.Equal(t, s.Leases.Stale, s.Leases.StaleDead, "%s: every lease from a stale timestamp is dead at return", key)
		require.Positive(t, s.InvalidLockTokens, "%s: an ack refused on an expired lease", key)
	}
	for _, key := range []string{repro.SidePack, repro.SideAmended} {
		s, _ := r.Side(key)
		require.Zero(t, s.Leases.DeadAtReturn, "%s: no lease dead at return, of %d from a stale timestamp", key, s.Leases.Stale)
		require.Zero(t, s.LeaseLines, key)
		require.Equal(t, orchestrations, s.Completed, key)
		require.Zero(t, s.Wrong, key)
	}
}
