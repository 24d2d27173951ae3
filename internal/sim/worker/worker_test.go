package worker_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/duroxide-pg/migrations/internal/packfacts"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/simconfig"
	"github.com/duroxide-pg/migrations/internal/sim/worker"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// One throwaway server for the package's tests, started on first use and
// stopped in TestMain.
var (
	srvOnce sync.Once
	srv     *pgtest.Server
	srvErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if srv != nil {
		_ = srv.Close(context.Background())
	}
	os.Exit(code)
}

// database creates a database on the package's server with one schema per
// version, named s<version>, and returns its DSN.
func database(t *testing.T, versions ...int64) *dbconn.Source {
	t.Helper()
	srvOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		srv, srvErr = pgtest.Start(ctx, pgtest.OptionsFromEnv())
	})
	if errors.Is(srvErr, pgtest.ErrUnavailable) {
		t.Skipf("no PostgreSQL server available: %v", srvErr)
	}
	require.NoError(t, srvErr, "start PostgreSQL")
	ctx := context.Background()
	db, err := srv.CreateDatabase(ctx, "worker_", "")
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.DropDatabase(context.Background(), db) })
	src := testdb.MustSource(t, srv.DSN(db))
	for _, v := range versions {
		require.NoError(t, migrate.To(ctx, src.Config(), schemaOf(v), v))
	}
	return src
}

func schemaOf(v int64) string { return "s" + itoa(v) }

func itoa(v int64) string {
	if v < 10 {
		return string(rune('0' + v))
	}
	return itoa(v/10) + string(rune('0'+v%10))
}

func TestSixteenWorkersAtTheFixCompleteEveryItemExactlyOnce(t *testing.T) {
	_, fix, verr := packfacts.WorkerFix()
	require.NoError(t, verr)
	src := database(t, fix)
	cfg := worker.Config{
		Common:   simconfig.Common{Schema: schemaOf(fix), LockTimeout: 5 * time.Second, Duration: time.Minute},
		Runtimes: 4, Slots: 4, Items: 300, Sessions: 6, Tagged: true,
		StopWhenDone: true, ShortActivity: 5 * time.Millisecond,
		SkewBehind: 2 * time.Second, SkewAhead: 500 * time.Millisecond, WatchLocks: true}
	seed, err := worker.Seed(context.Background(), src, cfg)
	require.NoError(t, err)
	require.Len(t, seed.Items, 300)

	log, err := worker.Run(context.Background(), src, cfg)
	require.NoError(t, err)
	events := log.Events()
	s := worker.Summarize(events, log.Elapsed())
	t.Logf("%+v", s)

	pending, err := worker.PendingItems(context.Background(), src, cfg.Schema)
	require.NoError(t, err)
	require.Empty(t, pending, "every item was completed before the run ended")
	require.NoError(t, worker.Conservation(seed.Items, events, pending), "each item completed exactly once")
	require.Equal(t, 300, s.Completed)
	require.Zero(t, s.DeliveredTwice, "no item was handed to two workers")
	require.Zero(t, s.RefusedAcks)
	require.Zero(t, s.DeadAtReturn)
	// That the fetch never waits on a session row is proved without
	// sampling by migrations_test (TestWorkerFetchNeverWaitsOnASessionRow).
	// Nor on an item row: 0025's candidate SELECT ... FOR UPDATE SKIP LOCKED
	// waited 4-64 ms on another fetch in 7 of 200 runs on PostgreSQL 15 and
	// 10 of 200 on 16 (scripts/worker-lock-waits.sh, log_lock_waits,
	// 2026-12-02), PostgreSQL following the row's update chain without SKIP
	// LOCKED; 0028 claims the item before it locks the row, and the same
	// runs showed no wait. The 5 ms sampler catches such a wait.
	require.Zero(t, s.BlockedFetches, "sampled: %d fetch(es) seen waiting on a row lock, longest %d ms (scripts/worker-lock-waits.sh shows on what)", s.BlockedFetches, s.MaxBlockedMs)
	require.Zero(t, s.OtherErrors, s.FirstError)
	require.Equal(t, s.Fetches, s.Completed, "one lease per item")
	require.Positive(t, s.SessionFetches)
}

func TestConservationNamesWhatWentWrong(t *testing.T) {
	ack := func(item string) worker.Event {
		return worker.Event{Kind: worker.KindAck, Item: item, Outcome: worker.OutcomeOK}
	}
	require.NoError(t, worker.Conservation([]string{"a", "b"}, []worker.Event{ack("a")}, []string{"b"}))
	err := worker.Conservation([]string{"a", "b"}, []worker.Event{ack("a"), ack("a")}, nil)
	require.ErrorContains(t, err, "a consumed 2 times")
	require.ErrorContains(t, err, "b consumed 0 times, pending 0 times")
	refill := worker.Event{Kind: worker.KindEnqueue, Item: "c", Outcome: worker.OutcomeOK}
	require.NoError(t, worker.Conservation([]string{"a"}, []worker.Event{ack("a"), refill}, []string{"c"}))
}

func TestItemMixAndFilters(t *testing.T) {
	cfg := worker.Config{Sessions: 3, Tagged: true}
	kinds := map[string]int{}
	for k := int64(1); k <= 40; k++ {
		it := cfg.ItemAt(k)
		switch {
		case it.SessionID != "" && it.Tag != "":
			t.Fatalf("item %d is session-bound and tagged", k)
		case it.SessionID != "":
			kinds["session"]++
		case it.Tag != "":
			kinds[it.Tag]++
		default:
			kinds["plain"]++
		}
		back, err := worker.ParseItem(it.WorkItem())
		require.NoError(t, err)
		require.Equal(t, it, back)
	}
	require.Equal(t, map[string]int{"session": 20, "plain": 10, "gpu": 5, "io": 5}, kinds)
	modes := map[string]bool{}
	for g := 0; g < 4; g++ {
		modes[cfg.FilterFor(g).Mode] = true
	}
	require.Len(t, modes, 4, "the slots' filters cover every mode but none")
	skew := worker.Config{SkewBehind: 3 * time.Second, SkewAhead: 600 * time.Millisecond}
	require.Equal(t, -3*time.Second, skew.SkewFor(0, 4))
	require.Equal(t, 600*time.Millisecond, skew.SkewFor(3, 4))
}
