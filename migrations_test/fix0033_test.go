package migrations_test

// Claims of the pack's fix of fetch_work_items (0033), the batched worker
// fetch upstream has on a branch (our port of it applied the way upstream's
// runner applies a file): a lease valid at return whatever the caller's
// timestamp, upstream's batch semantics kept, no wait on a row or a session
// another transaction holds, a bound on the candidates, a cached plan that
// reads the visible items only; nothing done where the schema has no
// fetch_work_items; its guard and its Down.

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/fingerprint"
	"github.com/duroxide-pg/migrations/internal/planshape"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// batchFix is the pack's fix of fetch_work_items.
func batchFix(t *testing.T) migrations.Migration {
	t.Helper()
	m, ok := migrations.FixOf("fetch_work_items")
	require.True(t, ok, "the pack has a fix of fetch_work_items")
	return m
}

// batchFixBodies are the fingerprints of the fix's body and of the
// unfixed body its Down restores.
func batchFixBodies(t *testing.T) (fixed, unfixed string) {
	t.Helper()
	for _, d := range batchFix(t).Definitions {
		if d.Function != "fetch_work_items" {
			continue
		}
		if d.Down {
			unfixed = d.Fingerprint()
		} else {
			fixed = d.Fingerprint()
		}
	}
	require.NotEmpty(t, fixed)
	require.NotEmpty(t, unfixed)
	return fixed, unfixed
}

// adoptedWithBatchedFetch is (2)'s start state: a database the real
// provider made, adopted and taken to the pack version right before 0033
// (the pack's latest before it), then given upstream's batched fetch
// (port) by upstream's runner, as a duroxide-pg release carrying it would.
func adoptedWithBatchedFetch(t *testing.T) *testdb.Database {
	t.Helper()
	db := realProviderAdoptedAt(t, batchFix(t).Version-1)
	applyInFlight(t, db, upstream.InFlightBatchedFetch)
	return db
}

// batchFixed is that state after `harness migrate up`: 0033 installs its
// fix over the batched fetch, and the later fixes of it (0035, the lease
// bound) theirs.
func batchFixed(t *testing.T) *schemaDB {
	t.Helper()
	db := adoptedWithBatchedFetch(t)
	_, err := db.Runner(t).Up(context.Background())
	require.NoError(t, err, "migrate up")
	newest, body, ok := migrations.FixFor("fetch_work_items", 22, migrations.Latest())
	require.True(t, ok)
	require.True(t, definitionOf(t, db, "fetch_work_items").Matches(body.Fingerprint()), "%s's fix is installed", newest.File)
	return &schemaDB{t: t, db: db, pool: db.PgxPool(t)}
}

