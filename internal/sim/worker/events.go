package worker

import (
	"math"
	"sort"
	"time"

	"github.com/duroxide-pg/migrations/internal/sim/eventlog"
)

// Kind says which provider call an Event records.
type Kind string

// The kinds of Event.
const (
	kindFetch        Kind = "fetch"         // fetch_work_item, with or without a row
	KindAck          Kind = "ack"           // ack_worker with the activity's completion
	kindRenew        Kind = "renew"         // renew_work_item_lock during a long activity
	kindRenewSession Kind = "renew_session" // a runtime's renew_session_lock
	kindCleanup      Kind = "cleanup"       // a runtime's cleanup_orphaned_sessions
	KindEnqueue      Kind = "enqueue"       // enqueue_worker_work of a replacement item (Refill)
)

// Outcomes other than an error text.
const (
	OutcomeOK      = "ok"
	outcomeEmpty   = "empty"   // a fetch that returned no row
	outcomeRefused = "refused" // ack 'Worker queue item not found…', renew 'Lock token invalid…'
)

// Event is one provider call of a simulated worker. Times are epoch
// milliseconds; "caller" times are the worker's own clock, skew included,
// as the provider mints p_now_ms.
type Event struct {
	Runtime int    `json:"runtime"`
	Slot    int    `json:"slot"`
	Kind    Kind   `json:"kind"`
	Item    string `json:"item,omitempty"`
	Session string `json:"session,omitempty"`
	Token   string `json:"token,omitempty"`
	// PID is the backend of the call's connection.
	PID            uint32 `json:"pid"`
	CallerBeforeMs int64  `json:"caller_before_ms"`
	CallerAfterMs  int64  `json:"caller_after_ms"`
	LatencyUs      int64  `json:"latency_us"`
	// For a fetch: the database clock when the function had returned (read
	// in its statement). For a fetch with a row: the lease's locked_until,
	// read right after, and RemainingMs = LockedUntilMs - DBReturnMs, the
	// lease left at return by the database clock. LeaseLost: no row carried
	// the token any more when read (another worker had already taken the
	// item over): dead at return.
	DBReturnMs    int64 `json:"db_return_ms,omitempty"`
	LockedUntilMs int64 `json:"locked_until_ms,omitempty"`
	RemainingMs   int64 `json:"remaining_ms"`
	LeaseLost     bool  `json:"lease_lost,omitempty"`
	// DBAtReadMs is the database clock when the lease was read after the
	// row arrived (0: the read failed). For a lease lost by then, it was
	// taken over between the function's return and that read: it had at
	// most that delivery left at return (LostInDelivery).
	DBAtReadMs int64 `json:"db_at_read_ms,omitempty"`
	// RefusedWhileValid marks a refused ack whose token still carried a
	// lease after the later of the ack's p_now_ms and the database clock,
	// read right after the refusal: refused before its lease ran out, a
	// defect of the schema. A refused ack without it had lost its lease
	// (ran out, taken over): the worker's lateness, a starved one's.
	RefusedWhileValid bool `json:"refused_while_valid,omitempty"`
	// Blocked: the fetch was seen waiting on a lock (wait_event_type Lock
	// in pg_stat_activity); BlockedMs from the wait's start (pg_locks
	// waitstart) to the function's return.
	Blocked   bool  `json:"blocked,omitempty"`
	BlockedMs int64 `json:"blocked_ms,omitempty"`
	// CycleUs: for an ack, the time from the start of its item's fetch call
	// to the end of the ack (activity time included).
	CycleUs int64 `json:"cycle_us,omitempty"`
	// Attempt is the attempt_count a fetch returned.
	Attempt int32 `json:"attempt_count,omitempty"`
	// Count is what renew_session_lock or cleanup_orphaned_sessions returned.
	Count   int64  `json:"count,omitempty"`
	Outcome string `json:"outcome"`
}

// HasRow reports a fetch that returned a row (a lease).
func (e Event) HasRow() bool { return e.Kind == kindFetch && e.Token != "" }

// Lease is a fetched lease's RemainingMs and LeaseLost (eventlog.Leased).
func (e Event) Lease() (remainingMs int64, lost bool) { return e.RemainingMs, e.LeaseLost }

