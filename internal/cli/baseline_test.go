package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/packfacts"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// dbs hands the baseline and doctor tests databases at a version, on one
// server started by TestMain (other tests of the package start their own).
var dbs *testdb.Pool

func TestMain(m *testing.M) {
	os.Exit(testdb.RunTests(m, func(srv *pgtest.Server) {
		dbs = testdb.NewPool(srv, "duroxide")
	}))
}

// runCmd runs one subcommand function as Run would (while it is not yet
// listed in commands()).
func runCmd(t *testing.T, fn func(context.Context, *Env, []string) error, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	env := &Env{Program: "harness", Stdout: &out, Stderr: &errOut}
	return report(env, fn(context.Background(), env, args)), out.String(), errOut.String()
}

func sqlExec(t *testing.T, d *testdb.Database, q string) {
	t.Helper()
	_, err := d.Conn(t, "").Exec(context.Background(), q)
	require.NoError(t, err, q)
}

func TestBaselineCommand(t *testing.T) {
	t.Parallel()
	d := dbs.New(t, 17)
	sqlExec(t, d, "DROP TABLE "+d.Qualify("goose_db_version"))
	base := []string{"--dsn", d.DSN, "--schema", d.Schema}

	code, out, errOut := runCmd(t, runBaseline, append(base, "--dry-run")...)
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, "would create")
	require.Contains(t, out, "dry run: nothing was changed")

	code, out, errOut = runCmd(t, runBaseline, base...)
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, "baselined at goose version 17")

	code, out, _ = runCmd(t, runBaseline, base...)
	require.Equal(t, ExitOK, code)
	require.Contains(t, out, "nothing to do")

	code, out, errOut = run(t, "migrate", "up", "--dsn", d.DSN, "--schema", d.Schema)
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, fmt.Sprintf("now at version %d", migrations.Latest()))
}

func TestBaselineCommandRefusals(t *testing.T) {
	t.Parallel()
	d := dbs.New(t, packfacts.LastContiguousPort())
	base := []string{"--dsn", d.DSN, "--schema", d.Schema}
	sqlExec(t, d, "DELETE FROM "+d.Qualify("goose_db_version")+" WHERE version_id > 2")
	code, _, errOut := runCmd(t, runBaseline, base...)
	require.Equal(t, ExitFailure, code)
	require.Contains(t, errOut, "--force")

	sqlExec(t, d, "DROP TABLE "+d.Qualify("goose_db_version"))
	sqlExec(t, d, "ALTER TABLE "+d.Qualify("instance_locks")+" ADD COLUMN owner text")
	code, out, errOut := runCmd(t, runBaseline, base...)
	require.Equal(t, ExitFailure, code)
	require.Contains(t, errOut, "does not match")
	require.Contains(t, out, "+ extra    table instance_locks column owner")

	code, _, errOut = runCmd(t, runBaseline, "--dsn", d.DSN, "--schema", "elsewhere")
	require.Equal(t, ExitFailure, code)
	require.Contains(t, errOut, "no _duroxide_migrations table")
}

func TestBaselineCommandBadInput(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"extra"},
		{"--frob"},
	} {
		code, _, errOut := runCmd(t, runBaseline, args...)
		require.Equal(t, ExitUsage, code, "%v: %s", args, errOut)
		require.NotContains(t, errOut, "hunter2")
	}
	// A server that cannot be reached is not bad input.
	code, _, errOut := runCmd(t, runBaseline, "--dsn", "postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=2")
	require.Equal(t, ExitUnavailable, code, errOut)
	require.NotContains(t, errOut, "hunter2")
}
