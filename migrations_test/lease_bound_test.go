package migrations_test

// The bounded lease rule (0034, 0035, 0036): a lease runs from the caller's
// clock carried forward, and the database clock may move its start later by
// at most the pack's lease bound (migrations.LeaseBound, the files'
// "-- Lease bound:" line). Tested on a throwaway server whose clock runs S
// ahead of its callers (libfaketime): a holder takes work with a fresh
// caller timestamp (this process's clock) and crashes (never acks); its
// lease must end at most bound + timeout after its claim, by the caller's
// clock, and a second dispatcher whose clock reads that much later must
// take the work over. At the pack version before the bound (the fixes up to
// 0033) the same lease runs S + timeout: the test counts both.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

const (
	// boundSlackMs covers what a call carries its clock forward by (the
	// time it spends inside the database) and a round trip: milliseconds
	// here, far below any of the spans compared.
	boundSlackMs int64 = 1_000
	// sessionMs is the session lock timeout the worker cases pass, longer
	// than the item's so that the two leases are told apart.
	sessionMs int64 = 8_000
	// renewAfterMs is how much later, by the caller's clock, a holder
	// renews what it fetched.
	renewAfterMs int64 = 1_000
)

// boundedVersions are the pack version before the first fix that bounds a
// lease (every lease unbounded) and the version of the last one (every
// lease bounded; the pack's later fixes, if any, leave leases alone).
func boundedVersions(t *testing.T) (unbounded, bounded int64) {
	t.Helper()
	for _, m := range migrations.Fixes() {
		if m.LeaseBoundMs == 0 {
			continue
		}
		if unbounded == 0 {
			unbounded = m.Version - 1
		}
		bounded = m.Version
	}
	if bounded == 0 {
		t.Fatal("no fix of the pack states a lease bound")
	}
	return unbounded, bounded
}

// leaseWrite is one lease a holder's call wrote: its end, the timeout (or
// extension) it was written with, the caller's clock the call was given,
// and this process's clock around the call (the database's is S ahead).
type leaseWrite struct {
	what           string
	end, timeoutMs int64
	from           int64
	before, after  int64
}

// leaseCase is one way a holder takes work and crashes with it.
type leaseCase struct {
	name string
	// at is the database a case runs on at pack version v, its work
	// queued (visible to the caller's clock since a minute ago).
	at func(t *testing.T, pool *testdb.Pool, v int64) *schemaDB
	// hold takes the work as a holder at caller clock now and returns the
	// leases it wrote; the last write's caller clock is what a takeover
	// counts from.
	hold func(h *schemaDB, now int64) []leaseWrite
	// takeover tries, as a second dispatcher at caller clock now, to take
	// the work: true when it got all of it.
	takeover func(h *schemaDB, now int64) bool
}

func nowMs() int64 { return time.Now().UnixMilli() }

// queued is a database at pack version v on pool, with an orchestrator
// message and a worker item without a session and one in session s1, each
// visible since a minute ago by this process's clock.
func queued(t *testing.T, pool *testdb.Pool, v int64) *schemaDB {
	t.Helper()
	db := pool.New(t, v)
	h := &schemaDB{t: t, db: db, pool: db.PgxPool(t), version: v}
	h.enqueueOrch("i1", startItem("i1", "o", "1.0.0", 1), nowMs()-60_000)
	queueWork(h)
	return h
}

// queueWork queues a worker item without a session and one in session s1.
func queueWork(h *schemaDB) {
	h.t.Helper()
	h.enqueueWork(`{"n":"plain"}`, nowMs()-60_000, nil, nil)
	h.enqueueWork(`{"n":"s1"}`, nowMs()-60_000, "s1", nil)
}

