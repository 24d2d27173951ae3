package dispatch

import (
	"math"
	"sort"
	"strings"
	"time"

	"github.com/duroxide-pg/migrations/internal/sim/eventlog"
)

// Summary reduces a run's events. Field names are stable (JSON).
type Summary struct {
	ElapsedS float64 `json:"elapsed_s"`

	// FetchCalls counts every fetch call; Fetches those that returned a row
	// (a lease), EmptyFetches those that returned none, FetchErrors those
	// that failed.
	FetchCalls   int `json:"fetch_calls"`
	Fetches      int `json:"fetches"`
	EmptyFetches int `json:"empty_fetches"`
	FetchErrors  int `json:"fetch_errors"`
	// Deadlocks counts the fetch errors that were deadlocks (40P01).
	Deadlocks int `json:"deadlocks"`

	// DeadOnArrival counts returned leases already expired by the caller's
	// clock when the row reached it (RemainingMs <= 0, or lost before it
	// could be read); DeadOnArrivalPct is its share of Fetches.
	DeadOnArrival    int     `json:"dead_on_arrival"`
	DeadOnArrivalPct float64 `json:"dead_on_arrival_pct"`
	LeasesLost       int     `json:"leases_lost_before_read"`
	// DeadAtReturn counts returned leases already expired by the database
	// clock when the function returned (Event.DeadAtReturn): the defect
	// the fix removes. ExpiredInDelivery counts the other dead-on-arrival
	// leases, alive at return but expired by the time the row reached the
	// caller; DeliveryMaxMs is the longest delivery among them, and
	// ExpiredInShortDelivery counts those whose delivery was shorter than
	// the lock timeout (their lease was not whole at return).
	DeadAtReturn           int     `json:"dead_at_return"`
	DeadAtReturnPct        float64 `json:"dead_at_return_pct"`
	ExpiredInDelivery      int     `json:"expired_in_delivery"`
	ExpiredInShortDelivery int     `json:"expired_in_short_delivery"`
	DeliveryMaxMs          int64   `json:"expired_in_delivery_max_delivery_ms"`

	// AckCalls counts the first ack of each batch (kinds ack and poison);
	// InvalidLockAcks those refused with 'Invalid lock token', and
	// InvalidLockAckPct their number as a share of Fetches.
	AckCalls          int     `json:"ack_calls"`
	InvalidLockAcks   int     `json:"invalid_lock_acks"`
	InvalidLockAckPct float64 `json:"invalid_lock_ack_pct_of_fetches"`
	// The refused acks (InvalidLockAcks) by cause (Event.RefusedAck), each
	// judged at the ack's clock: the later of the p_now_ms it passed (what
	// the ack compares locked_until with) and the database clock read in
	// its round trip just before it ran (a lower bound of the database
	// clock when it checked its lease).
	//
	// RefusedWhileValidAcks counts those whose lease was still valid then
	// (locked_until after the ack's clock), or that cannot be shown to
	// have run out (no clock was read): a defect of the schema, not of
	// the caller. RefusedLateAcks counts those refused after the lease ran
	// out, split by where it ran out, by the database clock: before the
	// fetch returned (LateAtReturn), while the row was delivered
	// (LateInDelivery: until the lease read after it arrived), or while
	// the caller processed the turn and sent its ack (LateInProcessing).
	// Lateness is the ack's clock minus locked_until, over the late acks
	// whose locked_until is known (LatenessSamples; a lease taken over
	// before the fetch could read it has none); LateProcessingMs is, over
	// LateInProcessing, the time from the lease read after the row
	// arrived to the ack's clock read, by the database clock.
	RefusedWhileValidAcks int   `json:"refused_acks_valid_when_run"`
	RefusedLateAcks       int   `json:"refused_acks_late"`
	LateAtReturn          int   `json:"refused_acks_late_expired_at_return"`
	LateInDelivery        int   `json:"refused_acks_late_expired_in_delivery"`
	LateInProcessing      int   `json:"refused_acks_late_expired_in_processing"`
	LatenessSamples       int   `json:"refused_acks_late_lateness_samples"`
	LatenessMinMs         int64 `json:"refused_acks_late_lateness_min_ms"`
	LatenessP50Ms         int64 `json:"refused_acks_late_lateness_p50_ms"`
	LatenessMaxMs         int64 `json:"refused_acks_late_lateness_max_ms"`
	LateProcessingP50Ms   int64 `json:"refused_acks_late_processing_p50_ms"`
	LateProcessingMaxMs   int64 `json:"refused_acks_late_processing_max_ms"`
	// CompletedTurns counts successful acks of normal turns; TurnsPerSec is
	// CompletedTurns / ElapsedS.
	CompletedTurns int     `json:"completed_turns"`
	TurnsPerSec    float64 `json:"turns_per_s"`
	PoisonAcks     int     `json:"poison_acks"`
	PoisonAcksOK   int     `json:"poison_acks_ok"`
	FailAcks       int     `json:"fail_acks"`
	FailAcksOK     int     `json:"fail_acks_ok"`
	Renewals       int     `json:"renewals"`
	RenewalsFailed int     `json:"renewals_failed"`
	Abandons       int     `json:"abandons"`
	// OtherErrors counts the failed calls not counted above, FirstError
	// is the first of them.
	eventlog.ErrorTally

	// MaxAttemptCount is the highest attempt_count a fetch returned;
	// ExceededMaxAttempts says whether it exceeded MaxAttempts.
	MaxAttemptCount     int  `json:"max_attempt_count"`
	MaxAttempts         int  `json:"max_attempts"`
	ExceededMaxAttempts bool `json:"exceeded_max_attempts"`

	// Remaining lease at return (LockedUntilMs - CallerAfterMs) over the
	// leases that could be read (RemainingSamples of them), in ms.
	RemainingSamples int   `json:"remaining_samples"`
	RemainingMinMs   int64 `json:"remaining_min_ms"`
	RemainingP1Ms    int64 `json:"remaining_p1_ms"`
	RemainingP50Ms   int64 `json:"remaining_p50_ms"`
	RemainingP99Ms   int64 `json:"remaining_p99_ms"`
	RemainingMaxMs   int64 `json:"remaining_max_ms"`
	// Lease age at return (Event.LeaseAgeMs) over the same leases, in ms.
	LeaseAgeP50Ms int64 `json:"lease_age_p50_ms"`
	LeaseAgeP99Ms int64 `json:"lease_age_p99_ms"`
	LeaseAgeMaxMs int64 `json:"lease_age_max_ms"`
	// How much of its lease each fetch had used up when the function
	// returned, by the database clock (Event.ReturnAgeMs), over the leases
	// whose lease and return clock were read: ReturnAgeSamples of them, in
	// ms. What the function itself controls. A lease LostInDelivery
	// (taken over before its row's reader could read it) has no age of its
	// own: it is counted in LostInDelivery and ExpiredInDelivery, the
	// delivery's doing (a starved dispatcher), not the function's.
	// LockTimeoutMs is the lock timeout the fetches passed, read off their
	// leases (0 when none was read).
	LockTimeoutMs    int64 `json:"lock_timeout_ms"`
	LostInDelivery   int   `json:"lost_in_delivery"`
	ReturnAgeSamples int   `json:"lease_age_at_return_db_samples"`
	ReturnAgeP50Ms   int64 `json:"lease_age_at_return_db_p50_ms"`
	ReturnAgeP99Ms   int64 `json:"lease_age_at_return_db_p99_ms"`
	ReturnAgeMaxMs   int64 `json:"lease_age_at_return_db_max_ms"`

	// Fetch call latency in ms: over every call, and over the calls that
	// returned a row.
	FetchLatencyP50Ms      float64 `json:"fetch_latency_p50_ms"`
	FetchLatencyP99Ms      float64 `json:"fetch_latency_p99_ms"`
	LeaseFetchLatencyP50Ms float64 `json:"lease_fetch_latency_p50_ms"`
	LeaseFetchLatencyP99Ms float64 `json:"lease_fetch_latency_p99_ms"`
}

