package restore_test

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/fingerprint"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/harness/ops/restore"
	"github.com/duroxide-pg/migrations/internal/sim/repro"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

var dbs *testdb.Pool

func TestMain(m *testing.M) {
	os.Exit(testdb.RunTests(m, func(srv *pgtest.Server) {
		dbs = testdb.NewPool(srv, "duroxide")
	}))
}

// The checkout's restore file is the one the migrations make: a fix that
// changes without `harness sql restore -o sql/restore/...` fails here.
func TestTheRestoreFileIsWhatTheMigrationsMake(t *testing.T) {
	got, err := os.ReadFile("../../../" + restore.File)
	require.NoError(t, err)
	require.Equal(t, restore.Latest(), string(got),
		"%s is out of date: run `go run ./harness/cmd/harness sql restore -o %s`", restore.File, restore.File)
}

// openDB opens d with search_path set to its schema, as the migrations run.
func openDB(t *testing.T, d *testdb.Database) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(d.DSN)
	require.NoError(t, err)
	cfg.RuntimeParams["search_path"] = migrate.SearchPath(d.Schema)
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// functions fingerprints every function of the schema (the catalog's
// bodies, as doctor reads them).
func functions(t *testing.T, db *sql.DB, schema string) map[string]fingerprint.Function {
	t.Helper()
	fs, err := fingerprint.Take(context.Background(), db, schema)
	require.NoError(t, err)
	return fs
}

func planOf(t *testing.T, db *sql.DB, schema string, upTo int64) map[string]restore.Function {
	t.Helper()
	plan, err := restore.Plan(context.Background(), db, schema, upTo)
	require.NoError(t, err)
	out := map[string]restore.Function{}
	for _, f := range plan {
		out[f.Name] = f
	}
	return out
}

// applyCandidate gives d upstream's candidate fix (our port) the way
// duroxide-pg's runner applies a file: what a release carrying it does to
// a database the pack fixed.
func applyCandidate(t *testing.T, d *testdb.Database) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, d.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, upstream.ApplyMigration(ctx, conn, d.Schema, upstream.CandidateFile, upstream.CandidatePort()))
}

// leaseLeftMs is the seed's reproduction A: a message enqueued, fetched
// with p_now_ms 10 s behind the database clock and a 5 s lock timeout; the
// lease's time left at return by the database clock.
func leaseLeftMs(t *testing.T, d *testdb.Database) int64 {
	t.Helper()
	res, err := repro.Minimal(context.Background(), d.PgxPool(t), d.Schema, 0, repro.MinimalConfig{})
	require.NoError(t, err)
	require.True(t, res.Fetched, "reproduction A fetched nothing")
	return res.RemainingMs
}

func TestAtTheLatestEveryFixIsInForceAndTheRestoreChangesNothing(t *testing.T) {
	d := dbs.New(t, testdb.Latest)
	db := openDB(t, d)
	for name, f := range planOf(t, db, d.Schema, migrations.Latest()) {
		require.Contains(t, []string{restore.InForce, restore.Absent}, f.Action, "%s: %+v", name, f)
	}
	before := functions(t, db, d.Schema)
	plan, err := restore.Apply(context.Background(), db, d.Schema, migrations.Latest(), migrate.LockID(d.Schema))
	require.NoError(t, err)
	require.False(t, restore.Pending(plan))
	// The statement itself, as psql or goose runs it: twice, nothing changes.
	for range 2 {
		_, err := db.ExecContext(context.Background(), restore.Latest())
		require.NoError(t, err)
	}
	require.Equal(t, before, functions(t, db, d.Schema))
}

