package migrations_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/harness/ops/catalog"
	"github.com/duroxide-pg/migrations/internal/packfacts"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/sim/repro"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// unfixed and fixVersion are the pack's fix of fetch_orchestration_item and
// the version just before it, read from sql/ (the pack under test has the
// fix: packfacts' tests say so).
var unfixed, fixVersion = func() (int64, int64) {
	bug, fix, err := packfacts.FetchFix()
	if err != nil {
		panic(err)
	}
	return bug, fix
}()

const (
	leaseTimeout  = 5000 // ms, the runtime's default orchestrator lock timeout
	leaseSlackMs  = 100  // allowed for returning the row to the caller
	contendedWait = 2 * leaseTimeout * time.Millisecond
)

// branches runs a claim on both branches of fetch_orchestration_item: no
// version filter, and the filter the runtime always passes.
var branches = []struct {
	name   string
	filter *orch.VersionRange
}{
	{"without version filter", nil},
	{"with the runtime's version filter", orch.RuntimeFilter()},
}

type fixBundle struct {
	db   *testdb.Database
	pool *pgxpool.Pool
	c    orch.Client
}

func setupFix(t *testing.T, version int64) *fixBundle {
	t.Helper()
	db := dbs.New(t, version)
	return &fixBundle{db: db, pool: db.PgxPool(t), c: orch.New(db.Schema)}
}

func (b *fixBundle) dbNow(t *testing.T) int64 {
	t.Helper()
	ms, err := orch.DBNowMs(context.Background(), b.pool)
	require.NoError(t, err)
	return ms
}

// enqueue adds a visible StartOrchestration for instance, visible since a
// minute before the database clock (and before offset, when offset < 0).
func (b *fixBundle) enqueue(t *testing.T, instance string) {
	t.Helper()
	visible := time.UnixMilli(b.dbNow(t) - 120_000)
	require.NoError(t, b.c.Enqueue(context.Background(), b.pool, instance,
		orch.StartWorkItem(instance, "Demo", "1.0.0", 1), visible))
}

// fetchAt fetches with the given caller clock and returns the item, the
// caller's clock (same offset) when the row arrived, and the stored lease.
func (b *fixBundle) fetchAt(t *testing.T, q orch.Querier, nowMs, offsetMs int64, filter *orch.VersionRange) (*orch.Item, int64, orch.Lease) {
	t.Helper()
	ctx := context.Background()
	item, err := b.c.Fetch(ctx, q, nowMs, leaseTimeout, filter)
	arrival := time.Now().UnixMilli() + offsetMs
	require.NoError(t, err)
	if item == nil {
		return nil, arrival, orch.Lease{}
	}
	lease, err := b.c.ReadLease(ctx, b.pool, item.LockToken)
	require.NoError(t, err)
	return item, arrival, lease
}

func requireFullLease(t *testing.T, remainingMs int64, what string) {
	t.Helper()
	require.GreaterOrEqual(t, remainingMs, int64(leaseTimeout-leaseSlackMs),
		"%s: the lease must have at least %d ms left when it reaches the caller, has %d", what, leaseTimeout-leaseSlackMs, remainingMs)
}

