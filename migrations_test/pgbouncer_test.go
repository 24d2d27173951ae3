package migrations_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/harness/ops/doctor"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// goose's session lock, and the search_path the migrations run under, do
// not survive a pooler that hands server connections from client to client:
// migrate refuses such a connection before it changes anything, and names
// the direct connection to use.
func TestMigrateRefusesAConnectionThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := dbs.Server()
	name, err := srv.CreateDatabase(ctx, "harness_bouncer_", "")
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.DropDatabase(context.Background(), name) })
	for _, mode := range []string{"transaction", "session"} {
		t.Run("pgbouncer in "+mode+" mode", func(t *testing.T) {
			b := pgtest.RequirePgBouncer(t, srv, mode)
			_, err := migrate.Open(ctx, testdb.MustSource(t, b.DSN(name)).Config(), migrate.Options{Schema: "duroxide"})
			require.ErrorIs(t, err, migrate.ErrPooler)
			require.Contains(t, err.Error(), "direct connection to PostgreSQL")

			code, _, errOut := runHarness(t, "migrate", "up", "--dsn", b.DSN(name), "--schema", "duroxide")
			require.Equal(t, 64, code, errOut)
			require.Contains(t, errOut, "nothing was changed")

			conn, err := pgx.Connect(ctx, srv.DSN(name))
			require.NoError(t, err)
			defer conn.Close(ctx)
			var schemas int
			require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname = 'duroxide'").Scan(&schemas))
			require.Zero(t, schemas, "no schema was created")
		})
	}

	t.Run("a direct connection passes the same check", func(t *testing.T) {
		r, err := migrate.Open(ctx, testdb.MustSource(t, srv.DSN(name)).Config(), migrate.Options{Schema: "probe"})
		require.NoError(t, err)
		require.NoError(t, migrate.CheckDirect(ctx, r.DB(), "probe"))
		require.NoError(t, r.Close())
	})
}

// The session probe tells transaction pooling from session pooling and a
// direct connection, for a pooler that would let search_path through.
func TestTheSessionProbeSeesTransactionPooling(t *testing.T) {
	t.Parallel()
	srv := dbs.Server()
	require.Empty(t, probeRaw(t, srv.DSN("postgres")), "direct")
	trans := pgtest.RequirePgBouncer(t, srv, "transaction")
	sess := pgtest.RequirePgBouncer(t, srv, "session")
	require.Contains(t, probeRaw(t, trans.DSN("postgres")), "shared")
	require.Empty(t, probeRaw(t, sess.DSN("postgres")))
}

// probeRaw is SessionsShared over a pool without startup parameters (which
// PgBouncer would refuse).
func probeRaw(t *testing.T, dsn string) string {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	evidence, err := migrate.SessionsShared(ctx, db)
	require.NoError(t, err)
	return evidence
}

// doctor names its schema in every statement and sets no search_path at
// connection start: a monitoring job pointed at PgBouncer in transaction
// mode (which refuses that startup parameter) gets the same report as one
// connected directly.
func TestDoctorWorksThroughPgBouncerInTransactionMode(t *testing.T) {
	t.Parallel()
	d := dbs.New(t, testdb.Latest)
	b := pgtest.RequirePgBouncer(t, dbs.Server(), "transaction")
	direct, directJSON, errOut := runHarness(t, "doctor", "--dsn", d.DSN, "--schema", d.Schema, "--json")
	require.Equal(t, 0, direct, errOut)
	code, viaJSON, errOut := runHarness(t, "doctor", "--dsn", b.DSN(d.Name), "--schema", d.Schema, "--json")
	require.Equal(t, 0, code, "doctor through pgbouncer (transaction mode): %s", errOut)
	require.Contains(t, viaJSON, `"status": "ok"`)
	code, prom, errOut := runHarness(t, "doctor", "--dsn", b.DSN(d.Name), "--schema", d.Schema, "--format", "prometheus")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, prom, `duroxide_doctor_status{schema="duroxide"} 0`)
	// The same report either way, but for the clock check (its skew and
	// round trip differ from run to run).
	read := func(raw string) doctor.Report {
		var r doctor.Report
		require.NoError(t, json.Unmarshal([]byte(raw), &r))
		r.ClockSkewMs = 0
		r.Findings = slices.DeleteFunc(r.Findings, func(f doctor.Finding) bool { return f.Check == "clock" })
		return r
	}
	require.Equal(t, read(directJSON), read(viaJSON))

	// --role would stay on a shared server connection: refused, before
	// any connection takes the role.
	code, _, errOut = runHarness(t, "doctor", "--dsn", b.DSN(d.Name), "--schema", d.Schema, "--role", "postgres")
	require.Equal(t, 64, code, errOut)
	require.Contains(t, errOut, "--role postgres through a connection pooler")
	code, _, errOut = runHarness(t, "doctor", "--dsn", d.DSN, "--schema", d.Schema, "--role", "postgres")
	require.Equal(t, 0, code, "directly, --role is fine: %s", errOut)
}
