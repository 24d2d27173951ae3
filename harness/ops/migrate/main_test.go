package migrate_test

import (
	"os"
	"testing"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// dbs hands each test its own empty database on the throwaway server.
var dbs *testdb.Pool

func TestMain(m *testing.M) {
	os.Exit(testdb.RunTests(m, func(srv *pgtest.Server) {
		dbs = testdb.NewPool(srv, "duroxide")
	}))
}

// latest is the pack's newest goose version.
var latest = migrations.Latest()