func TestV20LeaseIsValidWhenReturned(t *testing.T) {
	t.Parallel()
	for _, br := range branches {
		t.Run(br.name, func(t *testing.T) {
			t.Parallel()

			t.Run("uncontended call with a fresh clock leaves at least 4900 of 5000 ms", func(t *testing.T) {
				t.Parallel()
				b := setupFix(t, fixVersion)
				b.enqueue(t, "fresh")
				item, arrival, lease := b.fetchAt(t, b.pool, time.Now().UnixMilli(), 0, br.filter)
				require.NotNil(t, item)
				requireFullLease(t, lease.LockedUntilMs-arrival, "fresh clock")
			})

			t.Run("p_now_ms 10 s stale still gets a full lease by the database clock, and the ack succeeds", func(t *testing.T) {
				t.Parallel()
				b := setupFix(t, fixVersion)
				res, err := repro.Minimal(context.Background(), b.pool, b.db.Schema, fixVersion,
					repro.MinimalConfig{StaleMs: 10_000, LockTimeoutMs: leaseTimeout, Filter: br.filter})
				require.NoError(t, err)
				require.True(t, res.Fetched)
				requireFullLease(t, res.RemainingMs, "10 s stale p_now_ms")
				require.True(t, res.AckOK, "ack: %s", res.AckError)
			})

			t.Run("a caller clock 60 s ahead of the database gets a full lease by its own clock, and its ack succeeds", func(t *testing.T) {
				t.Parallel()
				const skew = 60_000
				b := setupFix(t, fixVersion)
				b.enqueue(t, "ahead")
				item, arrival, lease := b.fetchAt(t, b.pool, b.dbNow(t)+skew, skew, br.filter)
				require.NotNil(t, item)
				requireFullLease(t, lease.LockedUntilMs-arrival, "caller 60 s ahead")
				require.NoError(t, b.c.AckItem(context.Background(), b.pool, item.LockToken, time.Now().UnixMilli()+skew, orch.Ack{}))
			})

			t.Run("a large history does not eat into the lease", func(t *testing.T) {
				t.Parallel()
				b := setupFix(t, fixVersion)
				seedHistory(t, b, "big", 10_000, 1_000)
				b.enqueue(t, "big")
				// Select only the token, not the history, so that sending the
				// history to the client does not blur the measurement.
				var token string
				var minMs, maxMs any
				if br.filter != nil {
					minMs, maxMs = br.filter.Min, br.filter.Max
				}
				start := time.Now()
				require.NoError(t, b.pool.QueryRow(context.Background(),
					"SELECT out_lock_token FROM "+b.db.Qualify("fetch_orchestration_item")+"($1, $2, $3, $4)",
					start.UnixMilli(), leaseTimeout, minMs, maxMs).Scan(&token))
				took := time.Since(start)
				arrival := time.Now().UnixMilli()
				lease, err := b.c.ReadLease(context.Background(), b.pool, token)
				require.NoError(t, err)
				require.Greater(t, took, leaseSlackMs*time.Millisecond,
					"loading the history must take a noticeable share of the timeout for this test to mean anything")
				// Loading the history dominates the call; copying the result
				// out of the function after the lease is computed is a small
				// part of it. At 19 the lease starts when the call starts.
				leaseStart := lease.LockedUntilMs - leaseTimeout
				require.GreaterOrEqual(t, leaseStart, start.UnixMilli()+took.Milliseconds()/2,
					"the lease must start after the history was loaded, not when the call started (call took %v)", took)
				require.GreaterOrEqual(t, lease.LockedUntilMs-arrival, leaseTimeout-took.Milliseconds()/2,
					"at arrival the lease must have the timeout left, less at most the time spent returning the row")
			})
		})
	}
}

// seedHistory gives instance an instances row, a running execution and
// events of about size bytes each.
func seedHistory(t *testing.T, b *fixBundle, instance string, events, size int) {
	t.Helper()
	ctx := context.Background()
	for _, stmt := range []string{
		`INSERT INTO %[1]s.instances (instance_id, orchestration_name, orchestration_version, current_execution_id, created_at, updated_at)
		 VALUES ($1, 'Demo', '1.0.0', 1, now(), now())`,
		`INSERT INTO %[1]s.executions (instance_id, execution_id, status, started_at) VALUES ($1, 1, 'Running', now())`,
	} {
		_, err := b.pool.Exec(ctx, fmt.Sprintf(stmt, pgx.Identifier{b.db.Schema}.Sanitize()), instance)
		require.NoError(t, err)
	}
	_, err := b.pool.Exec(ctx, fmt.Sprintf(`
		INSERT INTO %[1]s.history (instance_id, execution_id, event_id, event_type, event_data, created_at)
		SELECT $1, 1, g, 'ActivityCompleted',
		       json_build_object('event_id', g, 'kind', json_build_object('type', 'ActivityCompleted', 'result', repeat('x', $3)))::text,
		       now()
		FROM generate_series(1, $2::int) g`, pgx.Identifier{b.db.Schema}.Sanitize()), instance, events, size)
	require.NoError(t, err)
}

