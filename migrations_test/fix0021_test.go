package migrations_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/harness/orch"
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
			ctx := context.Background()
			b := setupFix(t, tc.version)
			b.enqueue(t, "x")
			const timeout = 2000
			now := b.dbNow(t)
			item, err := b.c.Fetch(ctx, b.pool, now, timeout, orch.RuntimeFilter)
			require.NoError(t, err)
			require.NotNil(t, item)
			lease, err := b.c.ReadLease(ctx, b.pool, item.LockToken)
			require.NoError(t, err)

			// Another session inserts the history row the ack will insert,
			// and keeps it uncommitted: the ack waits on it after its check.
			blocker := b.db.Conn(t, "")
			tx, err := blocker.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			_, err = tx.Exec(ctx, "INSERT INTO "+b.db.Qualify("history")+
				" (instance_id, execution_id, event_id, event_type, event_data, created_at) VALUES ('x', 1, 1, 'Blocker', '{}', now())")
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
			taken, err := b.c.Fetch(ctx, b.pool, lease.LockedUntilMs+1, timeout, orch.RuntimeFilter)
			require.NoError(t, err)
			require.NoError(t, tx.Rollback(ctx))
			require.NoError(t, <-ackDone, "the ack passed its check and succeeds once unblocked")

			var left int
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*)::int FROM "+b.db.Qualify("orchestrator_queue")+" WHERE instance_id = 'x'").Scan(&left))
			if tc.overtaken {
				require.NotNil(t, taken, "the race exists without 0021")
				require.Equal(t, 1, left, "the acked batch is still queued, under the new holder's token")
			} else {
				require.Nil(t, taken, "the instance whose ack is in flight is skipped")
				require.Zero(t, left, "the batch was consumed exactly once")
			}
		})
	}
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
