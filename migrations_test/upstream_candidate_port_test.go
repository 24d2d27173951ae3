package migrations_test

// Our port of upstream's candidate fix (internal/testenv/upstream/candidate)
// behaves as the published facts of upstream's branch file say: the
// version range filters by the current execution's pinned version, a held
// schema-scoped key makes the fetch skip the instance (the plain key does
// not stop it), the loop stops after 50 iterations, each branch on
// p_min_version_packed reads what the facts say, and the clock carried
// forward is the caller's. The port's text keeps every detail the facts
// state (internal/testenv/upstream, TestCandidatePortKeepsTheBranchFilesDetails).
//
// The port is not compared with upstream's own function: the harness
// cannot load upstream's text. Only its fingerprint is known
// (378d41386c1abb6a0489168b0a090513, the text as upstream's runner leaves
// it, in harness/ops/fingerprint/upstream/unreleased.json), so these tests
// hold the port to the facts, which is what the fingerprint's text does.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// portCase is a transaction on a schema holding the candidate (port),
// rolled back when the test ends.
type portCase struct {
	t  *testing.T
	db *testdb.Database
	tx pgx.Tx
}

func newPortCase(t *testing.T, db *testdb.Database) *portCase {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Conn(t, "").Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, "SET LOCAL lock_timeout = '2s'")
	require.NoError(t, err)
	return &portCase{t: t, db: db, tx: tx}
}

// enqueue queues one message of instance, visible since second s of the
// epoch (so the order of the queue is the order of s); version, when not
// "", pins the instance's current execution to it ("none": an execution
// row with no version).
func (c *portCase) enqueue(instance string, s int, version string) {
	c.t.Helper()
	ctx := context.Background()
	if version != "" {
		var major, minor, patch *int
		if version != "none" {
			var a, b, d int
			_, err := fmt.Sscanf(version, "%d.%d.%d", &a, &b, &d)
			require.NoError(c.t, err)
			major, minor, patch = &a, &b, &d
		}
		_, err := c.tx.Exec(ctx, `INSERT INTO `+c.db.Qualify("instances")+` (instance_id, orchestration_name, orchestration_version, current_execution_id, created_at, updated_at)
			VALUES ($1, 'PortProbe', '1.0.0', 1, now(), now())`, instance)
		require.NoError(c.t, err)
		_, err = c.tx.Exec(ctx, `INSERT INTO `+c.db.Qualify("executions")+` (instance_id, execution_id, started_at, duroxide_version_major, duroxide_version_minor, duroxide_version_patch)
			VALUES ($1, 1, now(), $2, $3, $4)`, instance, major, minor, patch)
		require.NoError(c.t, err)
	}
	_, err := c.tx.Exec(ctx, `INSERT INTO `+c.db.Qualify("orchestrator_queue")+` (instance_id, work_item, visible_at, created_at)
		VALUES ($1, $2, to_timestamp($3), now())`, instance,
		fmt.Sprintf(`{"StartOrchestration":{"instance":%q,"orchestration":"PortProbe","version":"1.0.0","input":"null","execution_id":1}}`, instance), s)
	require.NoError(c.t, err)
}

// fetch calls the port with the database clock as p_now_ms, and the
// version range when minMax holds it; "" when it returns no row.
func (c *portCase) fetch(minMax ...int64) string {
	c.t.Helper()
	var lo, hi *int64
	if len(minMax) == 2 {
		lo, hi = &minMax[0], &minMax[1]
	}
	var got *string
	err := c.tx.QueryRow(context.Background(), `SELECT out_instance_id FROM `+c.db.Qualify("fetch_orchestration_item")+`(
		(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT, 30000, $1, $2)`, lo, hi).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	require.NoError(c.t, err)
	require.NotNil(c.t, got)
	return *got
}

// reads is how many scans of table the transaction has made so far.
func (c *portCase) reads(table string) int64 {
	c.t.Helper()
	var n int64
	require.NoError(c.t, c.tx.QueryRow(context.Background(), `SELECT COALESCE(sum(seq_scan + COALESCE(idx_scan, 0)), 0)::BIGINT
		FROM pg_stat_xact_user_tables WHERE schemaname = $1 AND relname = $2`, c.db.Schema, table).Scan(&n))
	return n
}

// With a range, the current execution's pinned version must lie in it and
// an unpinned one passes; without one, the oldest message is taken,
// whatever its instance is pinned to.
func TestCandidatePortFiltersByTheCurrentExecutionsVersion(t *testing.T) {
	t.Parallel()
	db := dbs.UpstreamCandidate(t)
	for _, tc := range []struct {
		name   string
		minMax []int64
		want   string
	}{
		{"no range: the oldest message", nil, "pinned-1.2.3"},
		{"a range holding 1.2.3 alone", []int64{1002003, 1002003}, "pinned-1.2.3"},
		{"a range of 2.x", []int64{2000000, 2999999}, "pinned-2.0.0"},
		{"a range no pinned instance is in: the unpinned one passes", []int64{3000000, 3999999}, "unpinned"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newPortCase(t, db)
			c.enqueue("pinned-1.2.3", 1, "1.2.3")
			c.enqueue("pinned-2.0.0", 2, "2.0.0")
			c.enqueue("unpinned", 3, "none")
			c.enqueue("no-instance-row", 4, "")
			require.Equal(t, tc.want, c.fetch(tc.minMax...))
		})
	}
}

