package dispatch

import (
	"strings"

	"github.com/duroxide-pg/migrations/internal/sim/eventlog"
)

// Kind says which provider call an Event records.
type Kind string

// The kinds of Event.
const (
	// KindFetch is one fetch_orchestration_item call (with or without a row).
	KindFetch Kind = "fetch"
	// kindRenew is one renew_orchestration_item_lock call.
	kindRenew Kind = "renew"
	// KindAck is the ack of a normal turn (or of a terminal instance's batch).
	KindAck Kind = "ack"
	// KindFailAck is the runtime's second ack after an ack failed: the same
	// token, carrying one OrchestrationFailed (Infrastructure) event.
	KindFailAck Kind = "fail_ack"
	// KindPoison is the poison ack of a batch whose attempt_count exceeded
	// MaxAttempts.
	KindPoison Kind = "poison"
	// kindAbandon is an abandon_orchestration_item call (only on the
	// runtime's pinned-version check, which the seeded instances pass).
	kindAbandon Kind = "abandon"
	// KindLeaseRead is the read of a fetched lease (Hooks.Call sees it;
	// the log records it in its fetch's Event).
	KindLeaseRead Kind = "lease_read"
)

// Outcomes other than an error text.
const (
	OutcomeOK               = "ok"
	OutcomeEmpty            = "empty"              // a fetch that returned no row
	OutcomeInvalidLockToken = "invalid_lock_token" // ack/abandon 'Invalid lock token', renew 'Lock token invalid, expired, or already released'
	// OutcomeUnknownPrefix starts the Outcome of a call whose result is
	// unknown: its connection was lost while it ran (package invariant
	// decides from the log whether such an ack committed).
	OutcomeUnknownPrefix = "unknown: "
)

// Unknown returns the Outcome of a call whose connection was lost with err.
func Unknown(err error) string { return OutcomeUnknownPrefix + err.Error() }

// IsUnknown reports an Outcome recorded with Unknown.
func IsUnknown(outcome string) bool { return strings.HasPrefix(outcome, OutcomeUnknownPrefix) }

// Details of a fetch.
const (
	// DetailLeaseUnread marks a fetch whose lease could not be read after
	// it returned (the read failed, typically with the connection): its
	// lease is not known to be dead.
	DetailLeaseUnread = "lease_unread"
	// DetailCrashed marks a fetch after which its dispatcher crashed
	// (Hooks.Crash): the lease was dropped, never acked nor abandoned.
	DetailCrashed = "crashed"
)

// Event is one provider call made by a simulated dispatcher. Times are epoch
// milliseconds; "caller" times are the dispatcher's own clock, skew
// included, as the runtime mints p_now_ms.
type Event struct {
	Dispatcher int    `json:"dispatcher"`
	Kind       Kind   `json:"kind"`
	Instance   string `json:"instance,omitempty"`
	Token      string `json:"token,omitempty"`
	// CallerBeforeMs is the caller's clock just before the call: the p_now_ms
	// it passed. CallerAfterMs is the caller's clock when the call returned.
	CallerBeforeMs int64 `json:"caller_before_ms"`
	CallerAfterMs  int64 `json:"caller_after_ms"`
	// LatencyUs is the call's wall time in microseconds.
	LatencyUs int64 `json:"latency_us"`
	// For a fetch that returned a row: the database clock and the lease's
	// locked_until, read right after the fetch returned; RemainingMs is
	// LockedUntilMs - CallerAfterMs. LeaseLost means the lease was no longer
	// in instance_locks when read (another dispatcher had already taken the
	// instance over, so it was expired by that dispatcher's clock):
	// LockedUntilMs and RemainingMs are then unknown (0) and the lease
	// counts as dead on arrival.
	DBAtReturnMs int64 `json:"db_at_return_ms,omitempty"`
	// DBReturnMs is the database clock when the function had returned (read
	// in the fetch's own statement). DeliveryMs is DBAtReturnMs minus it:
	// the time, by the database clock, from the function's return until
	// the lease was read after the row reached the caller (the row's
	// delivery plus one round trip).
	DBReturnMs    int64 `json:"db_return_ms,omitempty"`
	DeliveryMs    int64 `json:"delivery_ms,omitempty"`
	LockedUntilMs int64 `json:"locked_until_ms,omitempty"`
	RemainingMs   int64 `json:"remaining_ms"`
	// LeaseAgeMs is how old the lease was when the row reached the caller:
	// CallerAfterMs - (LockedUntilMs - lock timeout). A lease counted from
	// p_now_ms (version 19) is as old as the whole call; one computed at the
	// end of the call (version 20) only as old as the row's delivery.
	LeaseAgeMs int64 `json:"lease_age_ms"`
	LeaseLost  bool  `json:"lease_lost,omitempty"`
	// For an ack (kinds ack, poison, fail_ack), read in the ack's own round
	// trip, in the statement just before the ack's (same connection, same
	// batch): AckDBStartMs is the database clock_timestamp() then, a lower
	// bound of the database clock when the ack checked its lease (its
	// first step); AckLockedUntilMs is the token's locked_until then
	// (renewals included), 0 when the token held no lease any more (taken
	// over or released before the ack ran). Both 0 when not read (the
	// call failed before its result, or an event built by hand).
	AckDBStartMs     int64 `json:"ack_db_start_ms,omitempty"`
	AckLockedUntilMs int64 `json:"ack_locked_until_ms,omitempty"`
	// AttemptCount is the fetched batch's attempt_count (fetch, and the acks
	// of that batch).
	AttemptCount int32 `json:"attempt_count,omitempty"`
	// Outcome is OutcomeOK, OutcomeEmpty, OutcomeInvalidLockToken or the
	// error text.
	Outcome string `json:"outcome"`
	// Messages are the ids of the batch's messages (fetch and its acks);
	// Enqueued the ids an ack enqueued for the instance.
	Messages []string `json:"messages,omitempty"`
	Enqueued []string `json:"enqueued,omitempty"`
	// Detail qualifies an ack: "terminal" for the batch of a terminal
	// instance, acked with no changes; or a fetch: DetailLeaseUnread,
	// DetailCrashed.
	Detail string `json:"detail,omitempty"`
}