// holdAdvisoryLock holds instance's advisory key in another session until
// the returned release is called (or contendedWait passes).
func holdAdvisoryLock(t *testing.T, b *fixBundle, instance string) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn := b.db.Conn(t, "")
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", instance)
	require.NoError(t, err)
	timer := time.AfterFunc(contendedWait, func() { _ = tx.Rollback(context.Background()) })
	return func() { timer.Stop(); _ = tx.Rollback(ctx) }
}

// holdRowLocks holds FOR UPDATE row locks on instance's queue rows.
func holdRowLocks(t *testing.T, b *fixBundle, instance string) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn := b.db.Conn(t, "")
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+b.db.Qualify("orchestrator_queue")+" WHERE instance_id = $1 FOR UPDATE", instance)
	require.NoError(t, err)
	timer := time.AfterFunc(contendedWait, func() { _ = tx.Rollback(context.Background()) })
	return func() { timer.Stop(); _ = tx.Rollback(ctx) }
}

func TestV20NeverWaitsOnAContendedCandidate(t *testing.T) {
	t.Parallel()
	holders := map[string]func(*testing.T, *fixBundle, string) func(){
		"advisory lock": holdAdvisoryLock,
		"row locks":     holdRowLocks,
	}
	for _, br := range branches {
		for holdName, hold := range holders {
			t.Run(br.name+"/another session holds the oldest candidate's "+holdName, func(t *testing.T) {
				t.Parallel()
				b := setupFix(t, fixVersion)
				b.enqueue(t, "oldest")
				b.enqueue(t, "next")
				release := hold(t, b, "oldest")
				defer release()

				start := time.Now()
				item, arrival, lease := b.fetchAt(t, b.pool, time.Now().UnixMilli(), 0, br.filter)
				took := time.Since(start)
				require.NotNil(t, item, "the next claimable instance must be returned")
				require.Equal(t, "next", item.InstanceID)
				require.Less(t, took, time.Second, "fetch must not wait for the holder (it holds for %v)", contendedWait)
				requireFullLease(t, lease.LockedUntilMs-arrival, "next candidate")
			})

			t.Run(br.name+"/with every candidate contended by "+holdName+" the call returns no row at once", func(t *testing.T) {
				t.Parallel()
				b := setupFix(t, fixVersion)
				b.enqueue(t, "only")
				release := hold(t, b, "only")
				defer release()

				start := time.Now()
				item, _, _ := b.fetchAt(t, b.pool, time.Now().UnixMilli(), 0, br.filter)
				require.Nil(t, item)
				require.Less(t, time.Since(start), time.Second)
			})
		}
	}
}

func TestV20TriesAtMost32CandidatesPerCall(t *testing.T) {
	t.Parallel()
	const bound = 32
	for _, contended := range []int{bound - 1, bound} {
		t.Run(fmt.Sprintf("%d contended candidates ahead of a free one", contended), func(t *testing.T) {
			t.Parallel()
			b := setupFix(t, fixVersion)
			ctx := context.Background()
			holder := b.db.Conn(t, "")
			tx, err := holder.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			for i := range contended {
				inst := fmt.Sprintf("contended-%02d", i)
				b.enqueue(t, inst)
				_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", inst)
				require.NoError(t, err)
			}
			b.enqueue(t, "free")
			item, _, _ := b.fetchAt(t, b.pool, time.Now().UnixMilli(), 0, orch.RuntimeFilter())
			if contended < bound {
				require.NotNil(t, item, "within the bound the free instance is found")
				require.Equal(t, "free", item.InstanceID)
			} else {
				require.Nil(t, item, "past the bound the call gives up and returns no row")
			}
		})
	}
}

