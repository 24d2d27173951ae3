// Package migrations_test applies the pack to throwaway PostgreSQL databases
// and checks it against upstream's catalog, upstream's behaviour, and the
// fix of 0020.
package migrations_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/duroxide-pg/migrations/harness/pgtest"
	"github.com/duroxide-pg/migrations/harness/testdb"
)

// dbs hands out per-test databases on the one server this test binary uses.
var dbs *testdb.Pool

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	opts := pgtest.OptionsFromEnv()
	srv, err := pgtest.Start(ctx, opts)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "migrations_test: no PostgreSQL server: %v\n", err)
		return 1
	}
	defer func() {
		if err := srv.Close(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "migrations_test: stop server: %v\n", err)
		}
	}()
	dbs = testdb.NewPool(srv, "duroxide")
	return m.Run()
}
