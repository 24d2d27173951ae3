package migrations_test

// The commands that only read run on a database whose sessions are
// read-only (default_transaction_read_only = on) and leave its catalog as
// they found it: any write would fail there, and the snapshot would show
// one that did not.

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/duroxide-pg/migrations/internal/packfacts"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// catalogSnapshot is every schema, relation and function outside the
// system's, with the rows of every goose table.
func catalogSnapshot(t *testing.T, dsn string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var snap string
	require.NoError(t, conn.QueryRow(ctx, `SELECT concat_ws(E'\n',
		(SELECT string_agg(nspname, ',' ORDER BY nspname) FROM pg_namespace WHERE nspname NOT LIKE 'pg\_%' AND nspname <> 'information_schema'),
		(SELECT string_agg(n.nspname || '.' || c.relname || ':' || c.relkind::text, ',' ORDER BY 1) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		  WHERE n.nspname NOT LIKE 'pg\_%' AND n.nspname <> 'information_schema'),
		(SELECT string_agg(n.nspname || '.' || p.proname || ':' || md5(p.prosrc), ',' ORDER BY 1) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		  WHERE n.nspname NOT LIKE 'pg\_%' AND n.nspname <> 'information_schema'))`).Scan(&snap))
	rows, err := conn.Query(ctx, `SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relname = $1 ORDER BY 1`, migrate.VersionTable)
	require.NoError(t, err)
	schemas, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for _, s := range schemas {
		var n int64
		require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{s, migrate.VersionTable}.Sanitize()).Scan(&n))
		snap += fmt.Sprintf("\n%s: %d goose rows", s, n)
	}
	return snap
}

func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = cli.Run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestReadOnlyCommandsChangeNothing(t *testing.T) {
	p := upstream.Require(t)
	ctx := context.Background()
	db := dbs.New(t, 0)
	fix, _, verr := packfacts.FetchFix() // the version before the fetch fix: 19
	require.NoError(t, verr)
	require.NoError(t, migrate.To(ctx, db.Source.Config(), "ro_pack", migrations.Latest()))
	require.NoError(t, migrate.To(ctx, db.Source.Config(), "ro_old", fix))
	require.NoError(t, p.Migrate(ctx, db.Source, "ro_upstream"))
	admin, err := pgx.Connect(ctx, db.DSN)
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" SET default_transaction_read_only = on")
	require.NoError(t, err)
	before := catalogSnapshot(t, db.DSN)

	latest := fmt.Sprint(migrations.Latest())
	for _, tc := range []struct {
		args   []string
		code   int
		stdout string // a substring stdout must hold
		stderr string // a substring stderr must hold
	}{
		{args: []string{"doctor", "--schema", "ro_pack"}, code: 0},
		{args: []string{"doctor", "--schema", "ro_upstream"}, code: 1},
		{args: []string{"doctor", "--schema", "ro_pack", "--format", "prometheus"}, code: 0, stdout: "duroxide_doctor_status"},
		{args: []string{"migrate", "status", "--schema", "ro_pack"}, code: 0, stdout: "applied"},
		{args: []string{"migrate", "version", "--schema", "ro_pack"}, code: 0, stdout: latest + "\n"},
		{args: []string{"migrate", "status", "--schema", "ro_missing"}, code: 0, stdout: "pending", stderr: "schema ro_missing does not exist"},
		{args: []string{"migrate", "version", "--schema", "ro_missing"}, code: 0, stdout: "0\n", stderr: "does not exist"},
		{args: []string{"migrate", "down", "--to", "1", "--schema", "ro_missing"}, code: cli.ExitUsage, stderr: "schema ro_missing does not exist: nothing to roll back; nothing was created"},
		{args: []string{"baseline", "--dry-run", "--schema", "ro_upstream"}, code: 0},
		{args: []string{"sql", "up", "--schema", "ro_old"}, code: 0, stdout: "goose_db_version"},
		{args: []string{"sql", "down", "--to", fmt.Sprint(fix), "--schema", "ro_pack"}, code: 0, stdout: "goose_db_version"},
	} {
		args := append(append([]string{}, tc.args...), "--dsn", db.DSN)
		code, stdout, stderr := runCLI(args...)
		require.Equal(t, tc.code, code, "%v\nstdout: %s\nstderr: %s", tc.args, stdout, stderr)
		require.Contains(t, stdout, tc.stdout, "%v", tc.args)
		require.Contains(t, stderr, tc.stderr, "%v", tc.args)
		require.Equal(t, before, catalogSnapshot(t, db.DSN), "%v leaves the catalog as it was", tc.args)
	}
	// The repros' and the bench's version check (migrate.CurrentVersion).
	v, err := migrate.CurrentVersion(ctx, db.Source.Config(), "ro_pack")
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
	v, err = migrate.CurrentVersion(ctx, db.Source.Config(), "ro_missing")
	require.NoError(t, err)
	require.Zero(t, v)
	require.Equal(t, before, catalogSnapshot(t, db.DSN))
}

// TestMigrateDownOnAMissingSchemaCreatesNothing: where writes are allowed,
// down on a schema that does not exist says so and creates neither the
// schema nor goose's table (it used to answer "now at version 0").
func TestMigrateDownOnAMissingSchemaCreatesNothing(t *testing.T) {
	db := dbs.New(t, 0)
	before := catalogSnapshot(t, db.DSN)
	for _, args := range [][]string{{"migrate", "down", "--schema", "nowhere"}, {"migrate", "down", "--to", "1", "--schema", "nowhere"}} {
		code, _, stderr := runCLI(append(args, "--dsn", db.DSN)...)
		require.Equal(t, cli.ExitUsage, code, stderr)
		require.Contains(t, stderr, "schema nowhere does not exist")
		require.Equal(t, before, catalogSnapshot(t, db.DSN))
	}
}
