package lab

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/harness/ops/doctor"
	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/sim/repro"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// `harness-lab repro upgrade`: before the upgrade the fix holds, the
// upgrade takes it away (reproduction A's lease dead at return, doctor
// warns), one migrate up brings it back (and says it restored it).
func TestUpgradeReproShowsTheFixGoneAndBack(t *testing.T) {
	upstream.Require(t)
	srv := startServer(t)
	out := filepath.Join(t.TempDir(), "repro.json")
	code, stdout, stderr := run(t, "repro", "upgrade", "--json", out, "--dsn", srv.DSN("postgres"))
	require.Equal(t, cli.ExitOK, code, "stdout: %s\nstderr: %s", stdout, stderr)
	require.Contains(t, stdout, "verdict: the upgrade takes the fix away (the bug is back), and one migrate up brings it back")
	raw, err := os.ReadFile(out)
	require.NoError(t, err)
	var report struct {
		Upgrade repro.UpgradeResult `json:"upgrade"`
		Verdict map[string]bool     `json:"verdict"`
	}
	require.NoError(t, json.Unmarshal(raw, &report))
	require.Equal(t, map[string]bool{"upgrade": true}, report.Verdict)
	steps := report.Upgrade.Steps
	require.Len(t, steps, 3)
	require.Greater(t, steps[0].LeaseLeftMs, int64(4000))
	require.Equal(t, doctor.Replaced, steps[1].Verdict)
	require.Less(t, steps[1].LeaseLeftMs, int64(-4000))
	require.Equal(t, []string{"fetch_orchestration_item"}, steps[2].Restored)
	require.Greater(t, steps[2].LeaseLeftMs, int64(4000))
}

// `harness-lab repro worker-minimal` gains the batched fetch: upstream's
// fetch_work_items (branch, port) leases a stale timestamp dead at return
// and its ack is refused; after the pack's adoption and migrate up (its
// latest fix of fetch_work_items)
// the lease is whole and the ack passes.
func TestWorkerMinimalReproShowsTheBatchedFetchBeforeAndAfterMigrateUp(t *testing.T) {
	upstream.Require(t)
	srv := startServer(t)
	out := filepath.Join(t.TempDir(), "repro.json")
	code, stdout, stderr := run(t, "repro", "worker-minimal", "--json", out, "--dsn", srv.DSN("postgres"))
	require.Equal(t, cli.ExitOK, code, "stdout: %s\nstderr: %s", stdout, stderr)
	require.Contains(t, stdout, "verdict: "+repro.WorkerBatchedVerdict())
	raw, err := os.ReadFile(out)
	require.NoError(t, err)
	var report struct {
		WorkerBatched repro.WorkerBatchedResults `json:"worker_batched"`
		Verdict       map[string]bool            `json:"verdict"`
	}
	require.NoError(t, json.Unmarshal(raw, &report))
	require.Equal(t, map[string]bool{"worker_minimal": true, "worker_batched": true}, report.Verdict)
	require.Len(t, report.WorkerBatched, 2)
	require.Less(t, report.WorkerBatched[0].RemainingMs, int64(-4000), "upstream's: dead at return")
	require.Greater(t, report.WorkerBatched[1].RemainingMs, int64(4000), "after migrate up: whole")
}
