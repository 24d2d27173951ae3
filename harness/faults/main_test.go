package faults_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/duroxide-pg/migrations/harness/migrate"
	"github.com/duroxide-pg/migrations/harness/pgtest"
	"github.com/duroxide-pg/migrations/harness/testdb"
)

// dbs hands out per-test databases on the one server this test binary uses.
var dbs *testdb.Pool

// Versions the scenarios run at: the one reported (19) and the pack's
// latest, which must keep every invariant.
const bugVersion = 19

var latest = migrate.PackLatest()

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	srv, err := pgtest.Start(ctx, pgtest.OptionsFromEnv())
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "faults: no PostgreSQL server: %v\n", err)
		return 1
	}
	defer func() {
		if err := srv.Close(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "faults: stop server: %v\n", err)
		}
	}()
	dbs = testdb.NewPool(srv, "duroxide")
	return m.Run()
}