// Many dispatchers fetching and acking the same few instances: for each
// instance, the spans from a fetch's return to the sending of its
// successful ack never overlap, so no two leases held at once both led to
// an ack.
func TestV20ConcurrentDispatchersNeverShareAnInstance(t *testing.T) {
	t.Parallel()
	b := setupFix(t, fixVersion)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	instances := []string{"a", "b", "c"}
	for _, inst := range instances {
		for range 3 {
			b.enqueue(t, inst)
		}
	}
	type span struct {
		instance   string
		start, end time.Time
	}
	var mu sync.Mutex
	var spans []span
	var wg sync.WaitGroup
	for d := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn := b.db.Conn(t, "")
			for ctx.Err() == nil {
				item, err := b.c.Fetch(ctx, conn, time.Now().UnixMilli(), 200, orch.RuntimeFilter())
				got := time.Now()
				if err != nil || item == nil {
					continue
				}
				next, _ := json.Marshal([]json.RawMessage{json.RawMessage(orch.ExternalEventWorkItem(item.InstanceID, "tick", fmt.Sprint(d)))})
				// The span ends when the ack is sent: its commit, which frees
				// the instance, happens before the client hears back.
				done := time.Now()
				err = b.c.AckItem(ctx, conn, item.LockToken, time.Now().UnixMilli(), orch.Ack{OrchestratorItems: next})
				if err == nil {
					mu.Lock()
					spans = append(spans, span{item.InstanceID, got, done})
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	require.NotEmpty(t, spans)
	for i, a := range spans {
		for _, c := range spans[i+1:] {
			if a.instance == c.instance {
				overlap := a.start.Before(c.end) && c.start.Before(a.end)
				require.False(t, overlap, "two acked leases of %s overlap: [%v, %v] and [%v, %v]",
					a.instance, a.start, a.end, c.start, c.end)
			}
		}
	}
	t.Logf("%d acked turns over %d instances", len(spans), len(instances))
}

// With nothing contending, 0020 returns what 0019 returns and leaves the
// same state behind; only the token and the lease times differ.
func TestV20UncontendedFetchMatchesV19(t *testing.T) {
	t.Parallel()
	type scenario struct {
		name  string
		setup func(t *testing.T, b *fixBundle)
	}
	scenarios := []scenario{
		{"instance with history, kv and several messages", func(t *testing.T, b *fixBundle) {
			seedHistory(t, b, "full", 5, 20)
			_, err := b.pool.Exec(context.Background(), "INSERT INTO "+b.db.Qualify("kv_store")+
				" (instance_id, key, value, execution_id, last_updated_at_ms) VALUES ('full', 'k', 'v', 1, 42)")
			require.NoError(t, err)
			b.enqueue(t, "full")
			b.enqueue(t, "full")
		}},
		{"no instances row: StartOrchestration names it", func(t *testing.T, b *fixBundle) { b.enqueue(t, "new") }},
		{"no instances row, no start: Unknown", func(t *testing.T, b *fixBundle) {
			require.NoError(t, b.c.Enqueue(context.Background(), b.pool, "orphan",
				orch.ExternalEventWorkItem("orphan", "e", "x"), time.UnixMilli(b.dbNow(t)-60_000)))
		}},
		{"message not yet visible", func(t *testing.T, b *fixBundle) {
			require.NoError(t, b.c.Enqueue(context.Background(), b.pool, "later",
				orch.StartWorkItem("later", "Demo", "1.0.0", 1), time.UnixMilli(b.dbNow(t)+600_000)))
		}},
		{"instance pinned outside the filter", func(t *testing.T, b *fixBundle) {
			seedHistory(t, b, "pinned", 1, 10)
			_, err := b.pool.Exec(context.Background(), "UPDATE "+b.db.Qualify("executions")+
				" SET duroxide_version_major = 9, duroxide_version_minor = 0, duroxide_version_patch = 0 WHERE instance_id = 'pinned'")
			require.NoError(t, err)
			b.enqueue(t, "pinned")
		}},
	}
	filters := []struct {
		name   string
		filter *orch.VersionRange
	}{
		{"no filter", nil},
		{"runtime filter", orch.RuntimeFilter()},
		{"min only", &orch.VersionRange{Min: 0, Max: -1}},
		{"min above max", &orch.VersionRange{Min: 2000, Max: 1000}},
	}
	for _, sc := range scenarios {
		for _, f := range filters {
			t.Run(sc.name+"/"+f.name, func(t *testing.T) {
				t.Parallel()
				var results [2]string
				for i, v := range []int64{unfixed, fixVersion} {
					b := setupFix(t, v)
					sc.setup(t, b)
					filter := f.filter
					var item *orch.Item
					var err error
					if filter != nil && filter.Max == -1 {
						item, err = fetchMinOnly(b, filter.Min)
					} else {
						item, err = b.c.Fetch(context.Background(), b.pool, time.Now().UnixMilli(), leaseTimeout, filter)
					}
					require.NoError(t, err)
					results[i] = describeFetch(t, b, item)
				}
				require.Equal(t, results[0], results[1], "0019 vs 0020")
			})
		}
	}
}

func fetchMinOnly(b *fixBundle, min int64) (*orch.Item, error) {
	var it orch.Item
	err := b.pool.QueryRow(context.Background(), "SELECT out_instance_id, out_orchestration_name, out_orchestration_version, out_execution_id, "+
		"out_history, out_messages, out_lock_token, out_attempt_count, out_kv_snapshot FROM "+
		b.db.Qualify("fetch_orchestration_item")+"($1, $2, $3, NULL)", time.Now().UnixMilli(), leaseTimeout, min).
		Scan(&it.InstanceID, &it.Name, &it.Version, &it.ExecutionID, &it.History, &it.Messages, &it.LockToken, &it.AttemptCount, &it.KVSnapshot)
	if err == pgx.ErrNoRows {
		return nil, nil
	}
	return &it, err
}

// describeFetch renders a fetch result and the queue/lock state it left,
// with the token replaced by a placeholder and lease times and the clock
// at return left out.
func describeFetch(t *testing.T, b *fixBundle, item *orch.Item) string {
	t.Helper()
	if item == nil {
		return "no row"
	}
	token := item.LockToken
	item.LockToken = "<token>"
	item.DBReturnMs = 0
	var state string
	err := b.pool.QueryRow(context.Background(), fmt.Sprintf(`
		SELECT coalesce(string_agg(format('%%s:%%s:%%s', instance_id, lock_token = $1, attempt_count), ',' ORDER BY id), '')
		       || ' locks:' || (SELECT coalesce(string_agg(format('%%s:%%s', instance_id, lock_token = $1), ','), '') FROM %s)
		FROM %s`, b.db.Qualify("instance_locks"), b.db.Qualify("orchestrator_queue")), token).Scan(&state)
	require.NoError(t, err)
	out, err := json.Marshal(item)
	require.NoError(t, err)
	return string(out) + " " + state
}

func TestV20RejectsBadInputWithoutChangingAnything(t *testing.T) {
	t.Parallel()
	b := setupFix(t, fixVersion)
	b.enqueue(t, "x")
	now := time.Now().UnixMilli()
	cases := []struct {
		name    string
		now     any
		timeout any
		param   string
	}{
		{"NULL p_now_ms", nil, int64(leaseTimeout), "p_now_ms"},
		{"negative p_now_ms", int64(-1), int64(leaseTimeout), "p_now_ms"},
		{"NULL p_lock_timeout_ms", now, nil, "p_lock_timeout_ms"},
		{"zero p_lock_timeout_ms", now, int64(0), "p_lock_timeout_ms"},
		{"negative p_lock_timeout_ms", now, int64(-5000), "p_lock_timeout_ms"},
		{"absurd p_lock_timeout_ms", now, int64(1) << 60, "p_lock_timeout_ms"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.pool.Exec(context.Background(), "SELECT * FROM "+b.db.Qualify("fetch_orchestration_item")+"($1, $2, 0, 1029)", tc.now, tc.timeout)
			require.Error(t, err)
			require.Equal(t, "22023", orch.SQLState(err))
			require.Contains(t, err.Error(), tc.param)
		})
	}
	var locks, claimed int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT (SELECT count(*) FROM "+b.db.Qualify("instance_locks")+
		")::int, (SELECT count(*) FROM "+b.db.Qualify("orchestrator_queue")+" WHERE lock_token IS NOT NULL OR attempt_count > 0)::int").Scan(&locks, &claimed))
	require.Zero(t, locks, "no lease was taken")
	require.Zero(t, claimed, "no message was claimed")
}

