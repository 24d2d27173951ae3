package migrations_test

// Roles and privileges the way DBAs separate them: an owner role applies
// the pack, the application's role gets only the grants duroxide-pg needs
// at run time (no DDL), and the harness refuses to run migrations as a role
// that does not own the schema's objects. docs/OPERATIONS.md has the same
// statements for a DBA to copy.

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/packfacts"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// leastPrivilegeGrants is docs/OPERATIONS.md's setup, for schema duroxide,
// owner role %[1]s and application role %[2]s.
const leastPrivilegeGrants = `
CREATE SCHEMA duroxide AUTHORIZATION %[1]s;
GRANT USAGE ON SCHEMA duroxide TO %[2]s;
ALTER DEFAULT PRIVILEGES FOR ROLE %[1]s IN SCHEMA duroxide
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO %[2]s;
ALTER DEFAULT PRIVILEGES FOR ROLE %[1]s IN SCHEMA duroxide
    GRANT USAGE, SELECT ON SEQUENCES TO %[2]s;
`

// leastPrivilegeBookkeeping is its second step, after the first migrate
// up: the application reads _duroxide_migrations and never touches goose's
// table.
const leastPrivilegeBookkeeping = `
REVOKE ALL ON TABLE duroxide.goose_db_version FROM %[2]s;
REVOKE INSERT, UPDATE, DELETE ON TABLE duroxide._duroxide_migrations FROM %[2]s;
`

// roleDB is an empty database with an owner and an application role, both
// able to log in, dropped (roles too) when the test ends.
type roleDB struct {
	srv        *pgtest.Server
	name       string
	owner, app string
}

func newRoleDB(t *testing.T) *roleDB {
	t.Helper()
	ctx := context.Background()
	srv := dbs.Server()
	suffix := strings.ToLower(strings.TrimPrefix(pgtest.UniqueName("r"), "r"))
	r := &roleDB{srv: srv, owner: "duroxide_owner_" + suffix, app: "duroxide_app_" + suffix}
	admin := func(sql string) {
		conn, err := pgx.Connect(ctx, srv.DSN("postgres"))
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	admin(fmt.Sprintf("CREATE ROLE %s LOGIN; CREATE ROLE %s LOGIN", r.owner, r.app))
	t.Cleanup(func() { admin(fmt.Sprintf("DROP ROLE IF EXISTS %s; DROP ROLE IF EXISTS %s", r.owner, r.app)) })
	name, err := srv.CreateDatabase(ctx, "harness_roles_", "")
	require.NoError(t, err)
	r.name = name
	t.Cleanup(func() { _ = srv.DropDatabase(context.Background(), name) })
	return r
}

// dsnAs is the database's DSN for role (trust authentication: no password).
func (r *roleDB) dsnAs(t *testing.T, role string) string {
	t.Helper()
	u, err := url.Parse(r.srv.DSN(r.name))
	require.NoError(t, err)
	u.User = url.User(role)
	return u.String()
}

// srcAs is dsnAs, parsed.
func (r *roleDB) srcAs(t *testing.T, role string) *dbconn.Source {
	t.Helper()
	return testdb.MustSource(t, r.dsnAs(t, role))
}

func (r *roleDB) exec(t *testing.T, role, sql string, args ...any) error {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, r.dsnAs(t, role))
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// runsAsTheApplication drives one orchestration turn and one activity, as
// duroxide-pg does, connected as role, and checks that role can do no DDL.
func (r *roleDB) runsAsTheApplication(t *testing.T, role string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, r.dsnAs(t, role))
	require.NoError(t, err)
	defer conn.Close(ctx)
	c := orch.New("duroxide")
	now := time.Now().UnixMilli()
	require.NoError(t, c.Enqueue(ctx, conn, "order-1", orch.StartWorkItem("order-1", "Demo", "1.0.0", 1), time.UnixMilli(now-1_000)))
	item, err := c.Fetch(ctx, conn, now, 30_000, orch.RuntimeFilter())
	require.NoError(t, err, "fetch as %s", role)
	require.NotNil(t, item)
	_, err = conn.Exec(ctx, `SELECT duroxide.enqueue_worker_work('{"ActivityExecute":{}}', $1, 'order-1', 1, 1, 's1', NULL)`, now)
	require.NoError(t, err, "enqueue an activity as %s", role)
	var token string
	require.NoError(t, conn.QueryRow(ctx, `SELECT out_lock_token FROM duroxide.fetch_work_item($1, 30000, 'w1', 30000, '{}', 'default_only')`, now).Scan(&token))
	_, err = conn.Exec(ctx, `SELECT duroxide.ack_worker($1, 'order-1', '{"ActivityCompleted":{}}', $2)`, token, now)
	require.NoError(t, err, "ack an activity as %s", role)

	_, err = conn.Exec(ctx, `CREATE TABLE duroxide.not_yours (i int)`)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "DDL as %s: %v", role, err)
	require.Equal(t, "42501", pgErr.Code, "the application's role has no DDL right: %s", pgErr.Message)
}

