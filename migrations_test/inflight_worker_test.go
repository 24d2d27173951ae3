package migrations_test

// Upstream's two worker-side migrations in flight (branch files, no
// release; our ports of them, internal/testenv/upstream/inflight), applied
// the way upstream's runner applies a file: what each does to a database
// the real provider made, and what the pack's worker fixes do with the
// branch fix of fetch_work_item's generic plan (0025 and 0028 leave it,
// 0031 installs its fix over it, 0031's Down refuses while the branch file
// is recorded).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/baseline"
	"github.com/duroxide-pg/migrations/harness/ops/fingerprint"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/planshape"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// inFlightEntry is the pack's record (upstream/unreleased.json) of the
// in-flight migration file, found by its file name: versions collide.
func inFlightEntry(t *testing.T, file string) fingerprint.Unreleased {
	t.Helper()
	for _, u := range fingerprint.UnreleasedMigrations() {
		if u.File == file {
			return u
		}
	}
	t.Fatalf("upstream/unreleased.json has no entry for %s", file)
	return fingerprint.Unreleased{}
}

// applyInFlight gives db our port of the in-flight file, as upstream's
// runner applies a file (its row recorded).
func applyInFlight(t *testing.T, db *testdb.Database, file string) {
	t.Helper()
	require.NoError(t, upstream.ApplyInFlight(context.Background(), db.Source, db.Schema, file), "apply %s", file)
}

// providerThen is a database the real provider made, then given the
// in-flight files, in order, by upstream's runner.
func providerThen(t *testing.T, files ...string) *schemaDB {
	t.Helper()
	db := dbs.RealProvider(t)
	for _, f := range files {
		applyInFlight(t, db, f)
	}
	return &schemaDB{t: t, db: db, pool: db.PgxPool(t)}
}

// definitionOf is the one definition of function name in db's schema.
func definitionOf(t *testing.T, db *testdb.Database, name string) fingerprint.Function {
	t.Helper()
	conn := sqlDB(t, db)
	funcs, err := fingerprint.Take(context.Background(), conn, db.Schema)
	require.NoError(t, err)
	var found []fingerprint.Function
	for _, f := range funcs {
		if f.Name == name {
			found = append(found, f)
		}
	}
	require.Len(t, found, 1, "schema %s has one %s", db.Schema, name)
	return found[0]
}

// hasFunction reports whether db's schema has a function called name.
func hasFunction(t *testing.T, db *testdb.Database, name string) bool {
	t.Helper()
	var n int
	require.NoError(t, sqlDB(t, db).QueryRow(`SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND p.proname = $2`, db.Schema, name).Scan(&n))
	return n > 0
}

// recordedName is the file name _duroxide_migrations records for version v
// ("" for none).
func recordedName(t *testing.T, db *testdb.Database, v int64) string {
	t.Helper()
	var name string
	err := sqlDB(t, db).QueryRow("SELECT name FROM "+db.Qualify("_duroxide_migrations")+" WHERE version = $1", v).Scan(&name)
	if errors.Is(err, sql.ErrNoRows) {
		return ""
	}
	require.NoError(t, err)
	return name
}

// fetchItems calls fetch_work_items with every argument given (nil: NULL).
func (h *schemaDB) fetchItems(nowMs, timeoutMs int64, owner, sessionTimeout any, tags []string, mode any, maxItems, maxNew any) []workItem {
	h.t.Helper()
	out, err := h.fetchItemsErr("", nowMs, timeoutMs, owner, sessionTimeout, tags, mode, maxItems, maxNew)
	require.NoError(h.t, err)
	return out
}

