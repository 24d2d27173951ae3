package migrations_test

// No generic-plan cliff: PL/pgSQL plans a statement for its arguments on
// the first five calls of a session and may then switch to a generic plan
// cached for the session. A queue-reading function of the pack's latest
// reads, from its 6th call on, no more rows than twice what it read in
// calls 2-5, with 100,000 rows it does not need (scheduled for later,
// leased, or completed instances) next to the few it does. Measured in
// rows read (internal/planshape: pg_stat_xact_user_tables), never in time;
// `harness-lab bench --scenarios plans` reports the same cells with times.

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/planshape"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// callsOn seeds db's schema for cell and measures its calls on a new
// session.
func callsOn(t *testing.T, db *testdb.Database, cell planshape.Cell) []planshape.Call {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, cell.Seed(ctx, db.Conn(t, ""), db.Schema, planshape.DefaultRows))
	calls, err := cell.Measure(ctx, db.Conn(t, ""), db.Schema)
	require.NoError(t, err)
	return calls
}

func TestQueueReadsHaveNoGenericPlanCliff(t *testing.T) {
	t.Parallel()
	latest := migrations.Latest()
	for _, cell := range planshape.Cells(orch.RuntimeFilter()) {
		t.Run(cell.Name, func(t *testing.T) {
			t.Parallel()
			db := dbs.New(t, latest)
			calls := callsOn(t, db, cell)
			rows := planshape.Rows(calls)
			t.Logf("rows read per call at %04d: %v", latest, rows)
			require.False(t, planshape.Cliff(calls), "from the 6th call on, %s reads more than twice what calls 2-5 read: %v", cell.Name, rows)
		})
	}
}

// Before the pack's fix of the worker fetch's plan (the first whose body
// reads its visibility bound from a setting the planner sees), its 6th
// call on reads every item scheduled for later: the test above can fail.
func TestWorkerFetchHadAGenericPlanCliffBeforeItsFix(t *testing.T) {
	t.Parallel()
	var fix int64
	for _, m := range migrations.Fixes() {
		if fix == 0 && slices.ContainsFunc(m.Definitions, func(d migrations.Definition) bool {
			return !d.Down && d.Function == "fetch_work_item" && strings.Contains(d.Source, "current_setting('duroxide.fetch_visible_ms'")
		}) {
			fix = m.Version
		}
	}
	require.NotZero(t, fix, "a fix of fetch_work_item reads its bound from a setting")
	db := dbs.New(t, fix-1)
	cell := planshape.Cells(orch.RuntimeFilter())[0]
	calls := callsOn(t, db, cell)
	rows := planshape.Rows(calls)
	t.Logf("rows read per call at %04d: %v", fix-1, rows)
	// The custom plans of calls 1-5 depend on ANALYZE's sample; the
	// generic plan (a bound of unknown value: a third of the table, by
	// PostgreSQL's default estimate) always walks the primary key.
	require.GreaterOrEqual(t, slices.Min(rows[5:]), int64(planshape.DefaultRows), "at %04d fetch_work_item's generic plan reads every item scheduled for later: %v", fix-1, rows)
}

// A renewal names its lease by token: at the pack's latest it reads the
// rows of that lease, not the 100,000 other leases, in every call. Before
// the latest fix of renew_orchestration_item_lock (no index on the
// instance locks' token) it read the whole table, twice.
func TestRenewalsReadOnlyTheirOwnLease(t *testing.T) {
	t.Parallel()
	var renewals []planshape.Cell
	for _, cell := range planshape.Cells(orch.RuntimeFilter()) {
		if strings.HasPrefix(cell.Name, "renew_") {
			renewals = append(renewals, cell)
		}
	}
	require.Len(t, renewals, 2)
	// The fix that adds the index of the leases by token.
	var fix int64
	for _, m := range migrations.Fixes() {
		if slices.Contains(m.Fixes, "renew_orchestration_item_lock") && slices.Contains(m.Adds, "index idx_instance_locks_lock_token") {
			fix = m.Version
		}
	}
	require.NotZero(t, fix, "a fix of the renewal adds the index of the leases by token")
	for _, cell := range renewals {
		t.Run(cell.Name, func(t *testing.T) {
			t.Parallel()
			rows := planshape.Rows(callsOn(t, dbs.New(t, migrations.Latest()), cell))
			t.Logf("rows read per call at %04d: %v", migrations.Latest(), rows)
			require.Less(t, slices.Max(rows), int64(100), "at %04d %s reads other leases' rows: %v", migrations.Latest(), cell.Name, rows)
		})
	}
	t.Run("before the fix", func(t *testing.T) {
		t.Parallel()
		cell := renewals[len(renewals)-1]
		require.True(t, strings.HasPrefix(cell.Name, "renew_orchestration_item_lock"))
		rows := planshape.Rows(callsOn(t, dbs.New(t, fix-1), cell))
		t.Logf("rows read per call at %04d: %v", fix-1, rows)
		require.GreaterOrEqual(t, slices.Min(rows), int64(planshape.DefaultRows), "at %04d renew_orchestration_item_lock reads every lease: %v", fix-1, rows)
	})
}
