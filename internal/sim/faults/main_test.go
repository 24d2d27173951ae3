package faults_test

import (
	"os"
	"testing"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// dbs hands out per-test databases on the one server this test binary uses.
var dbs *testdb.Pool

// Versions the scenarios run at: the one reported (19) and the pack's
// latest, which must keep every invariant.
const bugVersion = 19

var latest = migrations.Latest()

func TestMain(m *testing.M) {
	os.Exit(testdb.RunTests(m, func(srv *pgtest.Server) {
		dbs = testdb.NewPool(srv, "duroxide")
	}))
}