// (2) migrate up installs the fix over upstream's batched fetch; then a
// timestamp 10 s stale gets a full lease by the database clock, and the
// activity's ack succeeds.
func TestBatchedFetchLeaseIsValidWhenReturned(t *testing.T) {
	t.Parallel()
	h := batchFixed(t)
	fresh := sharedSuite(t, h)
	const staleMs = 10_000

	for _, owner := range []any{nil, "w1"} {
		t.Run(fmt.Sprintf("owner %v: p_now_ms %d ms stale, lock timeout %d ms", owner, staleMs, lockMs), func(t *testing.T) {
			h := fresh(t)
			now := h.dbNowMs()
			h.enqueueWork(`{"n":1}`, now-60_000, nil, nil)
			h.enqueueWork(`{"n":2}`, now-60_000, "s1", nil)
			got := h.fetchItems(now-staleMs, lockMs, owner, int64(30_000), []string{}, "default_only", 5000, 5)
			require.NotEmpty(t, got)
			for _, w := range got {
				left := h.workerLeaseLeft(w.Token)
				t.Logf("%s: lease left at return by the database clock: %d ms", w.WorkItem, left)
				require.Greater(t, left, int64(0), "alive at return")
				require.GreaterOrEqual(t, left, lockMs-workerLeaseSlackMs, "about the timeout")
				require.LessOrEqual(t, left, lockMs, "never more than the timeout by the database clock")
				require.NoError(t, h.ackWorker(w.Token, h.dbNowMs()), "the worker's ack with a current clock succeeds")
			}
			if owner != nil {
				require.Len(t, got, 2)
				require.GreaterOrEqual(t, h.session("s1").LockedUntil-h.dbNowMs(), int64(30_000-workerLeaseSlackMs), "the session's lease is full too")
			}
		})
	}

	t.Run("a caller clock ahead of the database gets a full lease by its own clock", func(t *testing.T) {
		h := fresh(t)
		now := h.dbNowMs()
		h.enqueueWork(`{"n":1}`, now-60_000, nil, nil)
		ahead := now + 60_000
		got := h.fetchItems(ahead, lockMs, nil, nil, []string{}, "default_only", 10, 0)
		require.Len(t, got, 1)
		require.GreaterOrEqual(t, h.workerLeaseLeft(got[0].Token)-60_000, lockMs-workerLeaseSlackMs, "full by the caller's clock")
		require.NoError(t, h.ackWorker(got[0].Token, ahead+lockMs-workerLeaseSlackMs), "an ack by the caller's clock near the end of its lease")
	})

	t.Run("a session this owner holds keeps a later expiry", func(t *testing.T) {
		h := fresh(t)
		now := h.dbNowMs()
		h.enqueueWork(`{"n":1}`, now-60_000, "s1", nil)
		h.exec(`INSERT INTO duroxide.sessions VALUES ('s1', 'w1', $1, $2)`, now+600_000, now+1_000)
		require.Len(t, h.fetchItems(now, lockMs, "w1", int64(30_000), []string{}, "any", 10, 0), 1)
		s := h.session("s1")
		require.Equal(t, "w1", s.Worker)
		require.Equal(t, now+600_000, s.LockedUntil, "the later expiry is kept")
		require.GreaterOrEqual(t, s.LastActivityAt, now+1_000, "and the later activity stamp")
	})

	t.Run("bad input is refused, naming the parameter", func(t *testing.T) {
		h := fresh(t)
		now := h.dbNowMs()
		_, err := h.fetchItemsErr("", -1, lockMs, nil, nil, []string{}, "default_only", 1, 0)
		requireErrorNaming(t, err, "22023", "p_now_ms")
		_, err = h.fetchItemsErr("", now, 0, nil, nil, []string{}, "default_only", 1, 0)
		requireErrorNaming(t, err, "22023", "p_lock_timeout_ms")
		_, err = h.fetchItemsErr("", now, lockMs, "w1", 0, []string{}, "default_only", 1, 0)
		requireErrorNaming(t, err, "22023", "p_session_lock_timeout_ms")
	})
}

// (2) The fix keeps upstream's batch semantics (the same claims as the
// port's, in inflight_worker_test.go).
func TestBatchedFetchFixKeepsTheBatchSemantics(t *testing.T) {
	t.Parallel()
	requireBatchSemantics(t, batchFixed(t), true)
}

