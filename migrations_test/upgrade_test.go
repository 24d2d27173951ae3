package migrations_test

// The fix survives duroxide-pg's next release. A database the real
// provider made is adopted at the pack's latest (baseline, migrate up);
// then a duroxide-pg release connects and its runner, which runs on every
// connect, applies a migration that redefines a function the pack fixes:
// a released line (upstream 20, 21 and 23 over a database the pack fixed
// at 1..19) or one of upstream's in-flight migrations (our ports, applied
// as its runner applies them). doctor names the one function and the one
// remedy; one `harness migrate up` puts the fix back, doctor is OK again
// and the fix works. The real runtime's scenarios on every end state are
// in runtime_e2e_test.go.

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/doctor"
	"github.com/duroxide-pg/migrations/internal/sim/repro"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// upgradeCase is one upgrade of duroxide-pg over a database the pack fixed.
type upgradeCase struct {
	name string
	// open clones the upgraded database (a fresh one each call).
	open func(t *testing.T) *testdb.Database
	// function is the fixed function the upgrade redefines.
	function string
	// broken and works say whether the fix of function is gone, and back:
	// each runs on its own clone (they leave rows behind).
	broken, works func(t *testing.T, d *testdb.Database)
	// pending: goose has migrations to apply, which bring the fix back
	// themselves (a port re-installs the fixed text of the behaviour it
	// ports); otherwise the restore step does, and says so.
	pending bool
}

// staleOrchestrationLease is the seed's reproduction A on d: the lease a
// fetch with a timestamp 10 s stale and a 5 s lock timeout returns, by the
// database clock at return.
func staleOrchestrationLease(t *testing.T, d *testdb.Database) int64 {
	t.Helper()
	res, err := repro.Minimal(context.Background(), d.PgxPool(t), d.Schema, 0, repro.MinimalConfig{})
	require.NoError(t, err)
	require.True(t, res.Fetched, "reproduction A fetched nothing")
	return res.RemainingMs
}

// staleBatchedLease is the worker's stale-timestamp check through the
// batched fetch: one visible item, fetch_work_items with p_now_ms 10 s
// stale and a 5 s lock timeout; the lease left at return.
func staleBatchedLease(t *testing.T, d *testdb.Database) int64 {
	t.Helper()
	res, err := repro.StaleBatchedFetch(context.Background(), d.Source, d.Schema)
	require.NoError(t, err)
	require.True(t, res.Fetched, "fetch_work_items returned nothing")
	return res.RemainingMs
}

func upgradeCases() []upgradeCase {
	inflight := func(file string) func(t *testing.T) *testdb.Database {
		return func(t *testing.T) *testdb.Database { return dbs.Upgraded(t, file) }
	}
	orchBroken := func(t *testing.T, d *testdb.Database) {
		require.Negative(t, staleOrchestrationLease(t, d), "reproduction A: the lease is dead at return again")
	}
	orchWorks := func(t *testing.T, d *testdb.Database) {
		require.Greater(t, staleOrchestrationLease(t, d), int64(4000), "reproduction A: a live lease at return")
	}
	cases := []upgradeCase{
		{name: "released lines: the pack at 21 on 1..19, then the runner applies 20, 21 and 23",
			open:     func(t *testing.T) *testdb.Database { return dbs.PackThenProvider(t, orchFixedStop()) },
			function: "ack_orchestration_item", works: orchWorks, pending: true},
		{name: "upstream's candidate fix", open: inflight(upstream.InFlightCandidate),
			function: "fetch_orchestration_item", broken: orchBroken, works: orchWorks},
		{name: "upstream's continued-as-new ack", open: inflight(upstream.InFlightContinuedAck),
			function: "ack_orchestration_item", works: fixedAs("ack_orchestration_item", "pack 0021 fix, upstream 24 behaviour")},
		{name: "upstream's plan bound of the worker fetch", open: inflight(upstream.InFlightWorkerPlan),
			function: "fetch_work_item", works: fixedAs("fetch_work_item", newestFix("fetch_work_item", 22))},
		{name: "upstream's batched worker fetch", open: inflight(upstream.InFlightBatchedFetch),
			function: "fetch_work_items",
			broken: func(t *testing.T, d *testdb.Database) {
				require.Negative(t, staleBatchedLease(t, d), "fetch_work_items(now - 10 s, 5000): the lease is dead at return")
			},
			works: func(t *testing.T, d *testdb.Database) {
				fixedAs("fetch_work_items", newestFix("fetch_work_items", 22))(t, d)
				require.Greater(t, staleBatchedLease(t, d), int64(4000), "fetch_work_items(now - 10 s, 5000): a live lease at return")
			}},
	}
	return cases
}

