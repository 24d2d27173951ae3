package migrations_test

// The defects of fetch_orchestration_item that version 19 keeps on purpose
// (upstream's own, documented): a lease computed from
// the caller's possibly stale clock, a blocking advisory lock on the oldest
// candidate, and a batch that can come back empty. Fixes belong after 19.

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestKeptFetchDefects(t *testing.T) {
	atEveryVersionWithout(t, "fetch_orchestration_item", func(t *testing.T, fresh func(*testing.T) *schemaDB) {

		t.Run("a fetch with a stale clock hands out a lease that is already expired (13.1)", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0-60_000)
			stale := clock0 - 10_000 // the caller's clock, taken long before the call ran at clock0
			it := h.mustFetchOrch(stale, "order-1")
			require.Equal(t, stale+lockMs, h.instanceLock("order-1").LockedUntil, "the lease ends before the real now")

			requirePgError(t, h.ackErr(it.Token, clock0, turn{}), "P0001", "Invalid lock token")
			next := h.mustFetchOrch(clock0, "order-1")
			require.NotEqual(t, it.Token, next.Token, "another fetcher takes the instance at once")
			require.EqualValues(t, 2, next.Attempts, "the attempt count climbs although no turn ran")
		})

		t.Run("a batch can be empty with attempt count 1 when every message carries a live foreign token (3.6)", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("order-1", externalItem("order-1", "x"), clock0)
			first := h.mustFetchOrch(clock0, "order-1")
			// The lease row vanishes while the messages keep the first token.
			h.exec(`DELETE FROM duroxide.instance_locks`)

			it := h.mustFetchOrch(clock0+10, "order-1")
			require.NotEqual(t, first.Token, it.Token)
			require.Empty(t, it.Messages)
			require.EqualValues(t, 1, it.Attempts)
			rows := h.orchRows()
			require.Equal(t, ptrTo(first.Token), rows[0].Token, "the message keeps its live foreign token")
			require.EqualValues(t, 1, rows[0].Attempts)
		})

		t.Run("fetch waits on the advisory key of the oldest candidate although another instance is claimable (13.2)", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("oldest", externalItem("oldest", "x"), clock0-1_000)
			h.enqueueOrch("second", externalItem("second", "x"), clock0)
			ctx := context.Background()

			holder := h.db.Conn(t, "")
			tx, err := holder.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('oldest'))`)
			require.NoError(t, err)

			fetcher := h.db.Conn(t, "")
			_, err = fetcher.Exec(ctx, `SET statement_timeout = '300ms'`)
			require.NoError(t, err)
			_, err = fetcher.Exec(ctx, `SELECT * FROM duroxide.fetch_orchestration_item($1, $2, NULL, NULL)`, clock0, lockMs)
			requirePgError(t, err, "57014", "") // cancelled by statement_timeout while waiting
			require.Nil(t, h.instanceLock("second"), "the claimable second instance was not served")

			require.NoError(t, tx.Rollback(ctx))
			require.Equal(t, "oldest", h.fetchOrch(clock0).Instance)
		})
	})
}