// Another session holding the instance's schema-scoped key makes the fetch
// skip it (and return the next instance); the plain key hashtext(id), the
// one released versions take, does not stop it.
func TestCandidatePortSkipsAnInstanceWhoseScopedKeyIsHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbs.UpstreamCandidate(t)
	holder := db.Conn(t, "")

	_, err := holder.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1 || '.' || 'older'))", db.Schema)
	require.NoError(t, err)
	c := newPortCase(t, db)
	c.enqueue("older", 1, "")
	c.enqueue("newer", 2, "")
	require.Equal(t, "newer", c.fetch(), "the held instance is skipped")

	_, err = holder.Exec(ctx, "SELECT pg_advisory_unlock_all(), pg_advisory_lock(hashtext('older'))")
	require.NoError(t, err)
	c = newPortCase(t, db)
	c.enqueue("older", 1, "")
	c.enqueue("newer", 2, "")
	require.Equal(t, "older", c.fetch(), "the plain key is not the port's: no wait, no skip")
}

// The loop's bound: 50 iterations. With the 50 oldest instances held, the
// 51st, free, is not reached; with 49 held, the 50th is claimed.
func TestCandidatePortStopsAfter50Iterations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbs.UpstreamCandidate(t)
	holder := db.Conn(t, "")
	_, err := holder.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1 || '.' || 'held-' || g)) FROM generate_series(1, 50) AS g", db.Schema)
	require.NoError(t, err)

	queue := func() *portCase {
		c := newPortCase(t, db)
		for i := 1; i <= 51; i++ {
			c.enqueue(fmt.Sprintf("held-%d", i), i, "")
		}
		return c
	}
	require.Equal(t, "", queue().fetch(), "50 skipped instances use up the 50 iterations: no row, though held-51 is free")

	_, err = holder.Exec(ctx, "SELECT pg_advisory_unlock(hashtext($1 || '.' || 'held-50'))", db.Schema)
	require.NoError(t, err)
	require.Equal(t, "held-50", queue().fetch(), "the 50th iteration still claims")
}

// Each branch reads what the facts say: without a range the fetch never
// reads executions, whatever plan the function's cached statements get
// (more than five calls: past the custom plans), and reads instances only
// for the claimed instance's metadata; with a range it joins them.
func TestCandidatePortBranchesReadWhatTheFactsSay(t *testing.T) {
	t.Parallel()
	db := dbs.UpstreamCandidate(t)
	c := newPortCase(t, db)
	const calls = 8
	for i := 1; i <= 2*calls; i++ {
		c.enqueue(fmt.Sprintf("i-%02d", i), i, "1.0.0")
	}
	execs, insts := c.reads("executions"), c.reads("instances")
	for i := 1; i <= calls; i++ {
		require.Equal(t, fmt.Sprintf("i-%02d", i), c.fetch())
	}
	require.Zero(t, c.reads("executions")-execs, "without a range, executions is never read")
	require.Equal(t, int64(calls), c.reads("instances")-insts, "without a range, instances is read once a claim (its metadata), never to find one")

	execs = c.reads("executions")
	for i := calls + 1; i <= 2*calls; i++ {
		require.Equal(t, fmt.Sprintf("i-%02d", i), c.fetch(1000000, 1999999))
	}
	require.Positive(t, c.reads("executions")-execs, "with a range, the current execution is joined")
}

// The clock is the caller's, carried forward by the time spent in the
// call: locked_at is p_now_ms plus at most the call's duration, and the
// lease is locked_at plus the timeout (the candidate's defect: 10 s stale
// in, a lease 5 s in the past out).
func TestCandidatePortCarriesTheCallersClockForward(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbs.UpstreamCandidate(t)
	c := newPortCase(t, db)
	c.enqueue("clock", 1, "")
	var dbMs int64
	require.NoError(t, c.tx.QueryRow(ctx, "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT").Scan(&dbMs))
	pNow := dbMs - 10_000
	start := time.Now()
	var token string
	require.NoError(t, c.tx.QueryRow(ctx, `SELECT out_lock_token FROM `+db.Qualify("fetch_orchestration_item")+`($1, 5000)`, pNow).Scan(&token))
	callMs := time.Since(start).Milliseconds() + 1
	var lockedAt, lockedUntil, left int64
	require.NoError(t, c.tx.QueryRow(ctx, `SELECT locked_at, locked_until, locked_until - (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT
		FROM `+db.Qualify("instance_locks")+` WHERE lock_token = $1`, token).Scan(&lockedAt, &lockedUntil, &left))
	require.GreaterOrEqual(t, lockedAt, pNow)
	require.LessOrEqual(t, lockedAt, pNow+callMs, "carried forward by the call's own time only")
	require.Equal(t, lockedAt+5000, lockedUntil, "the lease: the carried clock plus the timeout")
	require.Less(t, left, int64(-4000), "a stale timestamp still yields a dead lease (%d ms left)", left)
}