// fetchItemsErr calls fetch_work_items in a transaction of its own, with
// lock_timeout set to lockTimeout when not empty (a call that waits on a
// lock that long fails with 55P03), and returns its rows or its error.
func (h *schemaDB) fetchItemsErr(lockTimeout string, nowMs, timeoutMs int64, owner, sessionTimeout any, tags []string, mode any, maxItems, maxNew any) ([]workItem, error) {
	ctx := h.ctx()
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if lockTimeout != "" {
		if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", lockTimeout); err != nil {
			return nil, fmt.Errorf("set lock_timeout: %w", err)
		}
	}
	rows, err := tx.Query(ctx, `SELECT out_work_item, out_lock_token, out_attempt_count
		FROM duroxide.fetch_work_items($1, $2, $3, $4, $5, $6, $7, $8)`, nowMs, timeoutMs, owner, sessionTimeout, tags, mode, maxItems, maxNew)
	if err != nil {
		return nil, fmt.Errorf("fetch_work_items: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[workItem])
	if err != nil {
		return nil, fmt.Errorf("fetch_work_items: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return out, nil
}

// items are the work items of rows, in order.
func items(rows []workItem) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.WorkItem
	}
	return out
}

// (1) The branch fix of the generic plan, port: version 16's fetch (as
// upstream 16-23 and the real provider have it) with a second visibility
// bound on the database clock. Its text is the one the pack's data knows;
// the lease is still the caller's timestamp plus the timeout; a due item is
// seen late by the skew of a caller whose clock runs ahead; and its cached
// plan reads the visible items only.
func TestBranchGenericPlanPortIsVersion16sFetchWithADatabaseClockBound(t *testing.T) {
	t.Parallel()
	entry := inFlightEntry(t, upstream.InFlightWorkerPlan)

	t.Run("its text, its row, one overload", func(t *testing.T) {
		t.Parallel()
		h := providerThen(t, upstream.InFlightWorkerPlan)
		f := definitionOf(t, h.db, "fetch_work_item")
		require.True(t, f.Matches(entry.Fingerprints["port"]), "fetch_work_item is the port's text: %+v", f)
		require.True(t, entry.Holds(f))
		require.Equal(t, upstream.InFlightWorkerPlan, recordedName(t, h.db, 22))
		d, ok := fingerprint.Identify(f)
		require.True(t, ok)
		require.Equal(t, int64(22), d.BehavesAs, "the pack knows it as upstream 22's behaviour: %+v", d)
		require.False(t, d.Fixed)
	})

	t.Run("a stale caller timestamp still gets a dead lease", func(t *testing.T) {
		t.Parallel()
		h := providerThen(t, upstream.InFlightWorkerPlan)
		now := h.dbNowMs()
		h.enqueueWork(`{"n":1}`, now-60_000, nil, nil)
		w := h.fetchWork(now-10_000, lockMs, nil, nil, []string{}, "default_only")
		require.NotNil(t, w)
		left := h.workerLeaseLeft(w.Token)
		t.Logf("lease left at return by the database clock: %d ms", left)
		require.Less(t, left, int64(0), "p_now_ms + p_lock_timeout_ms, 10 s stale: dead at return")
		requirePgError(t, h.ackWorker(w.Token, h.dbNowMs()), "P0001", "Worker queue item not found or already processed")
	})

	t.Run("upstream 16-23's behaviour otherwise: tags, sessions, the session upsert", func(t *testing.T) {
		t.Parallel()
		h := providerThen(t, upstream.InFlightWorkerPlan)
		now := h.dbNowMs()
		h.enqueueWork(`{"n":"gpu"}`, now-60_000, nil, "gpu")
		h.enqueueWork(`{"n":"plain"}`, now-60_000, nil, nil)
		h.enqueueWork(`{"n":"s1"}`, now-60_000, "s1", nil)
		require.Nil(t, h.fetchWork(now, lockMs, nil, nil, []string{"gpu"}, "none"))
		require.Nil(t, h.fetchWork(now, lockMs, nil, nil, []string{"gpu"}, "DEFAULT_ONLY"))
		w := h.fetchWork(now, lockMs, nil, nil, []string{"gpu"}, "tags")
		require.NotNil(t, w)
		require.Equal(t, `{"n":"gpu"}`, w.WorkItem)
		require.EqualValues(t, 1, w.Attempts)
		require.Regexp(t, lockTokenRE, w.Token)
		require.Equal(t, `{"n":"plain"}`, h.fetchDefault(now).WorkItem)
		require.Nil(t, h.fetchDefault(now), "no owner: never a session's item")

		w = h.fetchWork(now, lockMs, "w1", int64(60_000), []string{}, "default_only")
		require.NotNil(t, w)
		require.Equal(t, `{"n":"s1"}`, w.WorkItem)
		require.Equal(t, &sessionRow{Worker: "w1", LockedUntil: now + 60_000, LastActivityAt: now}, h.session("s1"))
		h.enqueueWork(`{"n":"s1-b"}`, now-60_000, "s1", nil)
		require.Nil(t, h.fetchWork(now+1_000, lockMs, "w2", int64(60_000), []string{}, "any"), "w1's live session")
		require.NotNil(t, h.fetchWork(now+2_000, 30_000, "w1", nil, []string{}, "any"))
		require.Equal(t, now+2_000+30_000, h.session("s1").LockedUntil, "the upsert shortens the session's expiry, as at 16-23")
	})

	t.Run("a due item is seen late by the skew of a caller whose clock runs ahead", func(t *testing.T) {
		t.Parallel()
		const skew = 60_000
		for _, tc := range []struct {
			name string
			h    func(t *testing.T) *schemaDB
			sees bool
		}{
			{"upstream 16-23 (the real provider)", func(t *testing.T) *schemaDB { return providerThen(t) }, true},
			{"upstream's branch fix, port", func(t *testing.T) *schemaDB { return providerThen(t, upstream.InFlightWorkerPlan) }, false},
		} {
			h := tc.h(t)
			now := h.dbNowMs()
			h.enqueueWork(`{"n":"due by the caller"}`, now+skew/2, nil, nil)
			w := h.fetchDefault(now + skew)
			require.Equal(t, tc.sees, w != nil, "%s: an item due by the caller's clock (%d ms ahead), not yet by the database's", tc.name, skew)
		}
	})

	t.Run("its cached plan reads no more than its custom plans", func(t *testing.T) {
		t.Parallel()
		// The other cells, and the sides it is compared with, are
		// TestWorkerPlanBoundUpstreamsBranchVersus0031's.
		cell := workerPlanCells(t)[0]
		db := dbs.RealProvider(t)
		applyInFlight(t, db, upstream.InFlightWorkerPlan)
		rows := planshape.Rows(callsOn(t, db, cell))
		t.Logf("%s, rows read per call, upstream's branch fix (port): %v", cell.Name, rows)
		// What the branch fixes is the cliff: its cached plan reads no more
		// than its custom plans. How much both read depends on ANALYZE's
		// sample: CI's PostgreSQL 14 matrix once saw every call read the
		// 100,000 items scheduled for later (the pack's 0031 reads a few
		// rows in every call whatever the sample: generic_plan_test.go).
		require.False(t, planshape.Cliff(planCalls(rows)), "no cliff from call 6 on: %v", rows)
		if slices.Max(rows[5:]) >= int64(planshape.DefaultRows/100) {
			t.Logf("on this sample its plans read the %d items scheduled for later: %v", planshape.DefaultRows, rows)
		}
	})
}

// (4) Upstream's branch fix of the generic plan against the pack's 0031
// (docs/design/worker-plan-bound.md has the figures): with 100,000 items
// scheduled for later, neither has upstream 16-23's cliff (all of them
// read from call 6 on); the pack reads the visible items only in
// every call. Upstream's branch fix is held to what it fixes, no cliff
// (its cached plan reads no more than its custom plans); how much its
// plans read depends on ANALYZE's sample (CI's matrix: all 100,000 in its
// custom plans on PostgreSQL 16, in every call on 14), and is reported. They differ in the
// clock the bound is on: a caller whose clock runs ahead of the database's
// sees a due item late by the skew at upstream's branch, on time at 0031;
// a caller whose clock lags sees it when its own clock says so at both.
func TestWorkerPlanBoundUpstreamsBranchVersus0031(t *testing.T) {
	t.Parallel()
	sides := []struct {
		name  string
		open  func(t *testing.T) *testdb.Database
		cliff bool
		// genericOnly: only calls 6 on (the generic plan) are asserted.
		genericOnly bool
	}{
		{"upstream 16-23 (the real provider)", func(t *testing.T) *testdb.Database { return dbs.RealProvider(t) }, true, false},
		{"upstream's branch fix (port)", func(t *testing.T) *testdb.Database {
			db := dbs.RealProvider(t)
			applyInFlight(t, db, upstream.InFlightWorkerPlan)
			return db
		}, false, true},
		{fmt.Sprintf("pack %04d", migrations.Latest()), func(t *testing.T) *testdb.Database { return dbs.New(t, migrations.Latest()) }, false, false},
	}
	for _, cell := range workerPlanCells(t) {
		for _, side := range sides {
			t.Run(cell.Name+" / "+side.name, func(t *testing.T) {
				t.Parallel()
				rows := planshape.Rows(callsOn(t, side.open(t), cell))
				t.Logf("%s, %s: rows read per call: %v", cell.Name, side.name, rows)
				if side.cliff {
					require.GreaterOrEqual(t, slices.Min(rows[5:]), int64(planshape.DefaultRows), "from call 6 on every item scheduled for later is read: %v", rows)
					return
				}
				if side.genericOnly {
					if slices.Max(rows) >= int64(planshape.DefaultRows/100) {
						t.Logf("%s, %s: on this ANALYZE sample its plans read the rows scheduled for later: %v", cell.Name, side.name, rows)
					}
					require.False(t, planshape.Cliff(planCalls(rows)), "no cliff from call 6 on: %v", rows)
					return
				}
				require.Less(t, slices.Max(rows), int64(planshape.DefaultRows/100), "every call reads a few rows: %v", rows)
			})
		}
	}

	t.Run("the clock trade", func(t *testing.T) {
		t.Parallel()
		branch := providerThen(t, upstream.InFlightWorkerPlan)
		pack := newAtVersion(t, migrations.Latest())
		for _, tc := range []struct {
			name            string
			callerMs, dueMs int64 // the caller's clock and the item's visible_at, from the database clock
			branch, pack    bool  // whether each sees the item
		}{
			{"caller 60 s ahead, item due 30 s from now by the database clock", 60_000, 30_000, false, true},
			{"caller 60 s ahead, item due 1 s ago", 60_000, -1_000, true, true},
			{"caller 10 s behind, item due 5 s ago", -10_000, -5_000, false, false},
			{"caller 10 s behind, item due 15 s ago", -10_000, -15_000, true, true},
		} {
			for _, s := range []struct {
				h    *schemaDB
				sees bool
			}{{branch, tc.branch}, {pack, tc.pack}} {
				h := s.h.on(t)
				h.exec(`TRUNCATE duroxide.worker_queue`)
				now := h.dbNowMs()
				h.enqueueWork(`{"n":1}`, now+tc.dueMs, nil, nil)
				w := h.fetchDefault(now + tc.callerMs)
				require.Equal(t, s.sees, w != nil, "%s: %s", tc.name, map[bool]string{true: "pack", false: "upstream's branch fix"}[s.h == pack])
			}
		}
	})
}

// workerPlanCells are planshape's cells of fetch_work_item behind items
// scheduled for later: with and without an owner, and the empty poll.
func workerPlanCells(t *testing.T) []planshape.Cell {
	t.Helper()
	var out []planshape.Cell
	for _, c := range planshape.Cells(orch.RuntimeFilter()) {
		if slices.Contains([]string{
			"fetch_work_item, items scheduled for later",
			"fetch_work_item with an owner, items scheduled for later",
			"fetch_work_item, empty poll behind items scheduled for later",
		}, c.Name) {
			out = append(out, c)
		}
	}
	require.Len(t, out, 3, "planshape's worker cells")
	return out
}

// planCalls turns rows read back into calls, for planshape.Cliff.
func planCalls(rows []int64) []planshape.Call {
	out := make([]planshape.Call, len(rows))
	for i, r := range rows {
		out[i] = planshape.Call{Rows: r}
	}
	return out
}

// (1) The batched fetch, port: fetch_work_items and its four indexes, the
// single fetch left as upstream 16-23's, and the seed's defect in the batch:
// with a timestamp 10 s stale the lease is dead at return.
func TestBatchedFetchPortIsUpstreamsBatch(t *testing.T) {
	t.Parallel()
	entry := inFlightEntry(t, upstream.InFlightBatchedFetch)

	t.Run("its text, its row, its indexes; fetch_work_item is upstream 16-23's", func(t *testing.T) {
		t.Parallel()
		h := providerThen(t, upstream.InFlightBatchedFetch)
		f := definitionOf(t, h.db, "fetch_work_items")
		require.True(t, f.Matches(entry.Fingerprints["port"]), "fetch_work_items is the port's text: %+v", f)
		require.Equal(t, upstream.InFlightBatchedFetch, recordedName(t, h.db, 22))
		require.Equal(t, "5d3e664fd9550cee498ff683f89ab5a4", definitionOf(t, h.db, "fetch_work_item").Normalized, "upstream 16-23's fetch_work_item beside it")
		require.Subset(t, h.texts(`SELECT indexname::text FROM pg_indexes WHERE schemaname = 'duroxide' AND tablename = 'worker_queue'`),
			[]string{"idx_worker_queue_fetch_default_unlocked", "idx_worker_queue_fetch_session_unlocked",
				"idx_worker_queue_fetch_tag_unlocked", "idx_worker_queue_lock_expiry"})
	})

	t.Run("fetch_work_items(now - 10 s, 5000): the lease is dead at return", func(t *testing.T) {
		t.Parallel()
		h := providerThen(t, upstream.InFlightBatchedFetch)
		now := h.dbNowMs()
		h.enqueueWork(`{"n":1}`, now-60_000, nil, nil)
		got := h.fetchItems(now-10_000, lockMs, nil, nil, []string{}, "default_only", 1, 0)
		require.Len(t, got, 1)
		left := h.workerLeaseLeft(got[0].Token)
		t.Logf("lease left at return by the database clock: %d ms", left)
		require.Less(t, left, int64(0), "p_now_ms + p_lock_timeout_ms, 10 s stale: dead at return")
		requirePgError(t, h.ackWorker(got[0].Token, h.dbNowMs()), "P0001", "Worker queue item not found or already processed")
	})

	t.Run("batch semantics", func(t *testing.T) {
		t.Parallel()
		requireBatchSemantics(t, providerThen(t, upstream.InFlightBatchedFetch), false)
	})
}

// requireBatchSemantics checks, on h's fetch_work_items, what upstream's
// batched fetch promises: at most p_max_items rows in candidate order, each
// with its own token; none for p_max_items <= 0 or tag mode none; the tag
// modes; no session item without an owner; at most p_max_new_sessions new
// sessions, a session this owner holds not counted, another owner's left;
// the refusal outside read committed. fixed says whether h holds the
// pack's fix (whose leases are valid at return) or upstream's text.
func requireBatchSemantics(t *testing.T, h *schemaDB, fixed bool) {
	t.Helper()
	fresh := sharedSuite(t, h)

	t.Run("at most p_max_items, in id order, each its own token", func(t *testing.T) {
		h := fresh(t)
		now := h.dbNowMs()
		for i := range 10 {
			h.enqueueWork(fmt.Sprintf(`{"n":%d}`, i), now-60_000, nil, nil)
		}
		got := h.fetchItems(now, lockMs, nil, nil, []string{}, "default_only", 3, 0)
		require.Equal(t, []string{`{"n":0}`, `{"n":1}`, `{"n":2}`}, items(got))
		tokens := map[string]bool{}
		for _, w := range got {
			require.Regexp(t, lockTokenRE, w.Token)
			require.EqualValues(t, 1, w.Attempts)
			tokens[w.Token] = true
			left := h.workerLeaseLeft(w.Token)
			if fixed {
				require.GreaterOrEqual(t, left, lockMs-workerLeaseSlackMs)
			}
		}
		require.Len(t, tokens, 3, "one token per item")
		require.Equal(t, int64(7), h.count("worker_queue", "lock_token IS NULL"))
		require.Len(t, h.fetchItems(now, lockMs, nil, nil, []string{}, "default_only", 100, 0), 7, "the rest")
		require.Empty(t, h.fetchItems(now, lockMs, nil, nil, []string{}, "default_only", 100, 0))
	})

	t.Run("no row for p_max_items <= 0 or tag mode none; nothing changed", func(t *testing.T) {
		h := fresh(t)
		now := h.dbNowMs()
		h.enqueueWork(`{"n":1}`, now-60_000, nil, nil)
		require.Empty(t, h.fetchItems(now, lockMs, nil, nil, []string{}, "default_only", 0, 0))
		require.Empty(t, h.fetchItems(now, lockMs, nil, nil, []string{}, "default_only", -3, 0))
		require.Empty(t, h.fetchItems(now, lockMs, "w1", nil, []string{"gpu"}, "none", 10, 10))
		require.Equal(t, int64(1), h.count("worker_queue", "lock_token IS NULL AND attempt_count = 0"))
	})

	t.Run("tag modes", func(t *testing.T) {
		h := fresh(t)
		now := h.dbNowMs()
		h.enqueueWork(`{"n":"plain"}`, now-60_000, nil, nil)
		h.enqueueWork(`{"n":"gpu"}`, now-60_000, nil, "gpu")
		h.enqueueWork(`{"n":"cpu"}`, now-60_000, nil, "cpu")
		call := func(mode any, tags []string) []string {
			return items(h.fetchItems(now, lockMs, nil, nil, tags, mode, 10, 0))
		}
		reset := func() {
			h.exec(`UPDATE duroxide.worker_queue SET lock_token = NULL, locked_until = NULL, attempt_count = 0`)
		}
		require.Equal(t, []string{`{"n":"plain"}`}, call("default_only", []string{}))
		reset()
		require.Equal(t, []string{`{"n":"gpu"}`}, call("tags", []string{"gpu"}))
		reset()
		require.Equal(t, []string{`{"n":"plain"}`, `{"n":"gpu"}`}, call("default_and", []string{"gpu"}))
		reset()
		require.Equal(t, []string{`{"n":"plain"}`, `{"n":"gpu"}`, `{"n":"cpu"}`}, call("any", []string{}))
		reset()
		require.Empty(t, call("DEFAULT_ONLY", []string{}), "modes are case-sensitive")
		require.Empty(t, call(nil, []string{}), "a NULL mode matches nothing")
		require.Empty(t, call("tags", nil), "tags with no filter match nothing")
	})

	t.Run("sessions: no owner, none; at most p_max_new_sessions new ones; this owner's own not counted; another owner's left", func(t *testing.T) {
		h := fresh(t)
		now := h.dbNowMs()
		h.enqueueWork(`{"n":"plain"}`, now-60_000, nil, nil)
		for _, s := range []string{"s1", "s2", "s3", "mine", "theirs"} {
			h.enqueueWork(`{"n":"`+s+`-a"}`, now-60_000, s, nil)
			h.enqueueWork(`{"n":"`+s+`-b"}`, now-60_000, s, nil)
		}
		h.exec(`INSERT INTO duroxide.sessions VALUES ('mine', 'w1', $1, $2), ('theirs', 'w0', $1, $2)`, now+600_000, now-1_000)

		require.Equal(t, []string{`{"n":"plain"}`}, items(h.fetchItems(now, lockMs, nil, nil, []string{}, "any", 100, 100)),
			"without an owner, no session's item")
		h.exec(`UPDATE duroxide.worker_queue SET lock_token = NULL, locked_until = NULL, attempt_count = 0`)

		require.Equal(t, []string{`{"n":"plain"}`, `{"n":"mine-a"}`, `{"n":"mine-b"}`},
			items(h.fetchItems(now, lockMs, "w1", int64(60_000), []string{}, "any", 100, 0)),
			"no new session: the items without one, and this owner's")
		got := items(h.fetchItems(now, lockMs, "w1", int64(60_000), []string{}, "any", 100, 2))
		require.Equal(t, []string{`{"n":"s1-a"}`, `{"n":"s1-b"}`, `{"n":"s2-a"}`, `{"n":"s2-b"}`}, got, "two new sessions, both their items")
		for _, s := range []string{"s1", "s2"} {
			require.Equal(t, "w1", h.session(s).Worker)
			if fixed {
				require.GreaterOrEqual(t, h.session(s).LockedUntil-h.dbNowMs(), int64(60_000-workerLeaseSlackMs))
			} else {
				require.Equal(t, now+60_000, h.session(s).LockedUntil)
			}
		}
		require.Nil(t, h.session("s3"), "the third new session is left for another call")
		require.Equal(t, "w0", h.session("theirs").Worker)
		require.Equal(t, []string{`{"n":"s3-a"}`}, items(h.fetchItems(now, lockMs, "w2", int64(60_000), []string{}, "any", 1, 5)),
			"p_max_items counts items, not sessions")
		require.Equal(t, []string{`{"n":"s3-b"}`}, items(h.fetchItems(now, lockMs, "w2", int64(60_000), []string{}, "any", 5, 0)),
			"w2 holds s3 now: its other item needs no new session")
		require.Empty(t, h.fetchItems(now, lockMs, "w1", int64(60_000), []string{}, "any", 100, 100), "theirs stays w0's while live")
	})

	t.Run("refuses unless read committed", func(t *testing.T) {
		h := fresh(t)
		ctx := h.ctx()
		tx, err := h.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `SELECT * FROM duroxide.fetch_work_items($1, 5000)`, h.dbNowMs())
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Contains(t, pgErr.Message, "READ COMMITTED")
	})
}

