// Package migrations_test applies the pack to throwaway PostgreSQL databases
// and checks it against upstream's catalog, upstream's behaviour, and the
// fix of 0020.
package migrations_test

import (
	"os"
	"testing"

	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// dbs hands out per-test databases on the one server this test binary uses.
var dbs *testdb.Pool

func TestMain(m *testing.M) {
	os.Exit(testdb.RunTests(m, func(srv *pgtest.Server) {
		dbs = testdb.NewPool(srv, "duroxide")
	}))
}
