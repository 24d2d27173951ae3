package cli

// Bad input to the operator commands: each command, each bad argument, on
// a throwaway database holding the pack's latest; every refusal exits 64
// (doctor: 2 when the server cannot be used, as its monitoring contract
// says) with one line naming what is wrong, and the whole catalog is as it
// was. Then names that are odd but valid (quotes, a semicolon, capitals,
// non-ASCII letters) go through every step a DBA takes, exactly as given.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// catalogSnapshot is every database object a command could create, change
// or drop, outside the system schemas, as sorted lines: schemas, relations
// (with their kind), functions (with their arguments and a hash of their
// body), roles, databases, and the rows of every goose and duroxide-pg
// bookkeeping table.
func catalogSnapshot(t *testing.T, ctx context.Context, conn *pgx.Conn) []string {
	t.Helper()
	var out []string
	collect := func(q string) {
		rows, err := conn.Query(ctx, q)
		require.NoError(t, err, q)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, q)
		out = append(out, lines...)
	}
	const userSchemas = "n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'"
	collect("SELECT 'schema ' || nspname FROM pg_namespace n WHERE " + userSchemas)
	collect("SELECT 'relation ' || n.nspname || '.' || c.relname || ' ' || c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE " + userSchemas)
	collect("SELECT 'function ' || n.nspname || '.' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') ' || md5(p.prosrc) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE " + userSchemas)
	collect("SELECT 'role ' || rolname FROM pg_roles")
	collect("SELECT 'database ' || datname FROM pg_database")
	rows, err := conn.Query(ctx, "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r' AND c.relname IN ($1, '_duroxide_migrations') AND "+userSchemas, migrate.VersionTable)
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pgx.Identifier, error) {
		var s, n string
		err := r.Scan(&s, &n)
		return pgx.Identifier{s, n}, err
	})
	require.NoError(t, err)
	for _, tbl := range tables {
		collect(fmt.Sprintf("SELECT %s || ' ' || t::text FROM %s t", quoteLiteral(tbl.Sanitize()), tbl.Sanitize()))
	}
	slices.Sort(out)
	return out
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// badInput is one command with one bad argument.
type badInput struct {
	name string
	args []string
	// code is the exit status (ExitUsage unless set).
	code int
	// says is what the one line on stderr must name.
	says string
}

func TestBadInputIsRefusedAndLeavesTheCatalogAsItWas(t *testing.T) {
	srv := startServer(t)
	ctx := context.Background()
	db, err := srv.CreateDatabase(ctx, "bad_input_", "")
	require.NoError(t, err)
	dsn := srv.DSN(db)
	code, _, stderr := run(t, "migrate", "up", "--dsn", dsn)
	require.Equal(t, ExitOK, code, stderr)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })

	latest := migrations.Latest()
	long := strings.Repeat("a", 70)
	longUnicode := strings.Repeat("é", 32) // 32 characters, 64 bytes
	refusedDSN := srv.DSN("no_such_database")
	// The commands that act on a database, with what each needs besides.
	commands := [][]string{
		{"migrate", "up"}, {"migrate", "down", "--to", "1"}, {"migrate", "status"}, {"migrate", "version"}, {"migrate", "plan"},
		{"baseline"}, {"baseline", "--dry-run"}, {"sql", "up"}, {"sql", "down", "--to", "1"}, {"doctor"},
	}
	var cases []badInput
	for _, c := range commands {
		label := strings.Join(c, " ")
		with := func(args ...string) []string { return append(slices.Clone(c), args...) }
		// A server that refuses the connection: not bad input (doctor:
		// critical). A role that does not exist: bad input, everywhere.
		unreachable, roleRefused := ExitUnavailable, ExitUsage
		if c[0] == "doctor" {
			unreachable = exitCritical
		}
		cases = append(cases,
			badInput{label + ": a schema over 63 bytes", with("--dsn", dsn, "--schema", long), 0, "63 bytes"},
			badInput{label + ": a unicode schema over 63 bytes", with("--dsn", dsn, "--schema", longUnicode), 0, "64 bytes long"},
			badInput{label + ": an empty schema", with("--dsn", dsn, "--schema", ""), 0, "--schema is empty"},
			badInput{label + ": a schema with a dot", with("--dsn", dsn, "--schema", "duroxide.x"), 0, "holds a dot"},
			badInput{label + ": a schema that is not UTF-8", with("--dsn", dsn, "--schema", "dx\xff"), 0, "not valid UTF-8"},
			badInput{label + ": a schema with a control character", with("--dsn", dsn, "--schema", "dx\tb"), 0, "control character"},
			badInput{label + ": an empty role", with("--dsn", dsn, "--role", ""), 0, "--role is empty"},
			badInput{label + ": a role over 63 bytes", with("--dsn", dsn, "--role", long), 0, "--role"},
			badInput{label + ": a role that does not exist", with("--dsn", dsn, "--role", "no_such_role"), roleRefused, `role "no_such_role" does not exist`},
			badInput{label + ": a DSN that does not parse", with("--dsn", "postgres://[::1"), 0, "DSN"},
			badInput{label + ": a DSN whose server refuses", with("--dsn", refusedDSN), unreachable, `database "no_such_database" does not exist`},
		)
	}
	for _, c := range [][]string{{"migrate", "up"}, {"migrate", "down"}, {"sql", "up"}, {"sql", "down"}} {
		label := strings.Join(c, " ")
		with := func(args ...string) []string { return append(slices.Clone(c), append(args, "--dsn", dsn)...) }
		cases = append(cases,
			badInput{label + ": a version beyond the latest", with("--to", "99"), 0, fmt.Sprintf("--to 99: version 99 does not exist; give a version of the pack, 1..%d", latest)},
			badInput{label + ": a negative version", with("--to", "-1"), 0, `--to "-1" is not a version number`},
			badInput{label + ": a version that is not a number", with("--to", "abc"), 0, `--to "abc" is not a version number`},
		)
	}
	cases = append(cases,
		badInput{"migrate up: version 0", []string{"migrate", "up", "--to", "0", "--dsn", dsn}, 0, "--to 0: version 0 does not exist"},
		badInput{"sql up: version 0", []string{"sql", "up", "--to", "0", "--dsn", dsn}, 0, "--to 0: version 0 does not exist"},
		badInput{"migrate up into a new schema: a version beyond the latest", []string{"migrate", "up", "--to", "99", "--schema", "t1", "--dsn", dsn}, 0, "--to 99"},
		badInput{"migrate status: --to", []string{"migrate", "status", "--to", "3", "--dsn", dsn}, 0, "--to only applies to up, down and plan"},
		badInput{"migrate up: a negative --lock-timeout", []string{"migrate", "up", "--lock-timeout", "-1s", "--dsn", dsn}, 0, "--lock-timeout -1s is negative"},
		badInput{"migrate up: a --lock-timeout below a millisecond", []string{"migrate", "up", "--lock-timeout", "10us", "--dsn", dsn}, 0, "below a millisecond"},
		badInput{"migrate up: a negative --lock-retries", []string{"migrate", "up", "--lock-retries", "-2", "--dsn", dsn}, 0, "--lock-retries -2 is negative"},
		badInput{"doctor: --max-attempts 0", []string{"doctor", "--max-attempts", "0", "--dsn", dsn}, 0, "--max-attempts"},
		badInput{"doctor: a negative --watch", []string{"doctor", "--watch", "-1s", "--dsn", dsn}, 0, "--watch"},
		badInput{"doctor: a --watch that is not a duration", []string{"doctor", "--watch", "soon", "--dsn", dsn}, 0, "invalid value \"soon\" for flag -watch"},
	)

	before := catalogSnapshot(t, ctx, conn)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := c.code
			if want == 0 {
				want = ExitUsage
			}
			code, stdout, stderr := run(t, c.args...)
			require.Equal(t, want, code, "args %q\nstdout: %s\nstderr: %s", c.args, stdout, stderr)
			line := strings.TrimSuffix(stderr, "\n")
			require.NotContains(t, line, "\n", "one line on stderr")
			require.Contains(t, line, c.says)
			require.Equal(t, before, catalogSnapshot(t, ctx, conn), "the catalog after %q", c.args)
		})
	}
}