// realProviderAdoptedAt is a database the real provider made (upstream
// 1..21 and 23), adopted with `harness baseline` and taken to pack version
// v with `harness migrate up --to v`.
func realProviderAdoptedAt(t *testing.T, v int64) *testdb.Database {
	t.Helper()
	provider := upstream.Require(t)
	return dbs.NewState(t, fmt.Sprintf("real-provider-adopted-%d", v), 0, func(ctx context.Context, db *testdb.Database) error {
		if err := provider.Migrate(ctx, db.Source, db.Schema); err != nil {
			return err
		}
		conn, err := sql.Open("pgx", db.DSN)
		if err != nil {
			return err
		}
		defer conn.Close()
		if _, err := baseline.Run(ctx, conn, baseline.Options{Schema: db.Schema}); err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
		r, err := migrate.Open(ctx, db.Source.Config(), migrate.Options{Schema: db.Schema})
		if err != nil {
			return err
		}
		defer r.Close()
		if _, err := r.UpTo(ctx, v); err != nil {
			return fmt.Errorf("up to %d: %w", v, err)
		}
		return nil
	})
}

// (3) The branch fix of the generic plan meets the pack's worker fixes: a
// database the real provider made, adopted up to the last version before
// the worker fixes, then given the branch file by upstream's runner; `migrate
// up`, one version at a time: 0025 and 0028 leave its fetch as it is, 0031
// installs the pack's fix over it; then a Down below 0031 is refused while
// _duroxide_migrations records the branch file, changing nothing.
func TestBranchGenericPlanIsLeftBy0025And0028AndFixedBy0031(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	first, ok := migrations.FixOf("fetch_work_item")
	require.True(t, ok)
	// The fixes of fetch_work_item that leave upstream's behaviour 22 (their
	// "-- Leaves:" line), and the first that serves it.
	var leaving []int64
	var planFix int64
	for _, m := range migrations.Fixes() {
		if !slices.Contains(m.Fixes, "fetch_work_item") || planFix != 0 {
			continue
		}
		if slices.Contains(m.Leaves["fetch_work_item"], 22) {
			leaving = append(leaving, m.Version)
			continue
		}
		planFix = m.Version
	}
	require.Equal(t, []int64{25, 28}, leaving, "0025 and 0028 say they leave the branch fix")
	require.Equal(t, int64(31), planFix, "0031 installs its fix over it")

	db := realProviderAdoptedAt(t, first.Version-1)
	applyInFlight(t, db, upstream.InFlightWorkerPlan)
	port := definitionOf(t, db, "fetch_work_item")
	require.True(t, port.Matches(inFlightEntry(t, upstream.InFlightWorkerPlan).Fingerprints["port"]))

	r := db.Runner(t)
	for v := first.Version; v <= migrations.Latest(); v++ {
		_, err := r.UpTo(ctx, v)
		require.NoError(t, err, "up to %d", v)
		f := definitionOf(t, db, "fetch_work_item")
		if v < planFix {
			require.Equal(t, port, f, "at %d the branch fix is left as it is", v)
			continue
		}
		require.True(t, fingerprint.FixedFrom(f, planFix), "at %d the fetch is 0031's fix, got %+v", v, f)
	}
	h := &schemaDB{t: t, db: db, pool: db.PgxPool(t)}
	now := h.dbNowMs()
	h.enqueueWork(`{"n":1}`, now-60_000, nil, nil)
	w := h.fetchWork(now-10_000, lockMs, nil, nil, []string{}, "default_only")
	require.NotNil(t, w)
	require.GreaterOrEqual(t, h.workerLeaseLeft(w.Token), lockMs-workerLeaseSlackMs, "0031's lease, valid at return")

	// Down to 0031 first: the later fixes' Downs put 0031's fix back.
	_, err := r.DownTo(ctx, planFix)
	require.NoError(t, err)
	fixed := definitionOf(t, db, "fetch_work_item")
	require.True(t, fingerprint.FixedFrom(fixed, planFix), "0031's fix, got %+v", fixed)
	_, err = r.DownTo(ctx, planFix-1)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the Down below 0031 is refused")
	require.Equal(t, "55000", pgErr.Code)
	require.Contains(t, pgErr.Message, upstream.InFlightWorkerPlan)
	v, err := r.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, planFix, v, "goose stops at 0031")
	require.Equal(t, fixed, definitionOf(t, db, "fetch_work_item"), "the refused Down changed nothing")
}

// (3) The Downs of 0025 and 0028 leave the branch fix as they find it, and
// so does 0031's where the branch file is not recorded (its text installed
// by hand, say): none carries their fix.
func TestWorkerFixDownsLeaveTheBranchGenericPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		from, to int64
		unrecord bool
	}{{28, 24, false}, {31, 30, true}} {
		t.Run(fmt.Sprintf("down from %d to %d", tc.from, tc.to), func(t *testing.T) {
			t.Parallel()
			db := dbs.New(t, tc.from)
			applyInFlight(t, db, upstream.InFlightWorkerPlan)
			if tc.unrecord {
				h := &schemaDB{t: t, db: db, pool: db.PgxPool(t)}
				h.exec(`DELETE FROM duroxide._duroxide_migrations WHERE name = $1`, upstream.InFlightWorkerPlan)
			}
			port := definitionOf(t, db, "fetch_work_item")
			r := db.Runner(t)
			_, err := r.DownTo(ctx, tc.to)
			require.NoError(t, err)
			v, err := r.Version(ctx)
			require.NoError(t, err)
			require.Equal(t, tc.to, v)
			require.Equal(t, port, definitionOf(t, db, "fetch_work_item"), "the branch fix is left as it is")
		})
	}
}
