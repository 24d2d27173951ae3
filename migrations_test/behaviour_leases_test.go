package migrations_test

// Helpers for the behaviour claims about times a function computes from the
// caller's clock (leases, expiries, locked_at and last_activity_at stamps)
// and about the boundaries those times draw, at every pack version.
//
// Upstream's definitions compute them from p_now_ms alone, so a claim can
// name the exact millisecond. The pack's fixes (each fix migration's header
// says so) take the caller's clock carried forward by the time the call
// itself ran (p_now_ms + clock_timestamp() - statement_timestamp()), and a
// lease is the later of that and the database clock plus the timeout. The
// test clock clock0 runs ahead of the database's, so at a fixed version a
// time is the exact one plus the few milliseconds the call ran: the claims
// below state that, and stay exact at the versions without the fix.

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// callSlackMs bounds the time one uncontended call of a function runs
// inside the database (from its statement's start to the moment it reads
// clock_timestamp()): the most a fixed function carries the caller's clock
// forward in these tests. Far above what such a call takes, so the bounds
// never flake on a loaded machine, and far below every timeout the claims
// use.
const callSlackMs int64 = 1_000

// requireLeaseFrom asserts got is the lease or expiry function wrote where
// upstream's definition writes want (a time computed from the p_now_ms the
// test passed): exactly want at a version without the pack's fix of
// function; from the fix on, want carried forward by the time the call
// itself ran, want <= got <= want + callSlackMs.
func requireLeaseFrom(t *testing.T, h *schemaDB, function string, want, got int64, msgAndArgs ...any) {
	t.Helper()
	requireCallerTime(t, h, function, want, got, msgAndArgs...)
}

// requireStampFrom is requireLeaseFrom for a stamp of the caller's now
// (instance_locks.locked_at, sessions.last_activity_at).
func requireStampFrom(t *testing.T, h *schemaDB, function string, want, got int64, msgAndArgs ...any) {
	t.Helper()
	requireCallerTime(t, h, function, want, got, msgAndArgs...)
}

func requireCallerTime(t *testing.T, h *schemaDB, function string, want, got int64, msgAndArgs ...any) {
	t.Helper()
	if !h.hasFix(function) {
		require.Equal(t, want, got, msgAndArgs...)
		return
	}
	require.GreaterOrEqual(t, got, want, msgAndArgs...)
	require.LessOrEqual(t, got, want+callSlackMs, msgAndArgs...)
}

// requireSessionFrom asserts got is the session row one call of function
// wrote: owner exactly, lease and last activity as requireLeaseFrom and
// requireStampFrom say.
func requireSessionFrom(t *testing.T, h *schemaDB, function string, want sessionRow, got *sessionRow) {
	t.Helper()
	require.NotNil(t, got, "no session row")
	require.Equal(t, want.Worker, got.Worker, "session owner")
	requireLeaseFrom(t, h, function, want.LockedUntil, got.LockedUntil, "session locked_until")
	requireStampFrom(t, h, function, want.LastActivityAt, got.LastActivityAt, "session last_activity_at")
}

// justBefore is the latest p_now_ms at which a call of function still
// judges the instant x (a lease's end, a message's visible_at) not reached:
// x-1 at a version without the pack's fix of function; from the fix on the
// call carries that clock forward by the time it runs, so x-1-callSlackMs.
func (h *schemaDB) justBefore(function string, x int64) int64 {
	if h.hasFix(function) {
		return x - 1 - callSlackMs
	}
	return x - 1
}

// workerLease is the locked_until of the i-th worker_queue row by id, which
// must be leased.
func (h *schemaDB) workerLease(i int) int64 {
	h.t.Helper()
	rows := h.workerRows()
	require.Greater(h.t, len(rows), i, "worker_queue has no row %d", i)
	require.NotNil(h.t, rows[i].LockedUntil, "worker_queue row %d is not leased", i)
	return *rows[i].LockedUntil
}