// DeadAtReturn reports a fetch whose lease had already expired, by the
// database clock, when the function returned: its lease read at or before
// the return clock, or lost with no clock read to say when.
func (e Event) DeadAtReturn() bool {
	if !e.HasRow() {
		return false
	}
	if e.LeaseLost {
		return !e.LostInDelivery()
	}
	return e.LockedUntilMs <= e.DBReturnMs
}

// LostInDelivery reports a lease taken over between the function's return
// and its read after the row arrived, both clocks read: the delivery's
// doing (a starved worker), reported apart from the leases dead at return.
func (e Event) LostInDelivery() bool {
	return e.HasRow() && e.LeaseLost && e.DBReturnMs > 0 && e.DBAtReadMs > 0
}

// Log collects the events of a run; it is safe for concurrent use.
type Log = eventlog.Log[Event]

// newLog returns an empty log.
func newLog() *Log { return eventlog.New[Event]() }

// Summary reduces a run's events. Field names are stable (JSON).
type Summary struct {
	ElapsedS float64 `json:"elapsed_s"`
	// FetchCalls counts every fetch; Fetches those that returned a lease
	// (SessionFetches of a session-bound item), EmptyFetches those that
	// returned none, FetchErrors those that failed.
	FetchCalls     int `json:"fetch_calls"`
	Fetches        int `json:"fetches"`
	SessionFetches int `json:"session_fetches"`
	EmptyFetches   int `json:"empty_fetches"`
	FetchErrors    int `json:"fetch_errors"`
	// BlockedFetches counts fetches seen waiting on a lock (a session
	// row); MaxBlockedMs is the longest such wait.
	BlockedFetches int   `json:"blocked_fetches"`
	MaxBlockedMs   int64 `json:"max_blocked_ms"`
	// DeadAtReturn counts leases already expired by the database clock when
	// fetch_work_item returned (or taken over before they could be read).
	DeadAtReturn    int     `json:"dead_at_return"`
	DeadAtReturnPct float64 `json:"dead_at_return_pct"`
	// LostInDelivery counts the leases taken over between the return and
	// their read (Event.LostInDelivery): reported, not dead at return.
	LostInDelivery int `json:"lost_in_delivery"`
	// Acks counts ack_worker calls; RefusedAcks those refused with 'Worker
	// queue item not found or already processed'; AckErrors other failures.
	Acks        int `json:"acks"`
	RefusedAcks int `json:"refused_acks"`
	// RefusedWhileValidAcks counts the refused acks whose lease was still
	// valid (Event.RefusedWhileValid); the rest had lost their lease.
	RefusedWhileValidAcks int `json:"refused_acks_valid_when_run"`
	AckErrors             int `json:"ack_errors"`
	// Completed counts successful acks; CompletedPerS per second.
	Completed     int     `json:"completed"`
	CompletedPerS float64 `json:"completed_per_s"`
	// DeliveredTwice counts items returned by more than one fetch.
	DeliveredTwice int `json:"delivered_twice"`
	// Renewals of item leases during long activities, and refused ones.
	Renewals        int `json:"renewals"`
	RenewalsRefused int `json:"renewals_refused"`
	// Session renewals and cleanups of the runtimes, with what they returned.
	SessionRenewals int   `json:"session_renewals"`
	SessionsRenewed int64 `json:"sessions_renewed"`
	Cleanups        int   `json:"cleanups"`
	SessionsCleaned int64 `json:"sessions_cleaned"`
	// OtherErrors counts the failed calls not counted above, FirstError
	// is the first of them.
	eventlog.ErrorTally
	// Remaining lease at return by the database clock, over the leases
	// that could be read.
	RemainingSamples int   `json:"remaining_samples"`
	RemainingP1Ms    int64 `json:"remaining_p1_ms"`
	RemainingP50Ms   int64 `json:"remaining_p50_ms"`
	RemainingP99Ms   int64 `json:"remaining_p99_ms"`
	// Latencies in ms: fetch calls that returned a lease, all fetch calls,
	// acks, and whole cycles (fetch start to ack end, activity included).
	FetchP50Ms     float64 `json:"fetch_p50_ms"`
	FetchP99Ms     float64 `json:"fetch_p99_ms"`
	AnyFetchP99Ms  float64 `json:"any_fetch_p99_ms"`
	AckP50Ms       float64 `json:"ack_p50_ms"`
	AckP99Ms       float64 `json:"ack_p99_ms"`
	CycleP50Ms     float64 `json:"cycle_p50_ms"`
	CycleP99Ms     float64 `json:"cycle_p99_ms"`
	MaxAttemptSeen int     `json:"max_attempt_count"`
}