func TestTheRestorePutsTheFixBackOverUpstreamsCandidate(t *testing.T) {
	d := dbs.New(t, testdb.Latest)
	db := openDB(t, d)
	require.Positive(t, leaseLeftMs(t, d), "the pack's latest: a live lease at return")
	applyCandidate(t, d)
	require.Negative(t, leaseLeftMs(t, d), "the candidate, installed by duroxide-pg's runner: the bug is back")

	fetch := planOf(t, db, d.Schema, migrations.Latest())["fetch_orchestration_item"]
	require.Equal(t, restore.Restore, fetch.Action)
	require.Equal(t, "upstream candidate 0024, port", fetch.Definition)
	serving, _, ok := migrations.FixFor("fetch_orchestration_item", 24, migrations.Latest())
	require.True(t, ok, "a fix serves upstream's candidate")
	require.Equal(t, serving.File, fetch.Fix, "the newest fix of the candidate's behaviour")
	require.Equal(t, serving.UpLocks, fetch.Locks, "that fix's locks")

	r := d.Runner(t)
	goose, err := r.Version(context.Background())
	require.NoError(t, err)
	require.NoError(t, r.Restore(context.Background()))
	restored := map[string]string{}
	for _, f := range r.Restored() {
		restored[f.Name] = f.Action
	}
	require.Equal(t, restore.Restore, restored["fetch_orchestration_item"])
	require.Positive(t, leaseLeftMs(t, d), "restored: a live lease at return")
	for name, f := range planOf(t, db, d.Schema, migrations.Latest()) {
		require.Contains(t, []string{restore.InForce, restore.Absent}, f.Action, "%s after the restore", name)
	}
	// goose's table is as it was, and so is upstream's row of the candidate.
	after, err := r.Version(context.Background())
	require.NoError(t, err)
	require.Equal(t, goose, after)
	var name string
	require.NoError(t, db.QueryRowContext(context.Background(), "SELECT name FROM _duroxide_migrations WHERE version = 24").Scan(&name))
	require.Equal(t, upstream.CandidateFile, name)
	// Again: nothing to do.
	require.NoError(t, r.Restore(context.Background()))
	require.False(t, restore.Pending(r.Restored()))
}

// A definition nobody knows, planted over a fixed function after
// adoption: the restore refuses naming it, and changes nothing, not even
// the fix it could put back elsewhere.
func TestTheRestoreRefusesADefinitionNobodyKnowsAndChangesNothing(t *testing.T) {
	d := dbs.New(t, testdb.Latest)
	db := openDB(t, d)
	applyCandidate(t, d)
	src := functions(t, db, d.Schema)
	var def string
	require.NoError(t, db.QueryRowContext(context.Background(),
		"SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1 AND p.proname = 'renew_session_lock'", d.Schema).Scan(&def))
	_, err := db.ExecContext(context.Background(), strings.Replace(def, "BEGIN", "BEGIN\n    -- edited by hand", 1))
	require.NoError(t, err)
	before := functions(t, db, d.Schema)
	require.NotEqual(t, src, before)

	_, err = restore.Apply(context.Background(), db, d.Schema, migrations.Latest(), migrate.LockID(d.Schema))
	require.ErrorContains(t, err, "renew_session_lock: a definition nobody knows")
	require.ErrorContains(t, err, "nothing was changed")
	require.Equal(t, before, functions(t, db, d.Schema))

	// The statement refuses the same way on its own (psql, goose).
	_, err = db.ExecContext(context.Background(), restore.Latest())
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "55000", pgErr.Code)
	require.Contains(t, pgErr.Message, "renew_session_lock: a definition nobody knows")
	require.Equal(t, before, functions(t, db, d.Schema))
}

// Below the first fix that serves a behaviour, the restore leaves that
// behaviour's definition as it is: 0020 and 0027 would undo the
// candidate's schema-scoped key; 0029 keeps it.
func TestTheRestoreLeavesWhatNoFixUpToTheVersionServes(t *testing.T) {
	var serving migrations.Migration
	for _, m := range migrations.Fixes() {
		if _, _, ok := migrations.FixFor("fetch_orchestration_item", 24, m.Version); ok {
			serving = m
			break
		}
	}
	require.NotZero(t, serving.Version, "a fix serves upstream's candidate")
	below := serving.Version - 1
	d := dbs.New(t, below)
	db := openDB(t, d)
	applyCandidate(t, d)
	fetch := planOf(t, db, d.Schema, below)["fetch_orchestration_item"]
	require.Equal(t, restore.Left, fetch.Action)
	require.Equal(t, "upstream candidate 0024, port", fetch.Definition)
	before := functions(t, db, d.Schema)
	plan, err := restore.Apply(context.Background(), db, d.Schema, below, migrate.LockID(d.Schema))
	require.NoError(t, err)
	require.False(t, restore.Pending(plan))
	_, err = db.ExecContext(context.Background(), restore.Script(below))
	require.NoError(t, err)
	require.Equal(t, before, functions(t, db, d.Schema))
	// Up to the fix that takes the candidate's key: restored.
	require.Equal(t, restore.Restore, planOf(t, db, d.Schema, serving.Version)["fetch_orchestration_item"].Action)
}