// withBatchedFetch is a database at pack version v with upstream's batched
// fetch (our port) given by upstream's runner before the fix of it that v
// has, then that fix, and the work of queued.
func withBatchedFetch(t *testing.T, pool *testdb.Pool, v int64) *schemaDB {
	t.Helper()
	fix, _, ok := migrations.FixFor("fetch_work_items", 22, v)
	require.True(t, ok, "a fix up to %d serves the batched fetch", v)
	db := pool.New(t, fix.Version-1)
	applyInFlight(t, db, upstream.InFlightBatchedFetch)
	_, err := db.Runner(t).UpTo(context.Background(), v)
	require.NoError(t, err)
	h := &schemaDB{t: t, db: db, pool: db.PgxPool(t), version: v}
	queueWork(h)
	return h
}

// orchLease is instance i1's lease end.
func orchLease(h *schemaDB) int64 {
	h.t.Helper()
	l := h.instanceLock("i1")
	require.NotNil(h.t, l)
	return l.LockedUntil
}

// itemLease is the lease end of the worker item holding token.
func itemLease(h *schemaDB, token string) int64 {
	h.t.Helper()
	var end int64
	h.scan(`SELECT locked_until FROM duroxide.worker_queue WHERE lock_token = $1`, []any{token}, &end)
	return end
}

func fetchOrchAt(h *schemaDB, now int64) (*orchItem, int64, int64) {
	h.t.Helper()
	before := nowMs()
	it := h.fetchOrch(now)
	return it, before, nowMs()
}

func leaseCases() []leaseCase {
	orchTakeover := func(h *schemaDB, now int64) bool {
		h.t.Helper()
		it := h.fetchOrch(now)
		return it != nil && it.Instance == "i1"
	}
	workerTakeover := func(h *schemaDB, now int64) bool {
		h.t.Helper()
		var got []string
		for range 2 {
			if it := h.fetchWork(now, lockMs, "w2", sessionMs, []string{}, "default_only"); it != nil {
				got = append(got, it.WorkItem)
			}
		}
		return len(got) == 2
	}
	return []leaseCase{
		{name: "fetch_orchestration_item", at: queued,
			hold: func(h *schemaDB, now int64) []leaseWrite {
				it, before, after := fetchOrchAt(h, now)
				require.NotNil(h.t, it)
				return []leaseWrite{{"instance lease", orchLease(h), lockMs, now, before, after}}
			},
			takeover: orchTakeover},
		{name: "fetch_work_item (item and session)", at: queued,
			hold: func(h *schemaDB, now int64) []leaseWrite {
				h.t.Helper()
				before := nowMs()
				it := h.fetchWork(now, lockMs, "w1", sessionMs, []string{}, "default_only")
				after := nowMs()
				require.NotNil(h.t, it)
				require.Equal(h.t, `{"n":"plain"}`, it.WorkItem, "the lowest id first")
				before2 := nowMs()
				it2 := h.fetchWork(now, lockMs, "w1", sessionMs, []string{}, "default_only")
				after2 := nowMs()
				require.NotNil(h.t, it2)
				require.Equal(h.t, `{"n":"s1"}`, it2.WorkItem)
				return []leaseWrite{
					{"item lease", itemLease(h, it.Token), lockMs, now, before, after},
					{"session item lease", itemLease(h, it2.Token), lockMs, now, before2, after2},
					{"session lease", h.session("s1").LockedUntil, sessionMs, now, before2, after2},
				}
			},
			takeover: workerTakeover},
		{name: "fetch_work_items (items and session)", at: withBatchedFetch,
			hold: func(h *schemaDB, now int64) []leaseWrite {
				h.t.Helper()
				before := nowMs()
				got := h.fetchItems(now, lockMs, "w1", sessionMs, []string{}, "default_only", 10, 1)
				after := nowMs()
				require.Len(h.t, got, 2)
				return []leaseWrite{
					{"item lease", itemLease(h, got[0].Token), lockMs, now, before, after},
					{"session item lease", itemLease(h, got[1].Token), lockMs, now, before, after},
					{"session lease", h.session("s1").LockedUntil, sessionMs, now, before, after},
				}
			},
			takeover: func(h *schemaDB, now int64) bool {
				h.t.Helper()
				return len(h.fetchItems(now, lockMs, "w2", sessionMs, []string{}, "default_only", 10, 1)) == 2
			}},
		{name: "renew_orchestration_item_lock", at: queued,
			hold: func(h *schemaDB, now int64) []leaseWrite {
				h.t.Helper()
				it, _, _ := fetchOrchAt(h, now)
				require.NotNil(h.t, it)
				before := nowMs()
				h.exec(`SELECT duroxide.renew_orchestration_item_lock($1, $2, $3)`, it.Token, now+renewAfterMs, lockMs/1000)
				after := nowMs()
				return []leaseWrite{{"renewed instance lease", orchLease(h), lockMs, now + renewAfterMs, before, after}}
			},
			takeover: orchTakeover},
		{name: "renew_work_item_lock and renew_session_lock", at: queued,
			hold: func(h *schemaDB, now int64) []leaseWrite {
				h.t.Helper()
				require.NotNil(h.t, h.fetchWork(now, lockMs, "w1", sessionMs, []string{}, "default_only"), "the plain item first")
				it := h.fetchWork(now, lockMs, "w1", sessionMs, []string{}, "default_only")
				require.NotNil(h.t, it)
				before := nowMs()
				h.exec(`SELECT duroxide.renew_work_item_lock($1, $2, $3)`, it.Token, now+renewAfterMs, lockMs/1000)
				var renewed int64
				h.scan(`SELECT duroxide.renew_session_lock(ARRAY['w1'], $1, $2, $3)`, []any{now + renewAfterMs, sessionMs, int64(600_000)}, &renewed)
				after := nowMs()
				require.Equal(h.t, int64(1), renewed)
				return []leaseWrite{
					{"renewed item lease", itemLease(h, it.Token), lockMs, now + renewAfterMs, before, after},
					{"renewed session lease", h.session("s1").LockedUntil, sessionMs, now + renewAfterMs, before, after},
				}
			},
			takeover: workerTakeover},
	}
}