// Summarize reduces events of a run that lasted elapsed, with the
// runtime's max_attempts.
func Summarize(events []Event, elapsed time.Duration, maxAttempts int) Summary {
	s := Summary{ElapsedS: elapsed.Seconds(), MaxAttempts: maxAttempts}
	var remaining, age, lat, leaseLat []int64
	fetches := map[string]Event{} // lease token -> its fetch
	var lateness, processing, returnAge []int64
	noteErr := func(e Event) { s.Note(string(e.Kind), e.Outcome) }
	for _, e := range events {
		switch e.Kind {
		case KindFetch:
			s.FetchCalls++
			lat = append(lat, e.LatencyUs)
			switch {
			case e.HasRow():
				s.Fetches++
				leaseLat = append(leaseLat, e.LatencyUs)
				s.MaxAttemptCount = max(s.MaxAttemptCount, int(e.AttemptCount))
				fetches[e.Token] = e
				if e.DeadOnArrival() {
					s.DeadOnArrival++
				}
				switch {
				case e.DeadAtReturn():
					s.DeadAtReturn++
				case e.ExpiredInDelivery():
					s.ExpiredInDelivery++
					s.DeliveryMaxMs = max(s.DeliveryMaxMs, e.DeliveryMs)
					if e.DeliveryMs < e.LockTimeoutMs() {
						s.ExpiredInShortDelivery++
					}
				}
				s.LockTimeoutMs = max(s.LockTimeoutMs, e.LockTimeoutMs())
				if a, ok := e.ReturnAgeMs(); ok {
					returnAge = append(returnAge, a)
				} else if e.LostInDelivery() {
					s.LostInDelivery++
				}
				if e.LeaseLost {
					s.LeasesLost++
				} else {
					remaining = append(remaining, e.RemainingMs)
					age = append(age, e.LeaseAgeMs)
				}
			case e.Outcome == OutcomeEmpty:
				s.EmptyFetches++
			default:
				s.FetchErrors++
				if strings.Contains(e.Outcome, "40P01") {
					s.Deadlocks++
				}
				noteErr(e)
			}
		case KindAck, KindPoison:
			s.AckCalls++
			if e.Kind == KindPoison {
				s.PoisonAcks++
			}
			switch e.Outcome {
			case OutcomeOK:
				if e.Kind == KindPoison {
					s.PoisonAcksOK++
				} else if e.Detail == "" {
					s.CompletedTurns++
				}
			case OutcomeInvalidLockToken:
				s.InvalidLockAcks++
				f, fetched := fetches[e.Token]
				var fp *Event
				if fetched {
					fp = &f
				}
				r := e.RefusedAck(fp)
				switch r.Cause {
				case RefusedWhileValid:
					s.RefusedWhileValidAcks++
				default:
					s.RefusedLateAcks++
					switch r.Cause {
					case refusedLateAtReturn:
						s.LateAtReturn++
					case refusedLateInDelivery:
						s.LateInDelivery++
					case RefusedLateInProcessing:
						s.LateInProcessing++
						processing = append(processing, r.ProcessingMs)
					}
					if r.LockedUntilMs > 0 {
						lateness = append(lateness, r.LatenessMs)
					}
				}
			default:
				noteErr(e)
			}
		case KindFailAck:
			s.FailAcks++
			if e.Outcome == OutcomeOK {
				s.FailAcksOK++
			}
		case kindRenew:
			s.Renewals++
			if e.Outcome != OutcomeOK {
				s.RenewalsFailed++
			}
		case kindAbandon:
			s.Abandons++
		}
	}
	s.ExceededMaxAttempts = s.MaxAttemptCount > maxAttempts
	if s.Fetches > 0 {
		s.DeadOnArrivalPct = 100 * float64(s.DeadOnArrival) / float64(s.Fetches)
		s.InvalidLockAckPct = 100 * float64(s.InvalidLockAcks) / float64(s.Fetches)
		s.DeadAtReturnPct = 100 * float64(s.DeadAtReturn) / float64(s.Fetches)
	}
	if len(lateness) > 0 {
		sort.Slice(lateness, func(i, j int) bool { return lateness[i] < lateness[j] })
		s.LatenessSamples = len(lateness)
		s.LatenessMinMs, s.LatenessMaxMs = lateness[0], lateness[len(lateness)-1]
		s.LatenessP50Ms = Percentile(lateness, 50)
	}
	if len(returnAge) > 0 {
		sort.Slice(returnAge, func(i, j int) bool { return returnAge[i] < returnAge[j] })
		s.ReturnAgeSamples = len(returnAge)
		s.ReturnAgeP50Ms = Percentile(returnAge, 50)
		s.ReturnAgeP99Ms = Percentile(returnAge, 99)
		s.ReturnAgeMaxMs = returnAge[len(returnAge)-1]
	}
	if len(processing) > 0 {
		sort.Slice(processing, func(i, j int) bool { return processing[i] < processing[j] })
		s.LateProcessingP50Ms = Percentile(processing, 50)
		s.LateProcessingMaxMs = processing[len(processing)-1]
	}
	if s.ElapsedS > 0 {
		s.TurnsPerSec = float64(s.CompletedTurns) / s.ElapsedS
	}
	if len(remaining) > 0 {
		sort.Slice(remaining, func(i, j int) bool { return remaining[i] < remaining[j] })
		s.RemainingSamples = len(remaining)
		s.RemainingMinMs = remaining[0]
		s.RemainingMaxMs = remaining[len(remaining)-1]
		s.RemainingP1Ms = Percentile(remaining, 1)
		s.RemainingP50Ms = Percentile(remaining, 50)
		s.RemainingP99Ms = Percentile(remaining, 99)
		sort.Slice(age, func(i, j int) bool { return age[i] < age[j] })
		s.LeaseAgeP50Ms = Percentile(age, 50)
		s.LeaseAgeP99Ms = Percentile(age, 99)
		s.LeaseAgeMaxMs = age[len(age)-1]
	}
	ms := func(us int64) float64 { return math.Round(float64(us)/10) / 100 }
	if len(lat) > 0 {
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		s.FetchLatencyP50Ms, s.FetchLatencyP99Ms = ms(Percentile(lat, 50)), ms(Percentile(lat, 99))
	}
	if len(leaseLat) > 0 {
		sort.Slice(leaseLat, func(i, j int) bool { return leaseLat[i] < leaseLat[j] })
		s.LeaseFetchLatencyP50Ms, s.LeaseFetchLatencyP99Ms = ms(Percentile(leaseLat, 50)), ms(Percentile(leaseLat, 99))
	}
	return s
}

// Percentile is the nearest-rank p-th percentile of sorted values.
func Percentile(sorted []int64, p float64) int64 { return eventlog.Percentile(sorted, p) }

// Remaining returns the remaining lease at return (ms, caller's clock) of
// every fetch that returned a readable lease, and the number of leases
// lost before they could be read.
func Remaining(events []Event) (values []int64, lost int) { return eventlog.Remaining(events) }
