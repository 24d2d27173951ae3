package worker

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSummarizeTellsDeadAtReturnFromLostInDelivery: a lease read at or
// before the return clock, or lost with no clock to say when, is dead at
// return; one taken over between the return and its read (both clocks
// read) is lost in delivery; a refused ack counts as refused while valid
// only when its lease was still there after the refusal.
func TestSummarizeTellsDeadAtReturnFromLostInDelivery(t *testing.T) {
	fetch := func(token string, lockedUntil, dbAtRead int64, lost bool) Event {
		return Event{Kind: kindFetch, Token: token, Item: token, Outcome: OutcomeOK, DBReturnMs: 1000,
			LockedUntilMs: lockedUntil, LeaseLost: lost, DBAtReadMs: dbAtRead}
	}
	ev := []Event{
		fetch("dead", 1000, 0, false),
		fetch("alive", 3000, 0, false),
		fetch("lost-unread", 0, 0, true),
		fetch("lost-in-delivery", 0, 1400, true),
		{Kind: KindAck, Token: "alive", Outcome: outcomeRefused},
		{Kind: KindAck, Token: "dead", Outcome: outcomeRefused, RefusedWhileValid: true},
	}
	s := Summarize(ev, 0)
	require.Equal(t, 4, s.Fetches)
	require.Equal(t, 2, s.DeadAtReturn, "dead, and lost unread")
	require.Equal(t, 1, s.LostInDelivery)
	require.True(t, ev[3].LostInDelivery())
	require.False(t, ev[2].LostInDelivery())
	require.Equal(t, 2, s.RefusedAcks)
	require.Equal(t, 1, s.RefusedWhileValidAcks)
}