// (2) No wait on a row or a session another transaction holds: a second
// connection holds one, the fetch (whose lock_timeout would turn a wait
// into an error) returns and takes something else. Upstream's batched
// fetch, port, waits on the session row.
func TestBatchedFetchNeverWaits(t *testing.T) {
	t.Parallel()
	h := batchFixed(t)
	fresh := sharedSuite(t, h)
	// Long enough that a waiting fetch fails, never reached by one that
	// does not wait: the holders below are released only after the fetch
	// returned.
	const lockTimeout = "10s"

	t.Run("another transaction row-locks the oldest item: the fetch takes the next ones", func(t *testing.T) {
		h := fresh(t)
		now := h.dbNowMs()
		for i := range 3 {
			h.enqueueWork(fmt.Sprintf(`{"n":%d}`, i), now-60_000, nil, nil)
		}
		release := h.hold(`SELECT 1 FROM duroxide.worker_queue WHERE work_item = '{"n":0}' FOR UPDATE`)
		defer release()
		got, err := h.fetchItemsErr(lockTimeout, h.dbNowMs(), lockMs, nil, nil, []string{}, "default_only", 10, 0)
		require.NoError(t, err, "no wait on the held row")
		require.Equal(t, []string{`{"n":1}`, `{"n":2}`}, items(got))
	})

	t.Run("another transaction holds a session row: the fetch leaves that session and takes another", func(t *testing.T) {
		h := fresh(t)
		now := h.dbNowMs()
		h.enqueueWork(`{"n":"s1-a"}`, now-60_000, "s1", nil)
		h.enqueueWork(`{"n":"s1-b"}`, now-60_000, "s1", nil)
		h.enqueueWork(`{"n":"s2"}`, now-60_000, "s2", nil)
		h.exec(`INSERT INTO duroxide.sessions VALUES ('s1', 'w0', $1, $1)`, now-1_000)
		release := h.hold(`SELECT 1 FROM duroxide.sessions WHERE session_id = 's1' FOR UPDATE`)
		defer release()
		got, err := h.fetchItemsErr(lockTimeout, h.dbNowMs(), lockMs, "w2", int64(30_000), []string{}, "any", 10, 10)
		require.NoError(t, err, "no wait on the held session row")
		require.Equal(t, []string{`{"n":"s2"}`}, items(got))
		require.Equal(t, "w2", h.session("s2").Worker)
		require.Equal(t, int64(2), h.count("worker_queue", "lock_token IS NULL"), "the s1 items are left alone")
	})

	t.Run("another transaction's fetch_work_item is claiming the oldest item and creating its session: the batch takes the others", func(t *testing.T) {
		h := fresh(t)
		now := h.dbNowMs()
		h.enqueueWork(`{"n":"s1"}`, now-60_000, "s1", nil)
		h.enqueueWork(`{"n":"s2"}`, now-60_000, "s2", nil)
		h.enqueueWork(`{"n":"plain"}`, now-60_000, nil, nil)
		release := h.hold(`SELECT * FROM duroxide.fetch_work_item($1, 5000, 'w0', 30000, '{}', 'any')`, now)
		defer release()
		got, err := h.fetchItemsErr(lockTimeout, h.dbNowMs(), lockMs, "w2", int64(30_000), []string{}, "any", 10, 10)
		require.NoError(t, err)
		require.Equal(t, []string{`{"n":"plain"}`, `{"n":"s2"}`}, items(got), "s1's item and session are the other fetch's")
	})

	t.Run("upstream's batched fetch (port) waits on the held session row", func(t *testing.T) {
		t.Parallel()
		u := providerThen(t, upstream.InFlightBatchedFetch)
		now := u.dbNowMs()
		u.enqueueWork(`{"n":"s1"}`, now-60_000, "s1", nil)
		u.exec(`INSERT INTO duroxide.sessions VALUES ('s1', 'w0', $1, $1)`, now-1_000)
		release := u.hold(`SELECT 1 FROM duroxide.sessions WHERE session_id = 's1' FOR UPDATE`)
		defer release()
		_, err := u.fetchItemsErr("300ms", u.dbNowMs(), lockMs, "w2", int64(30_000), []string{}, "any", 10, 10)
		requirePgError(t, err, "55P03", "")
	})
}

// (2) Bounded: a call reads at most LEAST(GREATEST(p_max_items * 4,
// p_max_items), 1024) candidates, upstream's bound. Candidates another
// transaction holds count against it; a free item beyond it is not reached.
func TestBatchedFetchReadsAtMostItsBoundOfCandidates(t *testing.T) {
	t.Parallel()
	h := batchFixed(t)
	fresh := sharedSuite(t, h)
	for _, tc := range []struct {
		maxItems, items, held int
		want                  []string
	}{
		{1, 6, 3, []string{`{"n":3}`}},
		{1, 6, 4, nil},
		{1000, 1030, 1023, []string{`{"n":1023}`}},
		{1000, 1030, 1024, nil},
	} {
		t.Run(fmt.Sprintf("p_max_items %d, the first %d of %d items held", tc.maxItems, tc.held, tc.items), func(t *testing.T) {
			h := fresh(t)
			now := h.dbNowMs()
			h.exec(`INSERT INTO duroxide.worker_queue (work_item, visible_at, created_at)
				SELECT '{"n":' || (g - 1) || '}', to_timestamp($1 / 1000.0), to_timestamp($1 / 1000.0) FROM generate_series(1, $2::int) g`,
				now-60_000, tc.items)
			release := h.hold(`SELECT 1 FROM duroxide.worker_queue WHERE id IN (
				SELECT id FROM duroxide.worker_queue ORDER BY id LIMIT $1) FOR UPDATE`, tc.held)
			defer release()
			got, err := h.fetchItemsErr("10s", h.dbNowMs(), lockMs, nil, nil, []string{}, "default_only", tc.maxItems, 0)
			require.NoError(t, err)
			if tc.want == nil {
				require.Empty(t, got, "the free items lie beyond the bound")
				return
			}
			require.Equal(t, tc.want, items(got), "the last candidate within the bound, and no more")
		})
	}
}

