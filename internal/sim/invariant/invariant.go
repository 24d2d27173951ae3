// Package invariant checks the reliability invariants of a dispatcher run
// from its event log (package dispatch's Event: every fetch, ack, fail_ack,
// poison ack and abandon), the ids seeded and the ids still pending at the
// end:
//
//   - Exclusion: for one instance, no two leases that were live at the same
//     moment both led to a committed ack. Concretely, for leases A and B of
//     one instance that both have a committed ack, it is a violation when
//     A's ack started after B's fetch had returned AND B's ack started
//     after A's fetch had returned (on the wall clock: caller times minus
//     the caller's skew). Whichever lease was granted first, its holder
//     then checked its token while the other lease already existed, and
//     the check passed. The test is conservative: it flags only what
//     certainly happened.
//   - Conservation ("nothing lost, nothing doubled"): every message seeded
//     or enqueued by a committed ack is consumed by exactly one committed
//     ack or is still pending, and nothing else is consumed or pending.
//   - Progress: no fetch returns a batch whose attempt_count exceeds
//     MaxAttempts plus the attempts the injected faults may account for;
//     optionally, every instance completes at least one turn.
//   - Dead leases: fetches whose lease had already expired, by the caller's
//     clock, when the row reached the caller (reported; a violation only
//     when ForbidDeadLeases).
//
// Faults make some outcomes unknown: an ack whose connection died may or
// may not have committed. Such events carry an Outcome starting with
// outcomeUnknownPrefix, and the checker decides from the log: an ack that
// enqueued ids committed iff one of them was later fetched or is pending; an
// ack that enqueued nothing committed iff none of its batch's messages was
// fetched again under another token or is pending.
package invariant

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
	"github.com/duroxide-pg/migrations/internal/sim/eventlog"
)

// outcomeUnknownPrefix starts the Outcome of a call whose result is unknown
// (the connection was lost while it ran); the dispatchers record it
// (dispatch.Unknown).
const outcomeUnknownPrefix = dispatch.OutcomeUnknownPrefix

// detailLeaseUnread marks a fetch whose lease could not be read after it
// returned (the connection was lost): it is not counted as dead.
const detailLeaseUnread = dispatch.DetailLeaseUnread

// unknown returns the Outcome of a call whose connection was lost with err.
func unknown(err error) string { return dispatch.Unknown(err) }

// isUnknown reports an Outcome recorded with unknown.
func isUnknown(outcome string) bool { return dispatch.IsUnknown(outcome) }

// The invariants, as named in Violation.Invariant.
const (
	Exclusion    = "exclusion"
	Conservation = "conservation"
	Progress     = "progress"
	DeadLease    = "dead_lease"
)

// Input is what Check needs.
type Input struct {
	Events []dispatch.Event
	// Seeded are the ids of the messages queued before the run; Pending the
	// ids still queued after it.
	Seeded  []string
	Pending []string
	// Skew is each dispatcher's clock offset (by Event.Dispatcher), to put
	// caller times on the wall clock. Missing: 0.
	Skew map[int]time.Duration
	// MaxAttempts is the runtime's max_attempts (dispatch default when 0).
	MaxAttempts int
	// ExtraAttempts are attempts the injected faults may account for, by
	// instance; the key "" applies to every instance.
	ExtraAttempts map[string]int
	// Instances, with RequireAdvance, must each complete at least one turn.
	Instances      []string
	RequireAdvance bool
	// ForbidDeadLeases makes every dead lease a violation.
	ForbidDeadLeases bool
}

// Violation is one broken invariant.
type Violation struct {
	Invariant string `json:"invariant"`
	Instance  string `json:"instance,omitempty"`
	Detail    string `json:"detail"`
}

func (v Violation) String() string {
	if v.Instance == "" {
		return v.Invariant + ": " + v.Detail
	}
	return v.Invariant + " [" + v.Instance + "]: " + v.Detail
}

// Report is what Check found. Field names are stable (JSON).
type Report struct {
	// Leases counts fetches that returned a row; CommittedAcks the acks
	// (ack, fail_ack, poison) that committed, UnknownAcks the acks whose
	// outcome was unknown and ResolvedCommitted how many of those the log
	// shows committed.
	Leases            int `json:"leases"`
	CommittedAcks     int `json:"committed_acks"`
	UnknownAcks       int `json:"unknown_acks"`
	ResolvedCommitted int `json:"unknown_acks_committed"`
	// Per invariant, the number of individual checks made.
	ExclusionPairs int `json:"exclusion_pairs_checked"`
	Messages       int `json:"messages_checked"`
	Lost           int `json:"messages_lost"`
	Doubled        int `json:"messages_doubled"`
	DeadLeases     int `json:"dead_leases"`
	// MaxAttemptCount is the highest attempt_count a fetch returned.
	MaxAttemptCount int `json:"max_attempt_count"`
	// TurnsByInstance counts committed normal turns per instance.
	TurnsByInstance map[string]int `json:"turns_by_instance"`
	// Checks is the total number of checks made (every invariant).
	Checks     int         `json:"checks"`
	Violations []Violation `json:"violations,omitempty"`
}

