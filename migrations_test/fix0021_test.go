package migrations_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/sim/orch"
)

// An ack that has checked its lease, then waits (here: on a history row
// another session is inserting), must not be overtaken by a fetch whose
// clock says the lease is over: otherwise both the ack and the new holder
// consume the same batch. 0021 locks the lease row in the ack's check.
func TestAckInFlightIsNotOvertakenByAFetch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		version    int64
		overtaken  bool
		claimDescr string
	}{
		{20, true, "at 20 (ack unchanged from 19) the fetch takes the batch over and it is processed twice"},
		{21, false, "at 21 the fetch skips the instance and the batch is consumed once"},
	} {
		t.Run(tc.claimDescr, func(t *testing.T) {
			t.Parallel()
			b := setupFix(t, tc.version)
			overtaken, left := ackInFlightOvertaken(t, b)
			if tc.overtaken {
				require.True(t, overtaken, "the race exists without 0021")
				require.Equal(t, 1, left, "the acked batch is still queued, under the new holder's token")
			} else {
				require.False(t, overtaken, "the instance whose ack is in flight is skipped")
				require.Zero(t, left, "the batch was consumed exactly once")
			}
		})
	}
}

// ackInFlightOvertaken runs the race on b's database (whose fetch must not
// wait on locks: 0020's): an ack that has passed its lease check waits on a
// history row another session inserts, while a fetch whose clock is past
// the lease runs. It reports whether that fetch took the instance over, and
// how many of the instance's messages are left queued once the ack
// succeeded.
func ackInFlightOvertaken(t *testing.T, b *fixBundle) (overtaken bool, left int) {
	t.Helper()
	ctx := context.Background()
	instance := "race-" + fmt.Sprint(time.Now().UnixNano())
	b.enqueue(t, instance)
	const timeout = 2000
	now := b.dbNow(t)
	item, err := b.c.Fetch(ctx, b.pool, now, timeout, orch.RuntimeFilter())
	require.NoError(t, err)
	require.NotNil(t, item)
	require.Equal(t, instance, item.InstanceID)
	lease, err := b.c.ReadLease(ctx, b.pool, item.LockToken)
	require.NoError(t, err)

	// Another session inserts the history row the ack will insert, and
	// keeps it uncommitted: the ack waits on it after its check.
	blocker := b.db.Conn(t, "")
	tx, err := blocker.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "INSERT INTO "+b.db.Qualify("history")+
		" (instance_id, execution_id, event_id, event_type, event_data, created_at) VALUES ($1, 1, 1, 'Blocker', '{}', now())", instance)
	require.NoError(t, err)

	acker := b.db.Conn(t, "")
	var ackerPID int
	require.NoError(t, acker.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&ackerPID))
	delta, _ := json.Marshal([]map[string]any{{"event_id": 1, "event_type": "OrchestrationStarted", "event_data": `{"event_id":1}`}})
	ackDone := make(chan error, 1)
	go func() {
		ackDone <- b.c.AckItem(ctx, acker, item.LockToken, now+10, orch.Ack{HistoryDelta: delta})
	}()
	waitUntilBlocked(t, b, ackerPID)

	// A fetch whose clock is past the lease.
	taken, err := b.c.Fetch(ctx, b.pool, lease.LockedUntilMs+1, timeout, orch.RuntimeFilter())
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, <-ackDone, "the ack passed its check and succeeds once unblocked")
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*)::int FROM "+b.db.Qualify("orchestrator_queue")+" WHERE instance_id = $1", instance).Scan(&left))
	return taken != nil, left
}

// waitUntilBlocked polls until backend pid waits on a lock (at most 10 s).
func waitUntilBlocked(t *testing.T, b *fixBundle, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		require.NoError(t, b.pool.QueryRow(context.Background(),
			"SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&waiting))
		if waiting {
			return
		}
		require.True(t, time.Now().Before(deadline), "backend %d never blocked", pid)
		time.Sleep(5 * time.Millisecond)
	}
}