// TestALeaseIsLengthenedByTheDatabaseClockAtMostByTheBound is the rule on a
// server whose clock runs S ahead of its callers, S well above the bound
// (120 s) and below it (10 s).
func TestALeaseIsLengthenedByTheDatabaseClockAtMostByTheBound(t *testing.T) {
	bound := migrations.LeaseBound().Milliseconds()
	require.Positive(t, bound)
	unbounded, latest := boundedVersions(t)
	for _, skew := range []time.Duration{120 * time.Second, 10 * time.Second} {
		t.Run(fmt.Sprintf("database clock %s ahead", skew), func(t *testing.T) {
			s := skew.Milliseconds()
			srv := pgtest.RequireSkewedServer(t, skew)
			pool := testdb.NewPool(srv, "duroxide")
			for _, c := range leaseCases() {
				t.Run(c.name, func(t *testing.T) {
					// The holder's lease ends, and the caller clock of the
					// last write, at each version.
					ends := map[int64][]leaseWrite{}
					for _, v := range []int64{latest, unbounded} {
						h := c.at(t, pool, v)
						now := nowMs()
						writes := c.hold(h, now)
						ends[v] = writes
						from, longest := writes[len(writes)-1].from, int64(0)
						for _, w := range writes {
							longest = max(longest, w.timeoutMs)
							dbLo, dbHi := w.before+s, w.after+s // the database clock during the call
							t.Logf("goose %d: %s ends %+d ms after its caller's clock (timeout %d ms)", v, w.what, w.end-w.from, w.timeoutMs)
							switch {
							case v == latest && s > bound:
								require.GreaterOrEqual(t, w.end, w.from+bound+w.timeoutMs, "%s: lengthened by the bound", w.what)
								require.LessOrEqual(t, w.end, w.from+bound+w.timeoutMs+boundSlackMs, "%s: by no more than the bound", w.what)
								require.Less(t, w.end, dbLo, "%s: over by the database clock at return: the trade beyond the bound", w.what)
							default: // below the bound, and every lease before it: the database clock's
								require.GreaterOrEqual(t, w.end, dbLo+w.timeoutMs, "%s: a full lease by the database clock", w.what)
								require.LessOrEqual(t, w.end, dbHi+w.timeoutMs+boundSlackMs, "%s", w.what)
							}
						}

						// A second dispatcher, its clock bound + timeout past the
						// last write (and a slack): at the latest it takes the
						// work over whatever S; before the bound only when S is
						// below it, and otherwise at S + timeout.
						bounded := from + bound + longest + boundSlackMs
						took := c.takeover(h, bounded)
						if v == latest || s <= bound {
							require.True(t, took, "goose %d: taken over %d ms after the last write", v, bounded-from)
							t.Logf("goose %d: taken over at the caller's clock + %d ms", v, bounded-from)
							continue
						}
						require.False(t, took, "goose %d: still held %d ms after the last write", v, bounded-from)
						unboundedAt := from + s + longest + boundSlackMs
						require.True(t, c.takeover(h, unboundedAt), "goose %d: taken over at S + timeout", v)
						t.Logf("goose %d: not taken over at + %d ms; taken over at the caller's clock + %d ms", v, bounded-from, unboundedAt-from)
					}
					if s > bound {
						for i, w := range ends[latest] {
							was := ends[unbounded][i]
							t.Logf("%s: %d ms after the caller's clock at goose %d, %d ms at goose %d: %d ms shorter",
								w.what, was.end-was.from, unbounded, w.end-w.from, latest, (was.end-was.from)-(w.end-w.from))
							require.Greater(t, (was.end-was.from)-(w.end-w.from), s-bound-renewAfterMs-boundSlackMs,
								"%s: the bound takes S - bound off the lease", w.what)
						}
					}
				})
			}
		})
	}
}