// OK reports no violation.
func (r Report) OK() bool { return len(r.Violations) == 0 }

// Count returns the number of violations of one invariant.
func (r Report) Count(invariant string) int {
	n := 0
	for _, v := range r.Violations {
		if v.Invariant == invariant {
			n++
		}
	}
	return n
}

// Err is nil when OK, else an error listing (up to 10) violations.
func (r Report) Err() error {
	if r.OK() {
		return nil
	}
	var parts []string
	for i, v := range r.Violations {
		if i == 10 {
			parts = append(parts, fmt.Sprintf("… and %d more", len(r.Violations)-10))
			break
		}
		parts = append(parts, v.String())
	}
	return fmt.Errorf("%d invariant violation(s): %s", len(r.Violations), strings.Join(parts, "; "))
}

// lease is one fetched row and its committed ack, on the wall clock.
type lease struct {
	instance                string
	token                   string
	fetchBefore, fetchAfter int64
	ackBefore, ackAfter     int64
	committed               bool
}

// Check checks every invariant.
func Check(in Input) Report {
	maxAttempts := in.MaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = dispatch.DefaultMaxAttempts
	}
	r := Report{TurnsByInstance: map[string]int{}}
	wall := func(e dispatch.Event, ms int64) int64 { return ms - in.Skew[e.Dispatcher].Milliseconds() }

	pending := map[string]int{}
	for _, id := range in.Pending {
		pending[id]++
	}
	// Where each message id was fetched: tokens that got it.
	fetchedBy := map[string]map[string]bool{}
	leases := map[string]*lease{}
	var order []*lease
	for _, e := range in.Events {
		if !e.HasRow() {
			continue
		}
		r.Leases++
		for _, id := range e.Messages {
			if id == "" {
				continue
			}
			if fetchedBy[id] == nil {
				fetchedBy[id] = map[string]bool{}
			}
			fetchedBy[id][e.Token] = true
		}
		l := &lease{instance: e.Instance, token: e.Token, fetchBefore: wall(e, e.CallerBeforeMs), fetchAfter: wall(e, e.CallerAfterMs)}
		leases[e.Token] = l
		order = append(order, l)

		// Progress.
		r.Checks++
		r.MaxAttemptCount = max(r.MaxAttemptCount, int(e.AttemptCount))
		if allowed := maxAttempts + in.ExtraAttempts[e.Instance] + in.ExtraAttempts[""]; int(e.AttemptCount) > allowed {
			r.Violations = append(r.Violations, Violation{Progress, e.Instance,
				fmt.Sprintf("dispatcher %d fetched attempt_count %d > %d (max_attempts %d + fault allowance)", e.Dispatcher, e.AttemptCount, allowed, maxAttempts)})
		}
		// Dead leases.
		r.Checks++
		if e.Detail != detailLeaseUnread && (e.LeaseLost || e.RemainingMs <= 0) {
			r.DeadLeases++
			if in.ForbidDeadLeases {
				r.Violations = append(r.Violations, Violation{DeadLease, e.Instance,
					fmt.Sprintf("dispatcher %d got a lease with %d ms left by its clock (lost before read: %v)", e.Dispatcher, e.RemainingMs, e.LeaseLost)})
			}
		}
	}

	// Decide which acks committed.
	produced, consumed := dispatch.Seeded(in.Seeded), map[string]int{}
	// A token commits at most once (its ack deletes the lease): an unknown
	// ack of a token that also has a known committed ack, or whose earlier
	// unknown ack was already found committed, did not commit (a retry
	// carries the same enqueued ids).
	okTokens := map[string]bool{}
	for _, e := range in.Events {
		if e.Kind.IsAck() && e.Outcome == dispatch.OutcomeOK {
			okTokens[e.Token] = true
		}
	}
	resolved := map[string]bool{}
	for _, e := range in.Events {
		if !e.Kind.IsAck() {
			continue
		}
		committed := e.Outcome == dispatch.OutcomeOK
		if isUnknown(e.Outcome) {
			r.UnknownAcks++
			committed = !okTokens[e.Token] && !resolved[e.Token] && resolveUnknown(e, fetchedBy, pending)
			if committed {
				r.ResolvedCommitted++
				resolved[e.Token] = true
			}
		}
		if !committed {
			continue
		}
		r.CommittedAcks++
		e.CountCommitted(produced, consumed)
		if e.Kind == dispatch.KindAck && e.Detail == "" {
			r.TurnsByInstance[e.Instance]++
		}
		l := leases[e.Token]
		if l == nil {
			r.Violations = append(r.Violations, Violation{Exclusion, e.Instance,
				fmt.Sprintf("dispatcher %d's %s with a token no fetch returned committed", e.Dispatcher, e.Kind)})
			continue
		}
		if l.committed {
			r.Violations = append(r.Violations, Violation{Exclusion, e.Instance,
				fmt.Sprintf("token %s acked twice", short(e.Token))})
			continue
		}
		l.committed = true
		l.ackBefore, l.ackAfter = wall(e, e.CallerBeforeMs), wall(e, e.CallerAfterMs)
	}

	// Exclusion, per instance, over the leases with a committed ack, by
	// fetch start: for i < j, a violation needs B's fetch to have returned
	// before A's ack started, hence B.fetchBefore < A.ackBefore.
	byInstance := map[string][]*lease{}
	for _, l := range order {
		if l.committed {
			byInstance[l.instance] = append(byInstance[l.instance], l)
		}
	}
	for inst, ls := range byInstance {
		sort.SliceStable(ls, func(i, j int) bool { return ls[i].fetchBefore < ls[j].fetchBefore })
		for i, a := range ls {
			for _, b := range ls[i+1:] {
				if b.fetchBefore >= a.ackBefore {
					break
				}
				r.ExclusionPairs++
				if a.ackBefore > b.fetchAfter && b.ackBefore > a.fetchAfter {
					r.Violations = append(r.Violations, Violation{Exclusion, inst, fmt.Sprintf(
						"leases %s (fetched %d..%d, acked from %d) and %s (fetched %d..%d, acked from %d) both committed: each ack began after the other lease was granted",
						short(a.token), a.fetchBefore, a.fetchAfter, a.ackBefore, short(b.token), b.fetchBefore, b.fetchAfter, b.ackBefore)})
				}
			}
		}
		r.ExclusionPairs += len(ls) // each lease checked for a second ack
	}
	r.Checks += r.ExclusionPairs

	// Conservation.
	for _, t := range eventlog.Tallies(produced, consumed, in.Pending) {
		r.Messages++
		switch {
		case t.Conserved():
		case t.Produced == 0:
			r.Violations = append(r.Violations, Violation{Conservation, "", fmt.Sprintf("%s consumed %d / pending %d times but never produced", t.ID, t.Consumed, t.Pending)})
		case t.Produced > 1:
			r.Doubled++
			r.Violations = append(r.Violations, Violation{Conservation, "", fmt.Sprintf("%s produced %d times", t.ID, t.Produced)})
		case t.Consumed+t.Pending == 0:
			r.Lost++
			r.Violations = append(r.Violations, Violation{Conservation, "", fmt.Sprintf("%s lost: produced, never consumed, not pending", t.ID)})
		default:
			r.Doubled++
			r.Violations = append(r.Violations, Violation{Conservation, "", fmt.Sprintf("%s doubled: consumed %d times, pending %d times", t.ID, t.Consumed, t.Pending)})
		}
	}
	r.Checks += r.Messages

	// Advance.
	if in.RequireAdvance {
		for _, inst := range in.Instances {
			r.Checks++
			if r.TurnsByInstance[inst] == 0 {
				r.Violations = append(r.Violations, Violation{Progress, inst, "completed no turn in the whole run"})
			}
		}
	}
	return r
}

// resolveUnknown decides whether an ack whose connection was lost
// committed.
func resolveUnknown(e dispatch.Event, fetchedBy map[string]map[string]bool, pending map[string]int) bool {
	if len(e.Enqueued) > 0 {
		for _, id := range e.Enqueued {
			if len(fetchedBy[id]) > 0 || pending[id] > 0 {
				return true
			}
		}
		return false
	}
	for _, id := range e.Messages {
		if id == "" {
			continue
		}
		if pending[id] > 0 {
			return false
		}
		for tok := range fetchedBy[id] {
			if tok != e.Token {
				return false
			}
		}
	}
	return true
}

func short(token string) string {
	if len(token) > 8 {
		return token[:8]
	}
	return token
}
