package repro_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/sim/repro"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

func TestWorkerMinimalShowsBothSymptomsBeforeTheFixAndNeitherAfter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, pgtest.OptionsFromEnv())
	require.NoError(t, err, "no PostgreSQL server")
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	db, err := srv.CreateDatabase(ctx, "worker_minimal_", "")
	require.NoError(t, err)
	src := testdb.MustSource(t, srv.DSN(db))
	bug, fix, verr := repro.WorkerVersions()
	require.NoError(t, verr)
	require.Less(t, bug, fix)

	run := func(v int64) repro.WorkerMinimalResult {
		schema := fmt.Sprintf("worker_minimal_v%d", v)
		require.NoError(t, migrate.To(ctx, src.Config(), schema, v))
		res, err := repro.WorkerMinimal(ctx, src, schema, v, repro.WorkerMinimalConfig{})
		require.NoError(t, err)
		t.Logf("v%d: %+v", v, res)
		return res
	}

	before := run(bug)
	require.True(t, before.Fetched)
	require.LessOrEqual(t, before.RemainingMs, int64(0), "the lease p_now_ms + timeout was dead when returned")
	require.False(t, before.AckOK, "ack_worker refuses the dead lease")
	require.Contains(t, before.AckError, "Worker queue item not found")
	require.True(t, before.Blocked, "the session fetch waited on the held session row")
	require.GreaterOrEqual(t, before.BlockedMs, before.HoldMs/2)
	require.True(t, before.Bug())
	require.False(t, before.Fixed())

	after := run(fix)
	require.GreaterOrEqual(t, after.RemainingMs, after.LockTimeoutMs-100, "a whole lease at return")
	require.True(t, after.AckOK)
	require.False(t, after.Blocked, "the fetch skipped the held session instead of waiting")
	require.Equal(t, "s2", after.Returned, "it took the other session's item")
	require.Less(t, after.CallMs, after.HoldMs/2)
	require.True(t, after.Fixed())
	require.False(t, after.Bug())

	md := repro.WorkerMinimalMarkdown([]repro.WorkerMinimalResult{before, after})
	require.Contains(t, md, "| remaining lease at return (ms, db clock) |")
}

func TestTextHistogramMarksDeadBins(t *testing.T) {
	h := repro.Histogram{BinWidthMs: 500, Lost: 1, Bins: []repro.Bin{
		{LoMs: -1000, HiMs: -500, Count: 0}, {LoMs: -500, HiMs: 0, Count: 4}, {LoMs: 0, HiMs: 500, Count: 0},
		{LoMs: 500, HiMs: 1000, Count: 8}, {LoMs: 1000, HiMs: 1500, Count: 0}}}
	text := repro.TextHistogram(h, 8)
	lines := strings.Split(strings.TrimSpace(text), "\n")
	require.Len(t, lines, 4, "taken over, then the bins from the first to the last non-empty one:\n%s", text)
	require.Contains(t, lines[0], "taken over")
	require.Contains(t, lines[1], "(-500, 0]  xxxx")
	require.Contains(t, lines[3], "(500, 1000]  ########")
}