// The bound's fixes go down to the unbounded fixes they replaced, each
// over its own body only: a definition duroxide-pg's runner installed
// after them (upstream's candidate fix, say) is left as it is, and one
// nobody knows is refused, nothing changed.
func TestTheBoundsDownsRestoreTheUnboundedFixesAndLeaveTheRest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	unbounded, latest := boundedVersions(t)

	t.Run("over their own bodies: the unbounded fixes; over the candidate: left", func(t *testing.T) {
		t.Parallel()
		db := dbs.New(t, latest)
		applyInFlight(t, db, upstream.InFlightCandidate)
		candidate := definitionOf(t, db, "fetch_orchestration_item")
		_, err := db.Runner(t).DownTo(ctx, unbounded)
		require.NoError(t, err)
		require.Equal(t, candidate, definitionOf(t, db, "fetch_orchestration_item"), "the candidate is left as it is")
		for _, fn := range []string{"fetch_work_item", "renew_work_item_lock", "renew_session_lock", "renew_orchestration_item_lock"} {
			_, body, ok := migrations.FixFor(fn, 19, unbounded)
			require.True(t, ok)
			require.True(t, definitionOf(t, db, fn).Matches(body.Fingerprint()), "%s: the fix in force at %d", fn, unbounded)
		}
	})

	t.Run("over a definition nobody knows: refused, nothing changed", func(t *testing.T) {
		t.Parallel()
		db := dbs.New(t, latest)
		editByHand(t, db, "renew_session_lock")
		h := &schemaDB{t: t, db: db, pool: db.PgxPool(t)}
		bodies := `SELECT p.proname::text || md5(p.prosrc) FROM pg_proc p WHERE p.pronamespace = $1::regnamespace ORDER BY 1`
		before := h.texts(bodies, db.Schema)
		r := db.Runner(t)
		_, err := r.DownTo(ctx, latest-1)
		requireErrorNaming(t, err, "55000", "renew_session_lock")
		v, err := r.Version(ctx)
		require.NoError(t, err)
		require.Equal(t, latest, v)
		require.Equal(t, before, h.texts(bodies, db.Schema))
	})
}