// TestOddButValidSchemaNamesAreUsedExactlyAsGiven takes schemas whose names
// need quoting through what a DBA does: a database as upstream's runner
// leaves it (upstream 23), baseline, migrate up, doctor, migrate down to
// the port of upstream 23. Each step acts on exactly that schema; no other
// schema appears and the table the semicolon's name mentions stays.
func TestOddButValidSchemaNamesAreUsedExactlyAsGiven(t *testing.T) {
	srv := startServer(t)
	port, ok := migrations.PortOf(23)
	require.True(t, ok)
	for _, schema := range []string{`we"ird`, "x; DROP TABLE y", "UPPER", "dürox_ünïcode", strings.Repeat("é", 31) + "x"} {
		t.Run(schema, func(t *testing.T) {
			d := testdb.NewPool(srv, schema).UpstreamShaped(t, 23)
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, d.DSN)
			require.NoError(t, err)
			defer conn.Close(ctx)
			_, err = conn.Exec(ctx, "CREATE TABLE public.y (id int)")
			require.NoError(t, err)

			step := func(want int, args ...string) string {
				t.Helper()
				code, stdout, stderr := run(t, append(args, "--dsn", d.DSN, "--schema", schema)...)
				require.Equal(t, want, code, "%q\nstdout: %s\nstderr: %s", args, stdout, stderr)
				return stdout + stderr
			}
			step(ExitOK, "baseline")
			out := step(ExitOK, "migrate", "up")
			require.Contains(t, out, fmt.Sprintf("now at version %d (schema %s)", migrations.Latest(), schema))
			out = step(ExitOK, "doctor", "--json")
			require.Contains(t, out, `"status": "ok"`)
			out = step(ExitOK, "migrate", "down", "--to", fmt.Sprint(port.Version))
			require.Contains(t, out, fmt.Sprintf("now at version %d (schema %s)", port.Version, schema))

			rows, err := conn.Query(ctx, "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema' ORDER BY 1")
			require.NoError(t, err)
			schemas, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			require.ElementsMatch(t, []string{"public", schema}, schemas)
			var tables int
			require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename = 'y'").Scan(&tables))
			require.Equal(t, 1, tables, "public.y is still there")
			var version int64
			require.NoError(t, conn.QueryRow(ctx, "SELECT max(version_id) FROM "+pgx.Identifier{schema, migrate.VersionTable}.Sanitize()).Scan(&version))
			require.Equal(t, port.Version, version)
		})
	}
}