// (2) The fix's cached plan reads the visible items, not the 100,000
// scheduled for later, from its 6th call on, as 0031's fetch_work_item.
// Rows read, never time.
func TestBatchedFetchHasNoGenericPlanCliff(t *testing.T) {
	t.Parallel()
	for _, side := range []struct {
		name  string
		open  func(t *testing.T) *testdb.Database
		fixed bool
	}{
		{"upstream's batched fetch, port", func(t *testing.T) *testdb.Database { return providerThen(t, upstream.InFlightBatchedFetch).db }, false},
		{"0033's fix", func(t *testing.T) *testdb.Database { return batchFixed(t).db }, true},
	} {
		t.Run(side.name, func(t *testing.T) {
			t.Parallel()
			db := side.open(t)
			rows := batchCallsBehindFutureItems(t, db, planshape.DefaultRows)
			t.Logf("rows read per call, %s, 10 items a call from 30 visible, %d scheduled for later: %v", side.name, planshape.DefaultRows, rows)
			if side.fixed {
				require.False(t, planshape.Cliff(planCalls(rows)), "no cliff from call 6 on: %v", rows)
				require.Less(t, slices.Max(rows), int64(planshape.DefaultRows/100), "every call reads a few rows: %v", rows)
			}
		})
	}
}

// batchCallsBehindFutureItems seeds db with future items scheduled for
// later and 30 visible ones, then calls fetch_work_items (10 items, no
// owner) planshape.Calls times on one new session, each call in a
// transaction rolled back, and returns the rows each call read from the
// schema's tables (pg_stat_xact_user_tables, as internal/planshape reads
// them).
func batchCallsBehindFutureItems(t *testing.T, db *testdb.Database, future int) []int64 {
	t.Helper()
	ctx := context.Background()
	seed := db.Conn(t, "")
	_, err := seed.Exec(ctx, fmt.Sprintf(`INSERT INTO %[1]s.worker_queue (work_item, visible_at, created_at)
		SELECT '{"ActivityExecute":{}}', now() + interval '1 day', now() FROM generate_series(1, %[2]d);
		INSERT INTO %[1]s.worker_queue (work_item, visible_at, created_at)
		SELECT '{"ActivityExecute":{}}', now() - interval '1 minute', now() FROM generate_series(1, 30);
		ANALYZE %[1]s.worker_queue; ANALYZE %[1]s.sessions`, pgx.Identifier{db.Schema}.Sanitize(), future))
	require.NoError(t, err, "seed")
	conn := db.Conn(t, "")
	var out []int64
	for range planshape.Calls {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		read := func() int64 {
			var n int64
			require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)), 0)::bigint
				FROM pg_stat_xact_user_tables WHERE schemaname = $1`, db.Schema).Scan(&n))
			return n
		}
		before := read()
		var n int64
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM `+db.Qualify("fetch_work_items")+`(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, 30000, NULL, NULL, ARRAY[]::text[], 'default_only', 10, 0)`).Scan(&n))
		require.EqualValues(t, 10, n, "ten of the visible items")
		out = append(out, read()-before)
		require.NoError(t, tx.Rollback(ctx))
	}
	return out
}

// Where the schema has no fetch_work_items (every pack-built schema, every
// database duroxide-pg's released runner made), 0033's Up and Down do
// nothing.
func TestFix0033DoesNothingWithoutFetchWorkItems(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fix := batchFix(t)
	r := dbs.New(t, fix.Version-1).Runner(t)
	before := takeBodies(t, r)
	_, err := r.UpTo(ctx, fix.Version)
	require.NoError(t, err)
	require.Equal(t, before, takeBodies(t, r), "no function changed")
	_, err = r.DownTo(ctx, fix.Version-1)
	require.NoError(t, err)
	require.Equal(t, before, takeBodies(t, r))
}

