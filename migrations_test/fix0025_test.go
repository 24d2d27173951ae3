package migrations_test

// Claims of the pack's fix of fetch_work_item (the worker queue's fetch):
// a lease valid when it is returned, no wait on another transaction's
// session row, a bound on the sessions tried, one owner per session, no
// item delivered twice, and bad input refused. Each claim runs at the fix
// and, where the bug shows, at the version just before it; both versions
// are read from sql/.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
)

// workerLeaseSlackMs is allowed between the database clock read right after
// a call and the moment the call computed its lease.
const workerLeaseSlackMs = 200

// fixOf is the pack migration that fixes function fn, and the pack version
// just before it (the same function as upstream's).
func fixOf(t *testing.T, fn string) (before, fixed int64) {
	t.Helper()
	m, ok := migrations.FixOf(fn)
	require.True(t, ok, "the pack has a fix of %s", fn)
	return m.Version - 1, m.Version
}

// dbNowMs reads the database clock, in epoch ms.
func (h *schemaDB) dbNowMs() int64 {
	h.t.Helper()
	var ms int64
	h.scan(`SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint`, nil, &ms)
	return ms
}

// workerLease is the stored lease of an item token, read with the database
// clock in one statement.
func (h *schemaDB) workerLeaseLeft(token string) int64 {
	h.t.Helper()
	var left int64
	h.scan(`SELECT locked_until - floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
		FROM duroxide.worker_queue WHERE lock_token = $1`, []any{token}, &left)
	return left
}

// hold opens a transaction on a connection of its own, runs sql in it and
// keeps it open until release (which t's cleanup also calls).
func (h *schemaDB) hold(sql string, args ...any) (release func()) {
	h.t.Helper()
	ctx := context.Background()
	conn := h.db.Conn(h.t, "")
	tx, err := conn.Begin(ctx)
	require.NoError(h.t, err)
	_, err = tx.Exec(ctx, sql, args...)
	require.NoError(h.t, err, sql)
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback(context.Background()) }) }
	h.t.Cleanup(release)
	return release
}