func TestLeastPrivilegeOwnerAppliesThePackAndTheApplicationOnlyUsesIt(t *testing.T) {
	t.Parallel()
	r := newRoleDB(t)
	ctx := context.Background()
	require.NoError(t, r.exec(t, "postgres", fmt.Sprintf(leastPrivilegeGrants, r.owner, r.app)))

	t.Run("a DBA connected as postgres applies the pack as the owner with --role", func(t *testing.T) {
		runner, err := migrate.Open(ctx, r.srcAs(t, "postgres").Config(), migrate.Options{Schema: "duroxide", Role: r.owner})
		require.NoError(t, err)
		defer runner.Close()
		_, err = runner.Up(ctx)
		require.NoError(t, err)
		o, err := migrate.ReadOwnership(ctx, runner.DB(), "duroxide")
		require.NoError(t, err)
		require.Len(t, o.Owners, 1, "one owner: %+v", o.Owners)
		require.Equal(t, r.owner, o.Owners[0].Role)
		require.NoError(t, r.exec(t, r.owner, fmt.Sprintf(leastPrivilegeBookkeeping, r.owner, r.app)))
	})

	t.Run("the application's role runs duroxide-pg's calls and cannot change the schema", func(t *testing.T) {
		r.runsAsTheApplication(t, r.app)
	})

	t.Run("nor can it run the migrations", func(t *testing.T) {
		runner, err := migrate.Open(ctx, r.srcAs(t, r.app).Config(), migrate.Options{Schema: "duroxide"})
		require.NoError(t, err)
		defer runner.Close()
		_, err = runner.DownTo(ctx, packfacts.LastContiguousPort())
		require.ErrorIs(t, err, migrate.ErrNotOwner)
		require.Contains(t, err.Error(), "--role "+r.owner)
	})

	t.Run("duroxide-pg's default migration policy needs DDL rights, so the application runs with VerifyOnly, whose checks hold for it", func(t *testing.T) {
		p := upstream.Require(t)
		err := p.Migrate(ctx, r.srcAs(t, r.app), "duroxide")
		require.Error(t, err, "MigrationPolicy::ApplyAll (the addon's only policy) creates the schema if missing: the CREATE right")
		require.Contains(t, err.Error(), "permission denied")

		// What VerifyOnly reads: every upstream version recorded, and the
		// core tables visible to the role.
		conn, err := pgx.Connect(ctx, r.dsnAs(t, r.app))
		require.NoError(t, err)
		defer conn.Close(ctx)
		rows, err := conn.Query(ctx, `SELECT version::bigint FROM duroxide._duroxide_migrations ORDER BY version`)
		require.NoError(t, err)
		recorded, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		require.Equal(t, migrations.UpstreamVersions(), recorded)
		rows, err = conn.Query(ctx, `SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'duroxide' ORDER BY 1`)
		require.NoError(t, err)
		visible, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Subset(t, visible, []string{"orchestrator_queue", "worker_queue", "instance_locks", "instances", "executions",
			"history", "kv_store", "kv_delta", "sessions", "_duroxide_migrations"})
		require.NotContains(t, visible, migrate.VersionTable, "goose's table is the owner's alone")
	})
}

func TestMigrateRefusesARoleThatDoesNotOwnTheSchema(t *testing.T) {
	t.Parallel()
	r := newRoleDB(t)
	ctx := context.Background()
	require.NoError(t, r.exec(t, "postgres", fmt.Sprintf("CREATE SCHEMA duroxide AUTHORIZATION %s", r.app)))
	runner, err := migrate.Open(ctx, r.srcAs(t, r.app).Config(), migrate.Options{Schema: "duroxide"})
	require.NoError(t, err)
	_, err = runner.UpTo(ctx, packfacts.LastContiguousPort())
	require.NoError(t, err)
	runner.Close()

	asPostgres, err := migrate.Open(ctx, r.srcAs(t, "postgres").Config(), migrate.Options{Schema: "duroxide"})
	require.NoError(t, err)
	defer asPostgres.Close()
	_, err = asPostgres.Up(ctx)
	require.ErrorIs(t, err, migrate.ErrNotOwner, "even a superuser: what it creates would not be the application's")
	require.Contains(t, err.Error(), "--role "+r.app)
	v, err := asPostgres.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, packfacts.LastContiguousPort(), v, "nothing was applied")

	withRole, err := migrate.Open(ctx, r.srcAs(t, "postgres").Config(), migrate.Options{Schema: "duroxide", Role: r.app})
	require.NoError(t, err)
	defer withRole.Close()
	_, err = withRole.Up(ctx)
	require.NoError(t, err)
	r.runsAsTheApplicationOwningIt(t)
}

