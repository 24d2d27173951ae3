package migrations_test

// Claims of the pack's fix of the three lease renewals: a renewal that
// waited on its row still leaves a full lease, a lease that expired while
// the renewal waited is not revived, a renewal never shortens a lease, and
// bad input is refused. Each claim runs at the fix and at the version just
// before it, both read from sql/.

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// renewalWait is how long the tests keep a renewal waiting on its row.
const renewalWait = 1500 * time.Millisecond

// renewal is one renewal function driven the way duroxide-pg drives it.
type renewal struct {
	fn string
	// lease creates a lease that is live until untilMs and returns the SQL
	// that row-locks it (as an ack, an abandon or a fetch would) and its
	// arguments.
	lease func(h *schemaDB, nowMs, untilMs int64) (lockSQL string, lockArgs []any)
	// renew renews it with the caller's clock now and an extension of
	// extendMs; renewed is false when the lease was not renewed.
	renew func(h *schemaDB, nowMs, extendMs int64) (renewed bool, err error)
	// until reads the lease's expiry.
	until func(h *schemaDB) int64
	// refused is the error of a lease that is not live, for the functions
	// that raise one.
	refused string
}

func renewals() []renewal {
	return []renewal{
		{
			fn: "renew_work_item_lock",
			lease: func(h *schemaDB, now, until int64) (string, []any) {
				h.enqueueWork(`{}`, now-60_000, "s1", nil)
				w := h.fetchSession(now, "w1", 600_000)
				require.NotNil(h.t, w)
				h.exec(`UPDATE duroxide.worker_queue SET locked_until = $1`, until)
				return `SELECT 1 FROM duroxide.worker_queue WHERE lock_token = $1 FOR UPDATE`, []any{w.Token}
			},
			renew: func(h *schemaDB, now, extend int64) (bool, error) {
				var token string
				h.scan(`SELECT lock_token FROM duroxide.worker_queue`, nil, &token)
				err := h.try(`SELECT duroxide.renew_work_item_lock($1, $2, $3)`, token, now, extend/1000)
				return err == nil, err
			},
			until: func(h *schemaDB) int64 {
				var until int64
				h.scan(`SELECT locked_until FROM duroxide.worker_queue`, nil, &until)
				return until
			},
			refused: "Lock token invalid, expired, or already acked",
		},
		{
			fn: "renew_session_lock",
			lease: func(h *schemaDB, now, until int64) (string, []any) {
				h.exec(`INSERT INTO duroxide.sessions VALUES ('renewed', 'owner', $1, $2)`, until, now)
				return `SELECT 1 FROM duroxide.sessions WHERE session_id = $1 FOR UPDATE`, []any{"renewed"}
			},
			renew: func(h *schemaDB, now, extend int64) (bool, error) {
				var n int64
				err := h.pool.QueryRow(h.ctx(), `SELECT duroxide.renew_session_lock('{owner}', $1, $2, 600000)`, now, extend).Scan(&n)
				return n == 1, err
			},
			until: func(h *schemaDB) int64 { return h.session("renewed").LockedUntil },
		},
		{
			fn: "renew_orchestration_item_lock",
			lease: func(h *schemaDB, now, until int64) (string, []any) {
				h.enqueueOrch("i1", startItem("i1", "Demo", "1.0.0", 1), now-60_000)
				item, err := h.fetchOrchErr(now, lockMs, nil, nil)
				require.NoError(h.t, err)
				require.NotNil(h.t, item)
				h.exec(`UPDATE duroxide.instance_locks SET locked_until = $1`, until)
				h.exec(`UPDATE duroxide.orchestrator_queue SET locked_until = $1`, until)
				return `SELECT 1 FROM duroxide.instance_locks WHERE lock_token = $1 FOR UPDATE`, []any{item.Token}
			},
			renew: func(h *schemaDB, now, extend int64) (bool, error) {
				var token string
				h.scan(`SELECT lock_token FROM duroxide.instance_locks`, nil, &token)
				err := h.try(`SELECT duroxide.renew_orchestration_item_lock($1, $2, $3)`, token, now, extend/1000)
				return err == nil, err
			},
			until: func(h *schemaDB) int64 {
				var until, queued int64
				h.scan(`SELECT l.locked_until, q.locked_until FROM duroxide.instance_locks l
					JOIN duroxide.orchestrator_queue q ON q.lock_token = l.lock_token`, nil, &until, &queued)
				require.Equal(h.t, until, queued, "the claimed messages carry the lease's expiry")
				return until
			},
			refused: "Lock token invalid, expired, or already released",
		},
	}
}

// renewWhileHeld starts r's renewal with the caller's clock now while
// another transaction holds the lease's row, waits until the renewal waits
// on it, keeps it waiting for renewalWait, releases the row and returns
// the renewal's outcome.
func renewWhileHeld(h *schemaDB, r renewal, lockSQL string, lockArgs []any, now, extendMs int64) (bool, error) {
	h.t.Helper()
	release := h.hold(lockSQL, lockArgs...)
	type outcome struct {
		renewed bool
		err     error
	}
	done := make(chan outcome, 1)
	go func() {
		renewed, err := r.renew(h, now, extendMs)
		done <- outcome{renewed, err}
	}()
	require.Eventually(h.t, func() bool { return h.waitsOnALock(r.fn) }, 20*time.Second, 10*time.Millisecond,
		"%s waits on the row another transaction holds", r.fn)
	time.Sleep(renewalWait) // the length of the wait, not an assertion
	release()
	o := <-done
	return o.renewed, o.err
}

