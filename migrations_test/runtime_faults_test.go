package migrations_test

// The real duroxide runtime under faults (internal/realfaults): the same
// load on upstream's schema as its runner makes it (the control, reported)
// and on the pack's latest (asserted), in one run on one database, while
// the runtime's backends are terminated or the server restarts. On the
// pack's side every orchestration reaches a terminal state, none completes
// twice or with a wrong output, and none fails outside the runtime's own
// failure classes (which are counted on both sides). docs/RELIABILITY.md
// has the figures of a full run.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/realfaults"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// faultLoad is the short form's load (make soak runs the long one).
var faultLoad = realfaults.Load{
	Orchestrations: 150,
	TimerMs:        1000,
	Deadline:       3 * time.Minute,
	Runtime:        upstream.RuntimeOptions{OrchestrationConcurrency: 4, WorkerConcurrency: 8},
}

// faultSides makes, in db, upstream's schema as the real provider's runner
// makes it and the pack's latest.
func faultSides(t *testing.T, p *upstream.Provider, src *dbconn.Source) []realfaults.Side {
	t.Helper()
	ctx := context.Background()
	sides, err := realfaults.MakeSides(ctx, p, src, "faults_")
	require.NoError(t, err)
	r, err := migrate.Open(ctx, src.Config(), migrate.Options{Schema: sides[1].Schema})
	require.NoError(t, err)
	defer r.Close()
	v, err := r.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v, "the pack's side is at the latest version")
	return sides
}

// requirePackSound fails the test on anything the pack's side must never
// show, and checks the run injected faults at all.
func requirePackSound(t *testing.T, rep *realfaults.Report) {
	t.Helper()
	t.Log(rep.String())
	require.Positive(t, rep.Injected, "the run injected faults")
	for _, s := range rep.Sides {
		if s.Side.Name != "pack" {
			continue // the control: reported, not required
		}
		require.Empty(t, s.Problems(), "the pack's latest under %s", rep.Fault)
		require.Positive(t, s.Completed, "orchestrations completed")
	}
}

func TestRealRuntimeWithBackendsTerminated(t *testing.T) {
	p := upstream.Require(t)
	db := dbs.New(t, 0)
	sides := faultSides(t, p, db.Source)
	load := faultLoad
	load.FaultFor = 6 * time.Second
	rep, err := realfaults.Run(context.Background(), p, realfaults.Target{DB: db.Source}, sides, realfaults.KillBackends{
		Admin: db.Source, MinGap: 200 * time.Millisecond, MaxGap: 500 * time.Millisecond, Share: 0.5,
	}, load)
	require.NoError(t, err)
	requirePackSound(t, rep)
}