// 0033's guard refuses a definition it does not know, changing nothing;
// its Down restores the unfixed definition (upstream's behaviour: a dead
// lease with a stale timestamp) over the fix, which its Up knows and fixes
// again, and leaves upstream's batched fetch as it finds it.
func TestFix0033GuardAndDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fix := batchFix(t)
	fixedFP, unfixedFP := batchFixBodies(t)

	t.Run("the Up refuses a hand-edited batched fetch", func(t *testing.T) {
		t.Parallel()
		db := adoptedWithBatchedFetch(t)
		editByHand(t, db, "fetch_work_items")
		before := definitionOf(t, db, "fetch_work_items")
		r := db.Runner(t)
		_, err := r.UpTo(ctx, fix.Version)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "55000", pgErr.Code)
		require.Contains(t, pgErr.Message, "fetch_work_items")
		v, err := r.Version(ctx)
		require.NoError(t, err)
		require.Equal(t, fix.Version-1, v, "not recorded")
		require.Equal(t, before, definitionOf(t, db, "fetch_work_items"), "nothing changed")
	})

	t.Run("the Down restores the unfixed definition over the fix; the Up fixes it again", func(t *testing.T) {
		t.Parallel()
		h := batchFixed(t)
		r := h.db.Runner(t)
		_, err := r.DownTo(ctx, fix.Version-1)
		require.NoError(t, err)
		f := definitionOf(t, h.db, "fetch_work_items")
		require.True(t, f.Matches(unfixedFP), "the Down's definition: %+v", f)
		d, ok := fingerprint.Identify(f)
		require.True(t, ok)
		require.False(t, d.Fixed)
		require.Equal(t, int64(22), d.BehavesAs, "%+v", d)

		now := h.dbNowMs()
		h.enqueueWork(`{"n":1}`, now-60_000, nil, nil)
		got := h.fetchItems(now-10_000, lockMs, nil, nil, []string{}, "default_only", 5000, 0)
		require.Len(t, got, 1)
		require.Less(t, h.workerLeaseLeft(got[0].Token), int64(0), "upstream's behaviour: dead at return")
		requireBatchSemantics(t, h, false)

		_, err = r.UpTo(ctx, fix.Version)
		require.NoError(t, err)
		require.True(t, definitionOf(t, h.db, "fetch_work_items").Matches(fixedFP))
	})

	t.Run("the Down leaves upstream's batched fetch as it is, and refuses an unknown one", func(t *testing.T) {
		t.Parallel()
		db := dbs.New(t, fix.Version)
		applyInFlight(t, db, upstream.InFlightBatchedFetch)
		port := definitionOf(t, db, "fetch_work_items")
		r := db.Runner(t)
		_, err := r.DownTo(ctx, fix.Version-1)
		require.NoError(t, err)
		require.Equal(t, port, definitionOf(t, db, "fetch_work_items"), "left as it is")

		_, err = r.UpTo(ctx, fix.Version)
		require.NoError(t, err)
		editByHand(t, db, "fetch_work_items")
		edited := definitionOf(t, db, "fetch_work_items")
		_, err = r.DownTo(ctx, fix.Version-1)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "55000", pgErr.Code)
		require.Contains(t, pgErr.Message, "fetch_work_items")
		require.Equal(t, edited, definitionOf(t, db, "fetch_work_items"), "nothing changed")
	})
}

// (2) No lock per row held to the commit: a batch of 103 items (100
// plain, 3 in new sessions) leaves the call's transaction holding one
// advisory lock per new session (the claim its insert keeps), and nothing
// once it commits: the item and session claims are let go as soon as the
// row lock they guard is taken, and none outlives the transaction.
func TestBatchedFetchHoldsNoLockPerRowToCommit(t *testing.T) {
	t.Parallel()
	h := batchFixed(t)
	ctx := context.Background()
	now := h.dbNowMs()
	for i := range 100 {
		h.enqueueWork(fmt.Sprintf(`{"n":%d}`, i), now-60_000, nil, nil)
	}
	for i := range 10 {
		h.enqueueWork(fmt.Sprintf(`{"s":%d}`, i), now-60_000, fmt.Sprintf("s%d", i), nil)
	}
	conn := h.db.Conn(t, "")
	advisory := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) int {
		var n int
		require.NoError(t, q.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&n))
		return n
	}
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	rows, err := tx.Query(ctx, `SELECT out_lock_token FROM `+h.db.Qualify("fetch_work_items")+`($1, 5000, 'w1', 30000, '{}', 'any', 200, 3)`, h.dbNowMs())
	require.NoError(t, err)
	tokens, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, tokens, 103, "every plain item, and the items of the 3 new sessions the budget allows")
	require.Equal(t, 3, advisory(tx), "one lock held to the commit per new session, none per item")
	require.NoError(t, tx.Commit(ctx))
	require.Zero(t, advisory(conn), "no claim outlives the transaction")
}