// HasRow reports a fetch that returned a row (a lease).
func (e Event) HasRow() bool { return e.Kind == KindFetch && e.Token != "" }

// Lease is a fetched lease's RemainingMs and LeaseLost (eventlog.Leased).
func (e Event) Lease() (remainingMs int64, lost bool) { return e.RemainingMs, e.LeaseLost }

// DeadOnArrival reports a fetch whose lease had already expired, by the
// caller's own clock, when the row reached the caller.
func (e Event) DeadOnArrival() bool { return e.HasRow() && (e.LeaseLost || e.RemainingMs <= 0) }

// DeadAtReturn reports a fetch whose lease had already expired, by the
// database clock, when the function returned: what the function controls.
// A lease taken over before it could be read counts as dead at return
// when the read failed; when the read ran, the takeover says only that the
// lease had at most its delivery left at return (LostInDelivery).
func (e Event) DeadAtReturn() bool {
	if !e.HasRow() {
		return false
	}
	if e.LeaseLost {
		return !e.LostInDelivery()
	}
	return e.DBReturnMs > 0 && e.LockedUntilMs <= e.DBReturnMs
}

// LostInDelivery reports a lease taken over by another dispatcher between
// the function's return and the read after its row arrived, both clocks
// read: a takeover needs the lease to have run out, so it had at most
// DeliveryMs left when the function returned, and used at least the lock
// timeout minus that (Summarize counts that bound as its age at return).
func (e Event) LostInDelivery() bool {
	return e.HasRow() && e.LeaseLost && e.DBReturnMs > 0 && e.DBAtReturnMs > 0
}

// ExpiredInDelivery reports a lease alive when the function returned but
// expired, by the caller's clock, when the row reached the caller: the
// row's delivery (a large history) outlasted the lease.
func (e Event) ExpiredInDelivery() bool { return e.DeadOnArrival() && !e.DeadAtReturn() }

// Causes of an ack refused with 'Invalid lock token' (Event.RefusedAck).
const (
	// RefusedWhileValid: the lease was still valid at the ack's clock, or
	// cannot be shown to have run out by then. A defect of the schema.
	RefusedWhileValid = "valid_when_run"
	// The lease had run out by the ack's clock: before the fetch returned
	// (or it was taken over before the fetch could read it), during the
	// row's delivery, or while the caller processed the turn and sent the
	// ack; RefusedLate when the fetch is not known.
	refusedLateAtReturn     = "late_expired_at_return"
	refusedLateInDelivery   = "late_expired_in_delivery"
	RefusedLateInProcessing = "late_expired_in_processing"
	RefusedLate             = "late"
)