// restartableServer starts a throwaway server of the test's own (a
// restart stops every session on it) and returns a database on it.
func restartableServer(t *testing.T) (*pgtest.Server, *testdb.Database) {
	t.Helper()
	opts := pgtest.OptionsFromEnv()
	if opts.Backend == pgtest.DSN || (opts.Backend == "" && opts.DSN != "") {
		t.Skip("restarts the server: HARNESS_DSN names an existing server, which this test must not stop")
	}
	if opts.Backend == pgtest.Docker {
		t.Skip("restarts the server: only the local backend can (pgtest.Server.Restart)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, opts)
	require.NoError(t, err, "start a server of the test's own")
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	return srv, testdb.NewPool(srv, "duroxide").New(t, 0)
}

// restartLoad is faultLoad for the restart scenarios. The fault stops
// once the load is over, so every orchestration's timer (8 s) outlasts
// both restarts (0.5 s after the load started, then 2 s after the server
// came back, each about a second long) and both land on orchestrations in
// flight, however fast the machine runs the rest.
func restartLoad() realfaults.Load {
	l := faultLoad
	l.TimerMs = 8000
	l.FaultFor = time.Minute
	return l
}

func TestRealRuntimeAcrossServerRestarts(t *testing.T) {
	p := upstream.Require(t)
	srv, db := restartableServer(t)
	sides := faultSides(t, p, db.Source)
	rep, err := realfaults.Run(context.Background(), p, realfaults.Target{DB: db.Source}, sides, realfaults.RestartServer{
		Server: srv, Times: 2, First: 500 * time.Millisecond, Gap: 2 * time.Second,
	}, restartLoad())
	require.NoError(t, err)
	require.Equal(t, 2, rep.Injected, "both restarts happened while the load ran")
	requirePackSound(t, rep)
}

// skewCells are the clock scenarios: for each offset S, two runtime
// processes on one schema, S behind the database's clock (it starts the
// load: its messages are visible to both) and S ahead; then one process
// alone at each of -S and +S.
func skewCells(offsets ...time.Duration) [][]time.Duration {
	var out [][]time.Duration
	for _, s := range offsets {
		out = append(out, []time.Duration{-s, s}, []time.Duration{-s}, []time.Duration{s})
	}
	return out
}

func TestRealRuntimeWithSkewedClocks(t *testing.T) {
	p := upstream.Require(t)
	for _, clocks := range skewCells(2*time.Second, 30*time.Second, 120*time.Second) {
		t.Run(fmt.Sprint(clocks), func(t *testing.T) {
			db := dbs.New(t, 0)
			sides := faultSides(t, p, db.Source)
			load := faultLoad
			load.Orchestrations = 100
			load.Clocks = clocks
			rep, err := realfaults.Run(context.Background(), p, realfaults.Target{DB: db.Source}, sides, nil, load)
			if errors.Is(err, realfaults.ErrNoFaketime) && os.Getenv("HARNESS_REQUIRE_FAKETIME") != "1" {
				t.Skipf("skews the runtime's clock: %v (set HARNESS_REQUIRE_FAKETIME=1 to make this a failure)", err)
			}
			require.NoError(t, err)
			t.Log(rep.String())
			for _, s := range rep.Sides {
				for _, proc := range s.Processes {
					require.InDelta(t, proc.Clock.Seconds(), proc.Measured.Seconds(), 1, "%s: the process's clock is skewed as asked", s.Side.Name)
				}
				if s.Side.Name == "pack" {
					require.Empty(t, s.Problems(), "the pack's latest with runtime clocks %v", clocks)
				}
			}
		})
	}
}

// The runtime's provider (sqlx) prepares named statements on a connection
// and reuses them, which PgBouncer 1.18 (Debian's) cannot carry in
// transaction mode: the provider fails on its first statements. Session
// mode is what the runtime needs behind PgBouncer; docs/RELIABILITY.md
// says so. This test fails when that stops being true.
func TestRealRuntimeNeedsSessionModeBehindPgBouncer(t *testing.T) {
	p := upstream.Require(t)
	db := dbs.New(t, 0)
	bouncer := pgtest.RequirePgBouncer(t, dbs.Server(), "transaction")
	res, err := p.RunRuntime(context.Background(), db.Source, upstream.RuntimeRun{
		Schema: "duroxide", Via: bouncer.RuntimeDSN(db.Name), Wait: 10 * time.Second,
		Scenarios: []upstream.Scenario{{Name: "faultLoad", Count: 20}},
	})
	require.NoError(t, err)
	broken := 0
	for _, l := range res.Logs {
		if strings.Contains(l.Text(), `prepared statement \"sqlx_s_`) || strings.Contains(l.Text(), `prepared statement "sqlx_s_`) {
			broken++
		}
	}
	t.Logf("%d lines about the provider's prepared statements; outcome %v", broken, res.Results["faultLoad"])
	require.Positive(t, broken, "the provider's prepared statements break in transaction mode")
}

func TestRealRuntimeThroughPgBouncerRestarts(t *testing.T) {
	p := upstream.Require(t)
	db := dbs.New(t, 0)
	bouncer := pgtest.RequirePgBouncer(t, dbs.Server(), "session")
	sides := faultSides(t, p, db.Source)
	rep, err := realfaults.Run(context.Background(), p, realfaults.Target{DB: db.Source, Via: bouncer.RuntimeDSN(db.Name)},
		sides, realfaults.RestartServer{Server: bouncer, What: "PgBouncer", Times: 2, First: 500 * time.Millisecond, Gap: 2 * time.Second}, restartLoad())
	require.NoError(t, err)
	require.Equal(t, 2, rep.Injected, "both restarts happened while the load ran")
	requirePackSound(t, rep)
}

// Bulk operations at PostgreSQL's default lock capacity (a server of the
// test's own): a turn that starts thousands of sub-orchestrations, the
// client's bulk prune and delete, a DBA's DELETE and TRUNCATE of the
// queue, on upstream's schema (reported) and the pack's latest (each
// must succeed), while another runtime works on a schema of its own and
// must meet no "out of shared memory". make reliability runs the long
// form (20,000 sub-orchestrations, 100,000 instances and messages).
func TestRealRuntimeWithBulkOperationsAtDefaultLockCapacity(t *testing.T) {
	p := upstream.Require(t)
	db := defaultConfiguredPool(t).New(t, 0)
	ctx := context.Background()
	sides, err := realfaults.MakeSides(ctx, p, db.Source, "bulk_")
	require.NoError(t, err)
	live, err := realfaults.MakeSides(ctx, p, db.Source, "live_")
	require.NoError(t, err)
	rep, err := realfaults.RunBulk(ctx, p, db.Source, sides, live[1].Schema, realfaults.Bulk{
		Children: 1_000, Instances: 2_000, QueueMessages: 20_000, Deadline: 5 * time.Minute,
	})
	require.NoError(t, err)
	t.Log("\n" + rep.String())
	require.Empty(t, rep.Problems("pack"), "every bulk operation succeeds on the pack's latest")
	require.Positive(t, rep.LiveRuns, "the concurrent runtime ran")
	require.Empty(t, rep.LiveOutOfMemory, "the concurrent runtime met no out of shared memory")
	require.Zero(t, rep.LiveIncomplete, "the concurrent runtime completed its loads")
}