func TestV20KeepsTheCatalogOfV19AndLeavesUpstreamBookkeepingAlone(t *testing.T) {
	t.Parallel()
	b := setupFix(t, fixVersion)
	r := b.db.Runner(t)
	requireSameCatalog(t, upstreamCatalog(t, unfixed), takeCatalog(t, r), "at 0020 (same signature as 0019)")
	var maxVersion int64
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT max(version) FROM "+b.db.Qualify("_duroxide_migrations")).Scan(&maxVersion))
	require.Equal(t, packfacts.UpstreamAt(unfixed), maxVersion, "0020 must not claim upstream's version 20")
}

func TestV20DownRestoresV19AndTheBugReturns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	at19 := setupFix(t, unfixed)
	want, err := catalog.Bodies(ctx, at19.db.Runner(t).DB(), at19.db.Schema)
	require.NoError(t, err)

	b := setupFix(t, fixVersion)
	r := b.db.Runner(t)
	fixed, err := catalog.Bodies(ctx, r.DB(), r.Schema())
	require.NoError(t, err)
	require.NotEqual(t, want, fixed, "0020 must change fetch_orchestration_item")
	_, err = r.DownTo(ctx, unfixed)
	require.NoError(t, err)
	got, err := catalog.Bodies(ctx, r.DB(), r.Schema())
	require.NoError(t, err)
	require.Equal(t, want, got, "after down to 19 every function body is 0019's")

	for _, br := range branches {
		res, err := repro.Minimal(ctx, b.pool, b.db.Schema, unfixed, repro.MinimalConfig{Filter: br.filter})
		require.NoError(t, err)
		require.True(t, res.Bug(), "%s: at 19 again, a 10 s stale p_now_ms must give a dead lease and a refused ack: %+v", br.name, res)
		require.InDelta(t, -5000, res.RemainingMs, 1000)
	}
}