// Refusal is the cause of a refused ack and the times it was judged by.
type Refusal struct {
	Cause string
	// ClockMs is the ack's clock: the later of the p_now_ms it passed and
	// AckDBStartMs (0 when no clock was read).
	ClockMs int64
	// LockedUntilMs is the lease's end: AckLockedUntilMs, or, when the
	// token held no lease any more as the ack ran, the locked_until its
	// fetch read (0: unknown).
	LockedUntilMs int64
	// LatenessMs is ClockMs - LockedUntilMs, for a late ack whose lease's
	// end is known.
	LatenessMs int64
	// ProcessingMs is, for RefusedLateInProcessing, the database clock from
	// the lease read after the row arrived to AckDBStartMs: the turn and
	// the ack's way to the database.
	ProcessingMs int64
}

// RefusedAck says why the ack e, refused with 'Invalid lock token', was
// refused, given the fetch of its lease (nil when not known). The ack
// (ack_orchestration_item, every version) refuses unless its token's
// instance_locks row exists with locked_until > p_now_ms; a fetch takes a
// lease over only once locked_until is at or before its own clock, the
// later of its caller's (carried forward) and the database's (0020 and
// later). So the lease is judged at the later of the ack's p_now_ms and
// the database clock when the ack ran, of which AckDBStartMs, read in
// the statement before the ack's in the same round trip, is a lower
// bound: a lease counted as run out surely had (locked_until <= that
// clock), and one that ran out only in the instant between that read and
// the ack's check counts as valid. Being refused while valid is not the
// caller's doing: the lease existed, or was taken over, before its end.
func (e Event) RefusedAck(fetch *Event) Refusal {
	r := Refusal{LockedUntilMs: e.AckLockedUntilMs}
	if r.LockedUntilMs == 0 && fetch != nil {
		r.LockedUntilMs = fetch.LockedUntilMs
	}
	if e.AckDBStartMs == 0 {
		r.Cause = RefusedWhileValid // no clock: not shown to be late
		return r
	}
	r.ClockMs = max(e.CallerBeforeMs, e.AckDBStartMs)
	switch {
	case r.LockedUntilMs == 0 && fetch != nil && fetch.LostInDelivery():
		// Taken over between the return and its fetch's read: run out in
		// the row's delivery, by the taker's clock.
		r.Cause = refusedLateInDelivery
		return r
	case r.LockedUntilMs == 0 && fetch != nil && fetch.LeaseLost:
		// Taken over before its fetch could read it (the read failed):
		// dead at return, which the fetch's own check counts.
		r.Cause = refusedLateAtReturn
		return r
	case r.LockedUntilMs == 0 || r.LockedUntilMs > r.ClockMs:
		r.Cause = RefusedWhileValid
		return r
	}
	r.LatenessMs = r.ClockMs - r.LockedUntilMs
	switch {
	case fetch == nil:
		r.Cause = RefusedLate
	case fetch.DBReturnMs > 0 && r.LockedUntilMs <= fetch.DBReturnMs:
		r.Cause = refusedLateAtReturn
	case fetch.DBAtReturnMs == 0:
		r.Cause = RefusedLate
	case r.LockedUntilMs <= fetch.DBAtReturnMs:
		r.Cause = refusedLateInDelivery
	default:
		r.Cause = RefusedLateInProcessing
		r.ProcessingMs = e.AckDBStartMs - fetch.DBAtReturnMs
	}
	return r
}

// ReturnAgeMs is how much of its lease the fetch had used up when the
// function returned, by the database clock: the lock timeout minus
// LockedUntilMs - DBReturnMs. A lease counted from a p_now_ms minted
// before the function waited (version 19) is as old as the wait; one
// computed as the function's last step (0020) only as old as that step and
// the return of its row. ok is false when the lease or the return clock
// was not read (for a lease LostInDelivery, Summarize counts the least it
// can have used instead).
func (e Event) ReturnAgeMs() (ageMs int64, ok bool) {
	if !e.HasRow() || e.LeaseLost || e.DBReturnMs == 0 || e.LockedUntilMs == 0 {
		return 0, false
	}
	return e.LockTimeoutMs() - (e.LockedUntilMs - e.DBReturnMs), true
}

// LockTimeoutMs is the lock timeout the fetch passed, from its lease
// (0 when the lease was not read).
func (e Event) LockTimeoutMs() int64 {
	if e.LeaseLost {
		return 0
	}
	return e.LeaseAgeMs + e.RemainingMs
}

// Log collects the events of a run; it is safe for concurrent use.
type Log = eventlog.Log[Event]

// NewLog returns an empty log.
func NewLog() *Log { return eventlog.New[Event]() }