// newestFix is the label of the pack's newest fix of function for
// upstream behaviour behavesAs ("pack 0035 fix"), the definition the
// restore step installs for it.
func newestFix(function string, behavesAs int64) string {
	fix, _, ok := migrations.FixFor(function, behavesAs, migrations.Latest())
	if !ok {
		return "no fix of " + function
	}
	return "pack " + fix.File[:4] + " fix"
}

// fixedAs checks that function holds the fix of the given definition: the
// pack's fix built on upstream's change (inflight_*_test.go test what it
// does).
func fixedAs(function, definition string) func(t *testing.T, d *testdb.Database) {
	return func(t *testing.T, d *testdb.Database) {
		fs, err := doctor.Functions(context.Background(), sqlDB(t, d), d.Schema)
		require.NoError(t, err)
		for _, f := range fs {
			if f.Name == function {
				require.Equal(t, doctor.Fixed, f.Verdict)
				require.Equal(t, definition, f.Definition)
				return
			}
		}
		t.Fatalf("doctor does not list %s", function)
	}
}

func TestOneMigrateUpPutsBackEveryFixAnUpgradeReplaced(t *testing.T) {
	upstream.Require(t)
	for _, c := range upgradeCases() {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			if c.broken != nil {
				c.broken(t, c.open(t))
			}
			d := c.open(t)
			db := sqlDB(t, d)
			r, err := doctor.Check(ctx, db, doctor.Options{Schema: d.Schema})
			require.NoError(t, err)
			require.Equal(t, doctor.Warning, r.Status, "%+v", r.Findings)
			listed := 0
			for _, f := range r.Functions {
				if f.Name == c.function {
					listed++
					require.Equal(t, doctor.Replaced, f.Verdict, "%+v", f)
				} else {
					require.NotEqual(t, doctor.Replaced, f.Verdict, "%s: the upgrade replaced %s only: %+v", f.Name, c.function, f)
				}
			}
			require.Equal(t, 1, listed, "the function table lists %s once", c.function)
			var findings []doctor.Finding
			for _, f := range r.Findings {
				if f.Check == c.function {
					findings = append(findings, f)
				}
			}
			require.Len(t, findings, 1, "one finding for %s", c.function)
			require.Contains(t, findings[0].Message, "duroxide-pg's runner replaced the fix")
			require.Contains(t, findings[0].Action, "harness migrate up")

			code, out, errOut := runCLI("migrate", "up", "--dsn", d.DSN, "--schema", d.Schema)
			require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errOut)
			if !c.pending {
				require.Contains(t, out, "restored the fix of "+c.function)
			}
			require.Contains(t, out, fmt.Sprintf("now at version %d", migrations.Latest()))

			code, out, errOut = runCLI("doctor", "--dsn", d.DSN, "--schema", d.Schema)
			require.Equal(t, 0, code, "doctor after one migrate up:\n%s%s", out, errOut)
			require.True(t, strings.Contains(out, ": OK"), out)
			c.works(t, d)

			// Again: nothing left to restore, and nothing said.
			code, out, errOut = runCLI("migrate", "up", "--dsn", d.DSN, "--schema", d.Schema)
			require.Equal(t, 0, code, errOut)
			require.NotContains(t, out, "restored")
		})
	}
}

// A definition nobody knows, planted over a fixed function after
// adoption, next to one the pack knows how to restore: migrate up exits 1
// naming it, and the catalog is exactly as before.
func TestMigrateUpRefusesADefinitionNobodyKnowsAndChangesNothing(t *testing.T) {
	upstream.Require(t)
	ctx := context.Background()
	d := dbs.Upgraded(t, upstream.InFlightCandidate)
	db := sqlDB(t, d)
	var def string
	require.NoError(t, db.QueryRowContext(ctx, "SELECT pg_get_functiondef($1::regproc)", d.Qualify("renew_session_lock")).Scan(&def))
	_, err := db.ExecContext(ctx, strings.Replace(def, "BEGIN", "BEGIN\n    -- planted by hand", 1))
	require.NoError(t, err)
	before := catalogSnapshot(t, d.DSN)

	code, out, errOut := runCLI("migrate", "up", "--dsn", d.DSN, "--schema", d.Schema)
	require.Equal(t, 1, code, "stdout: %s\nstderr: %s", out, errOut)
	require.Contains(t, errOut, "renew_session_lock: a definition nobody knows")
	require.Contains(t, errOut, "nothing was changed")
	require.NotContains(t, out, "restored")
	require.Equal(t, before, catalogSnapshot(t, d.DSN), "the catalog, goose's table included, is as it was")
}
