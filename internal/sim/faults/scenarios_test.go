package faults_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/duroxide-pg/migrations/internal/sim/faults"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// scenarioDuration keeps each run at 2-4 s.
const scenarioDuration = 2500 * time.Millisecond

// runAt runs sc on a fresh database of pool at version, its dispatchers
// connected with via(db) (nil: the database's own DSN). It reports with
// Errorf and returns nil on failure, so that it can run in a goroutine;
// the database is dropped unless the test failed.
func runAt(t *testing.T, pool *testdb.Pool, sc faults.Scenario, version int64, via func(*testdb.Database) string) *faults.Result {
	db, err := pool.Create(context.Background(), version)
	if err != nil {
		t.Errorf("database at %d: %v", version, err)
		return nil
	}
	t.Cleanup(func() {
		if !t.Failed() {
			_ = db.Drop(context.Background())
		}
	})
	cfg := sc.Config
	cfg.Schema = db.Schema
	if via != nil {
		cfg.Via = testdb.MustSource(t, via(db))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := faults.Run(ctx, db.Source, cfg, sc.Checks)
	if err != nil {
		t.Errorf("%s at %d: %v", sc.Name, version, err)
		return nil
	}
	return res
}

// runBoth runs sc at 19 and at the pack's latest version, both at once,
// and stops the test when either could not run.
func runBoth(t *testing.T, sc faults.Scenario, via func(*testdb.Database) string) (v19, vl *faults.Result) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); v19 = runAt(t, dbs, sc, bugVersion, via) }()
	go func() { defer wg.Done(); vl = runAt(t, dbs, sc, latest, via) }()
	wg.Wait()
	if v19 == nil || vl == nil {
		t.FailNow()
	}
	return v19, vl
}

// check logs both versions and asserts the latest.
func check(t *testing.T, sc faults.Scenario, v19, vl *faults.Result) {
	t.Helper()
	t.Logf("%s at v%d (reported): %s", sc.Name, bugVersion, v19.Line())
	for _, v := range first(v19.Report.Violations, 3) {
		t.Logf("  v%d: %s", bugVersion, v)
	}
	t.Logf("%s at v%d: %s", sc.Name, latest, vl.Line())
	if err := vl.Report.Err(); err != nil {
		t.Errorf("%s at v%d: %v", sc.Name, latest, err)
	}
	if vl.Report.Leases == 0 {
		t.Errorf("%s at v%d: no lease at all (first error: %s)", sc.Name, latest, vl.Summary.FirstError)
	}
}

func first[T any](s []T, n int) []T { return s[:min(n, len(s))] }

// TestScenarios runs every fault scenario but the restart at 19 (reported)
// and at the pack's latest version (asserted), both versions at once.
func TestScenarios(t *testing.T) {
	t.Parallel()
	for _, sc := range faults.Scenarios(scenarioDuration) {
		if sc.NeedsRestart {
			continue
		}
		t.Run(sc.Name, func(t *testing.T) {
			t.Parallel()
			v19, vl := runBoth(t, sc, nil)
			check(t, sc, v19, vl)
			if sc.Name == "kill" && vl.Faults.KillsInjected == 0 {
				t.Errorf("kill: no backend was killed")
			}
			if sc.Name == "crash" && vl.Faults.Crashes == 0 {
				t.Errorf("crash: no dispatcher crashed")
			}
		})
	}
}

// TestRestart restarts the server mid-run. It needs a server the harness
// owns (the local backend): it starts one of its own, so that the restart
// does not disturb the other tests.
func TestRestart(t *testing.T) {
	t.Parallel()
	if dbs.Server().Backend() != pgtest.Local {
		t.Skipf("the %s backend's server cannot be restarted by the harness (only local can)", dbs.Server().Backend())
	}
	opts := pgtest.OptionsFromEnv()
	opts.Backend = pgtest.Local
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, opts)
	if err != nil {
		t.Fatalf("own local server: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	pool := testdb.NewPool(srv, "duroxide")
	var sc faults.Scenario
	for _, s := range faults.Scenarios(scenarioDuration) {
		if s.NeedsRestart {
			sc = s
		}
	}
	sc.Config.Restart = srv.Restart
	if os.Getenv("FAULTS_RESTART_VERBOSE") != "" {
		t.Logf("restart scenario config: %+v", sc.Config)
	}
	// One version at a time: a restart ends every session on the server.
	v19 := runAt(t, pool, sc, bugVersion, nil)
	vl := runAt(t, pool, sc, latest, nil)
	if v19 == nil || vl == nil {
		t.FailNow()
	}
	check(t, sc, v19, vl)
	if vl.Faults.Restarts != 1 {
		t.Errorf("restart: %d restarts, want 1", vl.Faults.Restarts)
	}
}

// throughPooler says whether sc can run with its dispatchers behind
// PgBouncer 1.18 in transaction mode, and why not: a kill targets the
// backend pid a connection reports (PgBouncer reports its own), session
// timeouts are startup parameters (PgBouncer refuses them), and a restart
// is the direct server's.
func throughPooler(sc faults.Scenario) (ok bool, why string) {
	c := sc.Config
	switch {
	case c.KillEvery > 0:
		return false, "kills a backend by the pid its connection reports; behind PgBouncer that pid is PgBouncer's"
	case c.StatementTimeout > 0 || c.SessionLockTimeout > 0:
		return false, "sets its timeouts as startup parameters, which PgBouncer 1.18 refuses"
	case sc.NeedsRestart:
		return false, "restarts the server"
	}
	return true, ""
}

// TestScenariosThroughPgBouncer runs the fault scenarios that a pooler does
// not rule out with every dispatcher connected through PgBouncer in
// transaction pooling mode: the invariants hold at the pack's latest
// version as they do over direct connections (19 is reported).
func TestScenariosThroughPgBouncer(t *testing.T) {
	t.Parallel()
	b := pgtest.RequirePgBouncer(t, dbs.Server(), "transaction")
	ran := 0
	for _, sc := range faults.Scenarios(scenarioDuration) {
		if ok, why := throughPooler(sc); !ok {
			t.Logf("%s: not through PgBouncer: %s", sc.Name, why)
			continue
		}
		ran++
		t.Run(sc.Name, func(t *testing.T) {
			t.Parallel()
			v19, vl := runBoth(t, sc, func(db *testdb.Database) string { return b.DSN(db.Name) })
			check(t, sc, v19, vl)
			if sc.Name == "crash" && vl.Faults.Crashes == 0 {
				t.Errorf("crash: no dispatcher crashed")
			}
		})
	}
	if ran < 3 {
		t.Fatalf("only %d scenarios can run through PgBouncer", ran)
	}
}