// Summarize reduces the events of a run that lasted elapsed.
func Summarize(events []Event, elapsed time.Duration) Summary {
	s := Summary{ElapsedS: elapsed.Seconds()}
	var remaining, fetchLat, anyLat, ackLat, cycle []int64
	deliveries := map[string]int{}
	noteErr := func(e Event) { s.Note(string(e.Kind), e.Outcome) }
	for _, e := range events {
		switch e.Kind {
		case kindFetch:
			s.FetchCalls++
			anyLat = append(anyLat, e.LatencyUs)
			if e.Blocked {
				s.BlockedFetches++
				s.MaxBlockedMs = max(s.MaxBlockedMs, e.BlockedMs)
			}
			switch {
			case e.HasRow():
				s.Fetches++
				fetchLat = append(fetchLat, e.LatencyUs)
				if e.Session != "" {
					s.SessionFetches++
				}
				deliveries[e.Item]++
				s.MaxAttemptSeen = max(s.MaxAttemptSeen, int(e.Attempt))
				switch {
				case e.DeadAtReturn():
					s.DeadAtReturn++
				case e.LostInDelivery():
					s.LostInDelivery++
				}
				if !e.LeaseLost {
					remaining = append(remaining, e.RemainingMs)
				}
			case e.Outcome == outcomeEmpty:
				s.EmptyFetches++
			default:
				s.FetchErrors++
				noteErr(e)
			}
		case KindAck:
			s.Acks++
			ackLat = append(ackLat, e.LatencyUs)
			switch e.Outcome {
			case OutcomeOK:
				s.Completed++
				cycle = append(cycle, e.CycleUs)
			case outcomeRefused:
				s.RefusedAcks++
				if e.RefusedWhileValid {
					s.RefusedWhileValidAcks++
				}
			default:
				s.AckErrors++
				noteErr(e)
			}
		case kindRenew:
			s.Renewals++
			if e.Outcome != OutcomeOK {
				s.RenewalsRefused++
			}
		case kindRenewSession:
			s.SessionRenewals++
			s.SessionsRenewed += e.Count
			if e.Outcome != OutcomeOK {
				noteErr(e)
			}
		case kindCleanup:
			s.Cleanups++
			s.SessionsCleaned += e.Count
			if e.Outcome != OutcomeOK {
				noteErr(e)
			}
		case KindEnqueue:
			if e.Outcome != OutcomeOK {
				noteErr(e)
			}
		}
	}
	for _, n := range deliveries {
		if n > 1 {
			s.DeliveredTwice++
		}
	}
	if s.Fetches > 0 {
		s.DeadAtReturnPct = 100 * float64(s.DeadAtReturn) / float64(s.Fetches)
	}
	if s.ElapsedS > 0 {
		s.CompletedPerS = float64(s.Completed) / s.ElapsedS
	}
	if len(remaining) > 0 {
		sortInts(remaining)
		s.RemainingSamples = len(remaining)
		s.RemainingP1Ms = eventlog.Percentile(remaining, 1)
		s.RemainingP50Ms = eventlog.Percentile(remaining, 50)
		s.RemainingP99Ms = eventlog.Percentile(remaining, 99)
	}
	s.FetchP50Ms, s.FetchP99Ms = latency(fetchLat, 50), latency(fetchLat, 99)
	s.AnyFetchP99Ms = latency(anyLat, 99)
	s.AckP50Ms, s.AckP99Ms = latency(ackLat, 50), latency(ackLat, 99)
	s.CycleP50Ms, s.CycleP99Ms = latency(cycle, 50), latency(cycle, 99)
	return s
}

func sortInts(v []int64) { sort.Slice(v, func(i, j int) bool { return v[i] < v[j] }) }

// latency is the p-th percentile of microsecond values, in ms (0 for none).
func latency(us []int64, p float64) float64 {
	if len(us) == 0 {
		return 0
	}
	s := append([]int64(nil), us...)
	sortInts(s)
	return math.Round(float64(eventlog.Percentile(s, p))/10) / 100
}

// Remaining returns the remaining lease at return (ms, database clock) of
// every fetch that returned a readable lease, and the number of leases
// lost before they could be read.
func Remaining(events []Event) (values []int64, lost int) { return eventlog.Remaining(events) }