func TestRenewalThatWaitedLeavesAFullLease(t *testing.T) {
	t.Parallel()
	const extend = 8_000
	for _, r := range renewals() {
		before, fixed := fixOf(t, r.fn)
		for _, version := range []int64{before, fixed} {
			t.Run(fmt.Sprintf("%s at %d, kept waiting %v, extends by %d ms", r.fn, version, renewalWait, extend), func(t *testing.T) {
				t.Parallel()
				h := newAtVersion(t, version)
				now := h.dbNowMs()
				lockSQL, lockArgs := r.lease(h, now, now+4_000)
				renewed, err := renewWhileHeld(h, r, lockSQL, lockArgs, h.dbNowMs(), extend)
				require.NoError(t, err)
				require.True(t, renewed)
				left := r.until(h) - h.dbNowMs()
				if version == fixed {
					require.GreaterOrEqual(t, left, int64(extend-workerLeaseSlackMs), "the extension counts from after the wait")
					return
				}
				require.Less(t, left, int64(extend)-renewalWait.Milliseconds()/2, "at %d the expiry was computed before the wait", version)
			})
		}
	}
}

func TestRenewalDoesNotReviveALeaseThatExpiredWhileItWaited(t *testing.T) {
	t.Parallel()
	for _, r := range renewals() {
		before, fixed := fixOf(t, r.fn)
		for _, version := range []int64{before, fixed} {
			t.Run(fmt.Sprintf("%s at %d: a lease with 500 ms left, kept waiting %v", r.fn, version, renewalWait), func(t *testing.T) {
				t.Parallel()
				h := newAtVersion(t, version)
				now := h.dbNowMs()
				lockSQL, lockArgs := r.lease(h, now, now+500)
				renewed, err := renewWhileHeld(h, r, lockSQL, lockArgs, h.dbNowMs(), 5_000)
				if version == before {
					require.NoError(t, err)
					require.True(t, renewed, "at %d the stale clock says the lease is live", version)
					return
				}
				require.False(t, renewed, "the lease expired during the wait")
				if r.refused != "" {
					requirePgError(t, err, "P0001", r.refused)
				} else {
					require.NoError(t, err)
				}
			})
		}
	}
}

func TestRenewalNeverShortensALease(t *testing.T) {
	t.Parallel()
	for _, r := range renewals() {
		before, fixed := fixOf(t, r.fn)
		for _, version := range []int64{before, fixed} {
			// 999 ms is what duroxide-pg sends as 0 seconds for the two
			// renewals that take seconds.
			for _, extend := range []int64{5_000, 999} {
				t.Run(fmt.Sprintf("%s at %d: a lease 10 minutes ahead renewed by %d ms", r.fn, version, extend), func(t *testing.T) {
					t.Parallel()
					h := newAtVersion(t, version)
					now := h.dbNowMs()
					r.lease(h, now, now+600_000)
					renewed, err := r.renew(h, h.dbNowMs(), extend)
					require.NoError(t, err)
					require.True(t, renewed)
					if version == fixed {
						require.Equal(t, now+600_000, r.until(h), "kept")
						return
					}
					require.Less(t, r.until(h), now+60_000, "at %d the renewal replaces the expiry outright", version)
				})
			}
		}
	}
}

func TestRenewalsRejectBadInputWithoutChangingAnything(t *testing.T) {
	t.Parallel()
	_, fixed := fixOf(t, "renew_session_lock")
	h := newAtVersion(t, fixed)
	now := h.dbNowMs()
	for _, r := range renewals() {
		r.lease(h, now, now+60_000)
	}
	for _, tc := range []struct {
		sql   string
		args  []any
		param string
	}{
		{`SELECT duroxide.renew_work_item_lock('x', $1, $2)`, []any{nil, 5}, "p_now_ms"},
		{`SELECT duroxide.renew_work_item_lock('x', $1, $2)`, []any{-1, 5}, "p_now_ms"},
		{`SELECT duroxide.renew_work_item_lock('x', $1, $2)`, []any{now, nil}, "p_extend_secs"},
		{`SELECT duroxide.renew_work_item_lock('x', $1, $2)`, []any{now, -1}, "p_extend_secs"},
		{`SELECT duroxide.renew_work_item_lock('x', $1, $2)`, []any{now, 86_401}, "p_extend_secs"},
		{`SELECT duroxide.renew_orchestration_item_lock('x', $1, $2)`, []any{nil, 5}, "p_now_ms"},
		{`SELECT duroxide.renew_orchestration_item_lock('x', $1, $2)`, []any{now, -1}, "p_extend_secs"},
		{`SELECT duroxide.renew_session_lock('{owner}', $1, $2, $3)`, []any{nil, 5_000, 60_000}, "p_now_ms"},
		{`SELECT duroxide.renew_session_lock('{owner}', $1, $2, $3)`, []any{now, nil, 60_000}, "p_extend_ms"},
		{`SELECT duroxide.renew_session_lock('{owner}', $1, $2, $3)`, []any{now, 86_400_001, 60_000}, "p_extend_ms"},
		{`SELECT duroxide.renew_session_lock('{owner}', $1, $2, $3)`, []any{now, 5_000, nil}, "p_idle_timeout_ms"},
		{`SELECT duroxide.renew_session_lock('{owner}', $1, $2, $3)`, []any{now, 5_000, -1}, "p_idle_timeout_ms"},
	} {
		requireErrorNaming(t, h.try(tc.sql, tc.args...), "22023", tc.param)
	}
	for _, r := range renewals() {
		require.Equal(t, now+60_000, r.until(h), "%s: nothing changed", r.fn)
	}
	var n int64
	h.scan(`SELECT duroxide.renew_session_lock(NULL, $1, 5000, 60000) + duroxide.renew_session_lock('{}', $1, 5000, 60000)`, []any{now}, &n)
	require.Zero(t, n, "NULL or no owners renew nothing, as before")
}
