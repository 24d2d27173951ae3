package invariant

import (
	"errors"
	"testing"
	"time"

	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
)

func fetch(d int, inst, tok string, before, after int64, msgs ...string) dispatch.Event {
	return dispatch.Event{Dispatcher: d, Kind: dispatch.KindFetch, Instance: inst, Token: tok, CallerBeforeMs: before,
		CallerAfterMs: after, Outcome: dispatch.OutcomeOK, RemainingMs: 400, LockedUntilMs: after + 400, Messages: msgs, AttemptCount: 1}
}

func ack(d int, inst, tok string, before, after int64, outcome string, msgs []string, enq ...string) dispatch.Event {
	return dispatch.Event{Dispatcher: d, Kind: dispatch.KindAck, Instance: inst, Token: tok, CallerBeforeMs: before,
		CallerAfterMs: after, Outcome: outcome, Messages: msgs, Enqueued: enq}
}

func TestCleanRun(t *testing.T) {
	ev := []dispatch.Event{
		fetch(1, "a", "t1", 0, 5, "m0"),
		ack(1, "a", "t1", 10, 12, dispatch.OutcomeOK, []string{"m0"}, "m1"),
		fetch(2, "a", "t2", 13, 15, "m1"),
		ack(2, "a", "t2", 20, 22, dispatch.OutcomeOK, []string{"m1"}, "m2"),
	}
	r := Check(Input{Events: ev, Seeded: []string{"m0"}, Pending: []string{"m2"}, Instances: []string{"a"}, RequireAdvance: true, ForbidDeadLeases: true})
	if !r.OK() {
		t.Fatal(r.Err())
	}
	if r.Messages != 3 || r.CommittedAcks != 2 || r.TurnsByInstance["a"] != 2 || r.Checks == 0 {
		t.Fatalf("unexpected report %+v", r)
	}
}

// A takeover while the first holder's ack is still to come, and both acks
// commit: exclusion broken, and the message consumed twice.
func TestDoubleHolderIsCaught(t *testing.T) {
	ev := []dispatch.Event{
		fetch(1, "a", "t1", 0, 5, "m0"),
		fetch(2, "a", "t2", 500, 505, "m0"),
		ack(1, "a", "t1", 510, 512, dispatch.OutcomeOK, []string{"m0"}, "m1"),
		ack(2, "a", "t2", 520, 522, dispatch.OutcomeOK, []string{"m0"}, "m2"),
	}
	r := Check(Input{Events: ev, Seeded: []string{"m0"}, Pending: []string{"m1", "m2"}})
	if r.Count(Exclusion) != 1 || r.Count(Conservation) != 1 || r.Doubled != 1 {
		t.Fatalf("want one exclusion and one doubled message, got %v", r.Err())
	}
	// The same with the first ack refused is fine.
	ev[2].Outcome = dispatch.OutcomeInvalidLockToken
	r = Check(Input{Events: ev, Seeded: []string{"m0"}, Pending: []string{"m2"}})
	if !r.OK() {
		t.Fatal(r.Err())
	}
}

// Skew is taken off before comparing: dispatcher 2 runs 60 s ahead, so its
// fetch came after dispatcher 1's ack on the wall clock.
func TestSkewIsRemoved(t *testing.T) {
	ev := []dispatch.Event{
		fetch(1, "a", "t1", 0, 5, "m0"),
		ack(1, "a", "t1", 10, 12, dispatch.OutcomeOK, []string{"m0"}, "m1"),
		fetch(2, "a", "t2", 60_013, 60_015, "m1"),
		ack(2, "a", "t2", 60_020, 60_022, dispatch.OutcomeOK, []string{"m1"}, "m2"),
	}
	in := Input{Events: ev, Seeded: []string{"m0"}, Pending: []string{"m2"}, Skew: map[int]time.Duration{2: time.Minute}}
	if r := Check(in); !r.OK() {
		t.Fatal(r.Err())
	}
	in.Skew = nil
	in.Events[2].CallerBeforeMs, in.Events[2].CallerAfterMs = 8, 9 // fetched before 1's ack, on one clock
	if r := Check(in); r.Count(Exclusion) != 1 {
		t.Fatalf("want an exclusion violation, got %v", r.Err())
	}
}

func TestLostMessage(t *testing.T) {
	ev := []dispatch.Event{
		fetch(1, "a", "t1", 0, 5, "m0"),
		ack(1, "a", "t1", 10, 12, dispatch.OutcomeOK, []string{"m0"}, "m1"),
	}
	r := Check(Input{Events: ev, Seeded: []string{"m0", "x"}, Pending: nil})
	if r.Lost != 2 || r.Count(Conservation) != 2 {
		t.Fatalf("want m1 and x lost, got %v", r.Err())
	}
}

// An ack whose connection died: committed when what it enqueued shows up,
// not when its batch is fetched again.
func TestUnknownAckResolution(t *testing.T) {
	lost := unknown(errors.New("conn closed"))
	committed := []dispatch.Event{
		fetch(1, "a", "t1", 0, 5, "m0"),
		ack(1, "a", "t1", 10, 12, lost, []string{"m0"}, "m1"),
		ack(1, "a", "t1", 40, 42, dispatch.OutcomeInvalidLockToken, []string{"m0"}, "m1"), // the retry
		fetch(2, "a", "t2", 50, 55, "m1"),
	}
	r := Check(Input{Events: committed, Seeded: []string{"m0"}, Pending: []string{"m1"}})
	if !r.OK() || r.UnknownAcks != 1 || r.ResolvedCommitted != 1 {
		t.Fatalf("committed unknown ack: %+v %v", r, r.Err())
	}
	notCommitted := []dispatch.Event{
		fetch(1, "a", "t1", 0, 5, "m0"),
		ack(1, "a", "t1", 10, 12, lost, []string{"m0"}, "m1"),
		ack(1, "a", "t1", 40, 42, dispatch.OutcomeOK, []string{"m0"}, "m1"), // the retry commits
	}
	r = Check(Input{Events: notCommitted, Seeded: []string{"m0"}, Pending: []string{"m1"}})
	if !r.OK() || r.ResolvedCommitted != 0 || r.CommittedAcks != 1 {
		t.Fatalf("uncommitted unknown ack: %+v %v", r, r.Err())
	}
}

func TestProgressAndDeadLeases(t *testing.T) {
	f := fetch(1, "a", "t1", 0, 5, "m0")
	f.AttemptCount = 12
	f.RemainingMs = -30
	in := Input{Events: []dispatch.Event{f}, Seeded: []string{"m0"}, Pending: []string{"m0"}, MaxAttempts: 10,
		Instances: []string{"a"}, RequireAdvance: true}
	r := Check(in)
	if r.Count(Progress) != 2 || r.DeadLeases != 1 || r.Count(DeadLease) != 0 {
		t.Fatalf("want 2 progress violations and one dead lease reported, got %+v", r)
	}
	in.ExtraAttempts = map[string]int{"a": 2}
	in.ForbidDeadLeases = true
	in.RequireAdvance = false
	r = Check(in)
	if r.Count(Progress) != 0 || r.Count(DeadLease) != 1 {
		t.Fatalf("want only a dead-lease violation, got %v", r.Err())
	}
}