// What 19 does with the inputs 20 rejects (documented in CHANGELOG): no row
// for a NULL clock, a NOT NULL violation for a NULL timeout, a lease that is
// already over for a zero or negative timeout, and one that never ends for
// an absurd one.
func TestV19OnTheInputsV20Rejects(t *testing.T) {
	t.Parallel()
	// callerNow stands for the caller's clock, read in each subtest right
	// before its call (a time read once before parallel subtests wait for
	// their turn could be older than the message the subtest enqueues).
	const callerNow = "caller's now"
	cases := []struct {
		name      string
		now       any
		timeout   any
		wantState string // SQLSTATE, or "" for no error
		wantRow   bool
		// check looks at the lease 19 handed out, when it did.
		check func(t *testing.T, lockedUntil, now int64)
	}{
		{"NULL p_now_ms: no row", nil, int64(leaseTimeout), "", false, nil},
		{"negative p_now_ms: no row (nothing is visible at 1969)", int64(-1), int64(leaseTimeout), "", false, nil},
		{"NULL p_lock_timeout_ms: NOT NULL violation", callerNow, nil, "23502", false, nil},
		{"zero p_lock_timeout_ms: a lease already over", callerNow, int64(0), "", true,
			func(t *testing.T, until, now int64) { require.LessOrEqual(t, until, now) }},
		{"negative p_lock_timeout_ms: a lease already over", callerNow, int64(-5000), "", true,
			func(t *testing.T, until, now int64) { require.Less(t, until, now) }},
		{"absurd p_lock_timeout_ms: a lease that never ends", callerNow, int64(1) << 60, "", true,
			func(t *testing.T, until, now int64) { require.Greater(t, until, now+(int64(1)<<59)) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupFix(t, unfixed)
			b.enqueue(t, "x")
			now := time.Now().UnixMilli()
			arg := tc.now
			if arg == callerNow {
				arg = now
			}
			var token *string
			err := b.pool.QueryRow(context.Background(), "SELECT out_lock_token FROM "+b.db.Qualify("fetch_orchestration_item")+"($1, $2, 0, 1029)",
				arg, tc.timeout).Scan(&token)
			if tc.wantState != "" {
				require.Equal(t, tc.wantState, orch.SQLState(err))
				return
			}
			if !tc.wantRow {
				require.ErrorIs(t, err, pgx.ErrNoRows)
				return
			}
			require.NoError(t, err)
			lease, err := b.c.ReadLease(context.Background(), b.pool, *token)
			require.NoError(t, err)
			tc.check(t, lease.LockedUntilMs, now)
		})
	}
}