// waitsOnALock reports whether a statement containing fragment is waiting
// on a heavyweight lock (a row or a transaction) in h's database.
func (h *schemaDB) waitsOnALock(fragment string) bool {
	var n int
	err := h.pool.QueryRow(h.ctx(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'
		  AND pid <> pg_backend_pid()`, fragment).Scan(&n)
	require.NoError(h.t, err)
	return n > 0
}

// fetchSession is a session-aware fetch of any tag, as the provider sends it
// for a worker with a session config.
func (h *schemaDB) fetchSession(nowMs int64, owner string, sessionTimeoutMs int64) *workItem {
	h.t.Helper()
	return h.fetchWork(nowMs, lockMs, owner, sessionTimeoutMs, []string{}, "any")
}

func (h *schemaDB) ackWorker(token string, nowMs int64) error {
	return h.try(`SELECT duroxide.ack_worker($1, NULL, NULL, $2)`, token, nowMs)
}

func TestWorkerLeaseIsValidWhenReturned(t *testing.T) {
	t.Parallel()
	before, fixed := fixOf(t, "fetch_work_item")
	const staleMs = 10_000
	for _, tc := range []struct {
		version int64
		valid   bool
	}{{before, false}, {fixed, true}, {migrations.Latest(), true}} {
		for _, owner := range []any{nil, "w1"} {
			t.Run(fmt.Sprintf("version %d, owner %v: p_now_ms %d ms stale, lock timeout %d ms", tc.version, owner, staleMs, lockMs), func(t *testing.T) {
				t.Parallel()
				h := newAtVersion(t, tc.version)
				now := h.dbNowMs()
				h.enqueueWork(`{"n":1}`, now-60_000, "s1", nil)
				h.enqueueWork(`{"n":2}`, now-60_000, nil, nil)
				w := h.fetchWork(now-staleMs, lockMs, owner, int64(30_000), []string{}, "default_only")
				require.NotNil(t, w)
				left := h.workerLeaseLeft(w.Token)
				ackErr := h.ackWorker(w.Token, h.dbNowMs())
				if !tc.valid {
					require.Less(t, left, int64(0), "at %d the lease is dead when it reaches the worker", tc.version)
					requirePgError(t, ackErr, "P0001", "Worker queue item not found or already processed")
					return
				}
				require.GreaterOrEqual(t, left, lockMs-workerLeaseSlackMs, "a full lease by the database clock")
				require.NoError(t, ackErr, "the worker's ack with a current clock succeeds")
			})
		}
	}

	t.Run("the session lease is full too, and a caller clock ahead of the database gets a full lease by its own clock", func(t *testing.T) {
		t.Parallel()
		h := newAtVersion(t, fixed)
		now := h.dbNowMs()
		h.enqueueWork(`{"n":1}`, now-60_000, "s1", nil)
		require.NotNil(t, h.fetchWork(now-staleMs, lockMs, "w1", int64(30_000), []string{}, "default_only"))
		s := h.session("s1")
		require.NotNil(t, s)
		require.GreaterOrEqual(t, s.LockedUntil-h.dbNowMs(), int64(30_000-workerLeaseSlackMs))

		h.enqueueWork(`{"n":2}`, now-60_000, nil, nil)
		ahead := h.dbNowMs() + 60_000
		w := h.fetchDefault(ahead)
		require.NotNil(t, w)
		require.GreaterOrEqual(t, h.workerLeaseLeft(w.Token)-60_000, lockMs-workerLeaseSlackMs, "full by the caller's clock")
		require.NoError(t, h.ackWorker(w.Token, ahead+lockMs-workerLeaseSlackMs), "an ack by the caller's clock near the end of its lease")
	})
}

func TestWorkerFetchNeverWaitsOnASessionRow(t *testing.T) {
	t.Parallel()
	before, fixed := fixOf(t, "fetch_work_item")
	holders := []struct {
		name string
		hold func(h *schemaDB, now int64) func()
	}{
		{"holds the session row (as a renewal or an activity stamp does)", func(h *schemaDB, now int64) func() {
			h.exec(`INSERT INTO duroxide.sessions VALUES ('s1', 'w0', $1, $1)`, now-1_000)
			return h.hold(`SELECT 1 FROM duroxide.sessions WHERE session_id = 's1' FOR UPDATE`)
		}},
		{"is in a fetch that is creating the session row", func(h *schemaDB, now int64) func() {
			return h.hold(`SELECT * FROM duroxide.fetch_work_item($1, 5000, 'w0', 30000, '{}', 'any')`, now)
		}},
	}
	for _, hl := range holders {
		t.Run("at the fix, another transaction "+hl.name+": the fetch skips that session at once", func(t *testing.T) {
			t.Parallel()
			h := newAtVersion(t, fixed)
			now := h.dbNowMs()
			h.enqueueWork(`{"n":"s1-a"}`, now-60_000, "s1", nil)
			h.enqueueWork(`{"n":"s1-b"}`, now-60_000, "s1", nil)
			h.enqueueWork(`{"n":"s2"}`, now-60_000, "s2", nil)
			release := hl.hold(h, now)
			defer release()

			// The holder is never released before the fetch returns: a
			// fetch that waited on it would not return at all.
			w := h.fetchSession(h.dbNowMs(), "w2", 30_000)
			require.NotNil(t, w, "the next session's item")
			require.Equal(t, `{"n":"s2"}`, w.WorkItem)
			require.Equal(t, "w2", h.session("s2").Worker)
			require.Equal(t, int64(2), h.count("worker_queue", "lock_token IS NULL"), "the s1 items are left alone")
		})
	}

	t.Run(fmt.Sprintf("at %d the fetch waits on the held session row", before), func(t *testing.T) {
		t.Parallel()
		h := newAtVersion(t, before)
		now := h.dbNowMs()
		h.enqueueWork(`{"n":"s1"}`, now-60_000, "s1", nil)
		h.enqueueWork(`{"n":"s2"}`, now-60_000, "s2", nil)
		h.exec(`INSERT INTO duroxide.sessions VALUES ('s1', 'w0', $1, $1)`, now-1_000)
		release := h.hold(`SELECT 1 FROM duroxide.sessions WHERE session_id = 's1' FOR UPDATE`)
		done := make(chan *workItem, 1)
		go func() {
			rows, err := h.pool.Query(h.ctx(), `SELECT out_work_item, out_lock_token, out_attempt_count
				FROM duroxide.fetch_work_item($1, $2, 'w2', 30000, '{}', 'any')`, now, lockMs)
			if err != nil {
				done <- nil
				return
			}
			out, _ := pgx.CollectRows(rows, pgx.RowToStructByPos[workItem])
			if len(out) == 0 {
				done <- nil
				return
			}
			done <- &out[0]
		}()
		require.Eventually(t, func() bool { return h.waitsOnALock("fetch_work_item") }, 20*time.Second, 10*time.Millisecond,
			"the fetch waits on the session row")
		release()
		w := <-done
		require.NotNil(t, w, "after the wait it claims the s1 item it picked before waiting")
		require.Equal(t, `{"n":"s1"}`, w.WorkItem)
	})
}

func TestWorkerFetchTriesAtMost32SessionsPerCall(t *testing.T) {
	t.Parallel()
	_, fixed := fixOf(t, "fetch_work_item")
	for _, tc := range []struct {
		held  int
		found bool
	}{{31, true}, {32, false}} {
		t.Run(fmt.Sprintf("%d older sessions held by another transaction: the free item after them is %s", tc.held,
			map[bool]string{true: "returned", false: "not reached; no row"}[tc.found]), func(t *testing.T) {
			t.Parallel()
			h := newAtVersion(t, fixed)
			now := h.dbNowMs()
			for i := range tc.held {
				s := fmt.Sprintf("held-%02d", i)
				h.enqueueWork(`{"n":"`+s+`"}`, now-60_000, s, nil)
				h.exec(`INSERT INTO duroxide.sessions VALUES ($1, 'w0', $2, $2)`, s, now-1_000)
			}
			h.enqueueWork(`{"n":"free"}`, now-60_000, "free", nil)
			release := h.hold(`SELECT 1 FROM duroxide.sessions WHERE session_id LIKE 'held-%' FOR UPDATE`)
			defer release()

			w := h.fetchSession(h.dbNowMs(), "w1", 30_000)
			if !tc.found {
				require.Nil(t, w, "the call gives up after 32 sessions")
				require.Equal(t, int64(tc.held+1), h.count("worker_queue", "lock_token IS NULL"), "nothing was claimed")
				require.Nil(t, h.session("free"))
				return
			}
			require.NotNil(t, w)
			require.Equal(t, `{"n":"free"}`, w.WorkItem)
		})
	}
}

func TestWorkerSessionFetchersHaveExactlyOneOwner(t *testing.T) {
	t.Parallel()
	_, fixed := fixOf(t, "fetch_work_item")
	const fetchers, sessions, perSession, rounds = 16, 4, 12, 3
	h := newAtVersion(t, fixed)
	now := h.dbNowMs()
	sessionOf := map[string]string{}
	for i := range sessions * perSession {
		item, session := fmt.Sprintf(`{"n":%d}`, i), fmt.Sprintf("s%d", i%sessions)
		h.enqueueWork(item, now-60_000, session, nil)
		sessionOf[item] = session
	}
	owners := map[string]map[string]bool{} // session -> owners it was delivered to
	var mu sync.Mutex
	for range rounds {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for f := range fetchers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				owner := fmt.Sprintf("w%d", f)
				<-start
				var item string
				err := h.pool.QueryRow(h.ctx(), `SELECT out_work_item
					FROM duroxide.fetch_work_item($1, 600000, $2, 600000, '{}', 'any')`, h.dbNowMs(), owner).Scan(&item)
				if err == pgx.ErrNoRows {
					return
				}
				if !assertNoError(t, err) {
					return
				}
				session := sessionOf[item]
				mu.Lock()
				defer mu.Unlock()
				if owners[session] == nil {
					owners[session] = map[string]bool{}
				}
				owners[session][owner] = true
			}()
		}
		close(start)
		wg.Wait()
	}
	require.Len(t, owners, sessions, "every session was delivered")
	for s, o := range owners {
		require.Len(t, o, 1, "session %s was delivered to exactly one owner, got %v", s, o)
		for owner := range o {
			require.Equal(t, owner, h.session(s).Worker, "and that owner holds its row")
		}
	}
}

// requireErrorNaming requires a PostgreSQL error of SQLSTATE code whose
// message names param.
func requireErrorNaming(t *testing.T, err error, code, param string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, code, pgErr.Code, "SQLSTATE of %q", pgErr.Message)
	require.Contains(t, pgErr.Message, param+" ", "the message names the parameter")
}

// assertNoError is require.NoError for goroutines other than the test's.
func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("unexpected error: %v", err)
		return false
	}
	return true
}

func TestWorkerNoItemIsDeliveredTwiceUnder16Fetchers(t *testing.T) {
	t.Parallel()
	_, fixed := fixOf(t, "fetch_work_item")
	const fetchers, items = 16, 480
	h := newAtVersion(t, fixed)
	now := h.dbNowMs()
	for i := range items {
		var session any
		if i%3 == 0 {
			session = fmt.Sprintf("s%d", i%12)
		}
		h.enqueueWork(fmt.Sprintf(`{"n":%d}`, i), now-60_000, session, nil)
	}
	var mu sync.Mutex
	delivered := map[string]int{}
	var wg sync.WaitGroup
	for f := range fetchers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var owner any
			if f%2 == 0 {
				owner = fmt.Sprintf("w%d", f)
			}
			for empty := 0; empty < 3; {
				var item, token string
				err := h.pool.QueryRow(h.ctx(), `SELECT out_work_item, out_lock_token
					FROM duroxide.fetch_work_item($1, 600000, $2, 600000, '{}', 'default_only')`, h.dbNowMs(), owner).Scan(&item, &token)
				if err == pgx.ErrNoRows {
					empty++
					// Sessions owned by another fetcher are not this one's:
					// end them so their items drain too. Rows in one order,
					// those another fetcher holds skipped: two of these
					// statements locking rows in heap order (which updates
					// reshuffle) deadlocked each other.
					_, err = h.pool.Exec(h.ctx(), `UPDATE duroxide.sessions SET locked_until = 0
						WHERE session_id IN (SELECT s.session_id FROM duroxide.sessions s
							WHERE NOT EXISTS (SELECT 1 FROM duroxide.worker_queue q WHERE q.session_id = s.session_id AND q.lock_token IS NOT NULL)
							ORDER BY s.session_id FOR UPDATE SKIP LOCKED)`)
					if !assertNoError(t, err) {
						return
					}
					continue
				}
				if !assertNoError(t, err) {
					return
				}
				empty = 0
				mu.Lock()
				delivered[item]++
				mu.Unlock()
				if !assertNoError(t, h.ackWorker(token, h.dbNowMs())) {
					return
				}
			}
		}()
	}
	wg.Wait()
	require.Zero(t, h.count("worker_queue", "true"), "every item was acked")
	require.Len(t, delivered, items, "every item was delivered")
	for item, n := range delivered {
		require.Equal(t, 1, n, "item %s was delivered %d times", item, n)
	}
}

func TestWorkerFetchNeverShortensTheOwnersSession(t *testing.T) {
	t.Parallel()
	before, fixed := fixOf(t, "fetch_work_item")
	for _, tc := range []struct {
		version int64
		kept    bool
	}{{before, false}, {fixed, true}} {
		t.Run(fmt.Sprintf("version %d: re-fetching with a 30 s session timeout a session held for 10 more minutes %s it", tc.version,
			map[bool]string{true: "keeps", false: "shortens"}[tc.kept]), func(t *testing.T) {
			t.Parallel()
			h := newAtVersion(t, tc.version)
			now := h.dbNowMs()
			h.enqueueWork(`{}`, now-60_000, "s1", nil)
			h.exec(`INSERT INTO duroxide.sessions VALUES ('s1', 'w1', $1, $2)`, now+600_000, now)
			require.NotNil(t, h.fetchSession(now, "w1", 30_000))
			if tc.kept {
				require.Equal(t, now+600_000, h.session("s1").LockedUntil)
			} else {
				require.Less(t, h.session("s1").LockedUntil, now+600_000)
			}
		})
	}
}

func TestWorkerFetchRejectsBadInputWithoutChangingAnything(t *testing.T) {
	t.Parallel()
	_, fixed := fixOf(t, "fetch_work_item")
	h := newAtVersion(t, fixed)
	now := h.dbNowMs()
	h.enqueueWork(`{}`, now-60_000, "s1", nil)
	for _, tc := range []struct {
		name  string
		args  []any
		param string
	}{
		{"NULL now", []any{nil, lockMs, "w1", nil}, "p_now_ms"},
		{"negative now", []any{int64(-1), lockMs, "w1", nil}, "p_now_ms"},
		{"NULL lock timeout", []any{now, nil, "w1", nil}, "p_lock_timeout_ms"},
		{"zero lock timeout", []any{now, int64(0), "w1", nil}, "p_lock_timeout_ms"},
		{"lock timeout above a day", []any{now, int64(86_400_001), "w1", nil}, "p_lock_timeout_ms"},
		{"zero session timeout", []any{now, lockMs, "w1", int64(0)}, "p_session_lock_timeout_ms"},
		{"session timeout above a day", []any{now, lockMs, "w1", int64(86_400_001)}, "p_session_lock_timeout_ms"},
	} {
		err := h.try(`SELECT * FROM duroxide.fetch_work_item($1, $2, $3, $4, '{}', 'any')`, tc.args...)
		requireErrorNaming(t, err, "22023", tc.param)
	}
	require.Equal(t, int64(1), h.count("worker_queue", "lock_token IS NULL AND attempt_count = 0"))
	require.Zero(t, h.count("sessions", "true"))
}

// The same database state, uncontended: the fix claims the same item, with
// the same attempt count, session owner and row changes as the version
// before it (only tokens and times differ).
func TestWorkerUncontendedFetchMatchesTheVersionBefore(t *testing.T) {
	t.Parallel()
	before, fixed := fixOf(t, "fetch_work_item")
	type outcome struct {
		Items    []string
		Attempts []int32
		Owners   []string
		Queue    []string
	}
	run := func(t *testing.T, version int64) outcome {
		h := newAtVersion(t, version)
		now := h.dbNowMs()
		h.enqueueWork(`{"n":"tagged"}`, now-60_000, nil, "gpu")
		h.enqueueWork(`{"n":"s1-a"}`, now-60_000, "s1", nil)
		h.enqueueWork(`{"n":"plain"}`, now-60_000, nil, nil)
		h.enqueueWork(`{"n":"s2"}`, now-60_000, "s2", nil)
		h.enqueueWork(`{"n":"s1-b"}`, now-60_000, "s1", nil)
		h.enqueueWork(`{"n":"later"}`, now+60_000, nil, nil)
		h.exec(`INSERT INTO duroxide.sessions VALUES ('s2', 'other', $1, $2)`, now+600_000, now)
		var out outcome
		for _, call := range []struct {
			owner any
			tags  []string
			mode  string
		}{
			{nil, []string{}, "default_only"},
			{"w1", []string{"gpu"}, "tags"},
			{"w1", []string{}, "default_only"},
			{"w2", []string{}, "any"},
			{"w1", []string{}, "any"},
			{"w1", []string{}, "any"},
			{nil, []string{}, "none"},
		} {
			w := h.fetchWork(h.dbNowMs(), lockMs, call.owner, int64(30_000), call.tags, call.mode)
			if w == nil {
				out.Items = append(out.Items, "-")
				continue
			}
			out.Items = append(out.Items, w.WorkItem)
			out.Attempts = append(out.Attempts, w.Attempts)
		}
		out.Owners = h.texts(`SELECT session_id || '=' || worker_id FROM duroxide.sessions ORDER BY session_id`)
		out.Queue = h.texts(`SELECT work_item || ':' || (lock_token IS NOT NULL) || ':' || attempt_count FROM duroxide.worker_queue ORDER BY id`)
		return out
	}
	want := run(t, before)
	got := run(t, fixed)
	require.Equal(t, want, got)
	require.Equal(t, []string{`{"n":"plain"}`, `{"n":"tagged"}`, `{"n":"s1-a"}`, "-", `{"n":"s1-b"}`, "-", "-"}, got.Items,
		"the scenario exercises tags, sessions, a foreign live session and tag mode none")
}