// runsAsTheApplicationOwningIt: the application owns the schema (as
// duroxide-pg's runner leaves it), so it can also run DDL; every object is
// still its own after migrate up.
func (r *roleDB) runsAsTheApplicationOwningIt(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	db := migrate.OpenDB(r.srcAs(t, r.app).Config(), "duroxide", "")
	defer db.Close()
	o, err := migrate.ReadOwnership(ctx, db, "duroxide")
	require.NoError(t, err)
	require.Len(t, o.Owners, 1, "%+v", o.Owners)
	require.Equal(t, r.app, o.Owners[0].Role)
	conn, err := pgx.Connect(ctx, r.dsnAs(t, r.app))
	require.NoError(t, err)
	defer conn.Close(ctx)
	now := time.Now().UnixMilli()
	c := orch.New("duroxide")
	require.NoError(t, c.Enqueue(ctx, conn, "order-1", orch.StartWorkItem("order-1", "Demo", "1.0.0", 1), time.UnixMilli(now-1_000)))
	item, err := c.Fetch(ctx, conn, now, 30_000, orch.RuntimeFilter())
	require.NoError(t, err)
	require.NotNil(t, item)
}

func TestAnAdoptedDatabaseOwnedByTheApplicationKeepsWorkingForIt(t *testing.T) {
	t.Parallel()
	p := upstream.Require(t)
	r := newRoleDB(t)
	ctx := context.Background()
	require.NoError(t, r.exec(t, "postgres", fmt.Sprintf("GRANT CREATE ON DATABASE %s TO %s", pgx.Identifier{r.name}.Sanitize(), r.app)))
	require.NoError(t, p.Migrate(ctx, r.srcAs(t, r.app), "duroxide"), "duroxide-pg's runner, as the application, makes the schema")

	code, _, errOut := runHarness(t, "baseline", "--dsn", r.dsnAs(t, "postgres"), "--schema", "duroxide")
	require.NotZero(t, code, "baseline as postgres would create goose's table as postgres")
	require.Contains(t, errOut, "--role "+r.app)

	code, out, errOut := runHarness(t, "baseline", "--dsn", r.dsnAs(t, "postgres"), "--schema", "duroxide", "--role", r.app)
	require.Zero(t, code, out+errOut)
	code, out, errOut = runHarness(t, "migrate", "up", "--dsn", r.dsnAs(t, "postgres"), "--schema", "duroxide", "--role", r.app)
	require.Zero(t, code, out+errOut)
	require.Contains(t, out, fmt.Sprintf("now at version %d", migrations.Latest()))

	r.runsAsTheApplicationOwningIt(t)
	require.NoError(t, p.Migrate(ctx, r.srcAs(t, r.app), "duroxide"), "and duroxide-pg still opens it as the application")
}

// runHarness runs the harness command with args and returns its exit code,
// stdout and stderr.
func runHarness(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut strings.Builder
	code = cli.Run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// The script `harness sql` writes carries the same ownership check, and
// --role makes it act as the owner.
func TestSQLScriptRunsAsTheOwnerOrNotAtAll(t *testing.T) {
	t.Parallel()
	r := newRoleDB(t)
	ctx := context.Background()
	require.NoError(t, r.exec(t, "postgres", fmt.Sprintf("CREATE SCHEMA duroxide AUTHORIZATION %s", r.app)))
	runner, err := migrate.Open(ctx, r.srcAs(t, r.app).Config(), migrate.Options{Schema: "duroxide"})
	require.NoError(t, err)
	_, err = runner.UpTo(ctx, packfacts.LastContiguousPort())
	require.NoError(t, err)
	runner.Close()

	psql := func(args ...string) (string, error) {
		file := filepath.Join(t.TempDir(), "up.sql")
		code, _, errOut := runHarness(t, append([]string{"sql", "up", "--dsn", r.dsnAs(t, "postgres"), "--schema", "duroxide", "-o", file}, args...)...)
		require.Zero(t, code, errOut)
		out, err := exec.Command(psqlPath(t), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", file, r.dsnAs(t, "postgres")).CombinedOutput()
		return string(out), err
	}
	out, err := psql()
	require.Error(t, err, "run as postgres, the script refuses")
	require.Contains(t, out, "belong to "+r.app)

	out, err = psql("--role", r.app)
	require.NoError(t, err, out)
	r.runsAsTheApplicationOwningIt(t)
}
