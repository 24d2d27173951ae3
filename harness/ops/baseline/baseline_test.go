package baseline_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/baseline"
	"github.com/duroxide-pg/migrations/harness/ops/catalog"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/packfacts"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

var dbs *testdb.Pool

func TestMain(m *testing.M) {
	// The tests wait on the database, not the CPU: run more of them at once
	// than GOMAXPROCS unless -parallel is given.
	flag.Parse()
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		_ = flag.Set("test.parallel", "8")
	}
	os.Exit(testdb.RunTests(m, func(s *pgtest.Server) {
		dbs = testdb.NewPool(s, "duroxide")
	}))
}

// upstreamBuilt is a database shaped like one duroxide-pg's own runner left
// at upstream version v (no goose table), and a pool on it.
func upstreamBuilt(t *testing.T, v int64) (*testdb.Database, *sql.DB) {
	t.Helper()
	d := dbs.UpstreamShaped(t, v)
	return d, openDB(t, d)
}

func openDB(t *testing.T, d *testdb.Database) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(d.DSN)
	require.NoError(t, err)
	cfg.RuntimeParams["search_path"] = migrate.SearchPath(d.Schema)
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func exec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	_, err := db.ExecContext(context.Background(), q, args...)
	require.NoError(t, err, q)
}

func gooseVersion(t *testing.T, d *testdb.Database) int64 {
	t.Helper()
	v, err := d.Runner(t).Version(context.Background())
	require.NoError(t, err)
	return v
}

// The embedded expected catalogs are the test data's, byte for byte.
func TestExpectedCatalogsAreTheTestData(t *testing.T) {
	for _, v := range migrations.UpstreamVersions() {
		name := fmt.Sprintf("v%04d.json", v)
		if v > 19 {
			name = "upstream-later-" + name
		}
		want, err := os.ReadFile(filepath.Join("..", "..", "..", "migrations_test", "testdata", "catalog", name))
		require.NoError(t, err)
		got, err := baseline.Expected.ReadFile(fmt.Sprintf("expected/v%04d.json", v))
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got),
			"harness/ops/baseline/expected/v%04d.json differs from migrations_test/testdata/catalog/%s: copy it over", v, name)
	}
}

func TestBaselineAtEveryUpstreamVersionThenUp(t *testing.T) {
	for _, v := range migrations.UpstreamVersions() {
		t.Run(fmt.Sprintf("v%02d", v), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			d, db := upstreamBuilt(t, v)
			res, err := baseline.Run(ctx, db, baseline.Options{Schema: d.Schema})
			require.NoError(t, err)
			require.True(t, res.Changed)
			require.Equal(t, v, res.Upstream)
			require.Equal(t, v, res.State)
			want := min(v, packfacts.LastContiguousPort())
			require.Equal(t, want, res.Baseline, "goose records the pack's versions the database already has")
			require.Equal(t, want, gooseVersion(t, d))
			require.Empty(t, res.Unvouched)

			// Idempotent: a second run changes nothing.
			res, err = baseline.Run(ctx, db, baseline.Options{Schema: d.Schema})
			require.NoError(t, err)
			require.False(t, res.Changed)

			r := d.Runner(t)
			applied, err := r.Up(ctx)
			require.NoError(t, err)
			require.Len(t, applied, int(migrations.Latest()-want), "up applies exactly %d..%d", want+1, migrations.Latest())
			require.Equal(t, migrations.Latest(), gooseVersion(t, d))

			// And after up, baseline still has nothing to do.
			res, err = baseline.Run(ctx, db, baseline.Options{Schema: d.Schema})
			require.NoError(t, err)
			require.False(t, res.Changed)
		})
	}
}

// A database the real duroxide-pg provider made (upstream's own runner and
// texts, 1..21 and 23) is adopted at 19, and the plan says what up does.
func TestBaselineAdoptsWhatTheRealProviderMade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := dbs.RealProvider(t)
	db := openDB(t, d)
	res, err := baseline.Run(ctx, db, baseline.Options{Schema: d.Schema, DryRun: true})
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 23}, res.Recorded)
	require.Equal(t, int64(23), res.State)
	require.Equal(t, packfacts.LastContiguousPort(), res.Baseline)
	lines := strings.Join(res.Lines, "\n")
	require.Contains(t, lines, "(no 22: upstream has not released it, as expected)")
	require.Contains(t, lines, "function bodies: all 36 are upstream's or the pack's at version 23")
	plan := strings.Join(res.Plan, "\n")
	require.Contains(t, plan, "0020_fetch_lease_valid_at_return.sql: fixes fetch_orchestration_item (now upstream 19-23)")
	require.Contains(t, plan, "0021_ack_locks_its_lease.sql: fixes ack_orchestration_item (now upstream 20-23)")
	require.Contains(t, plan, "0022_add_kv_delta.sql: re-applies upstream 20 over the objects duroxide-pg's runner made")
	requireNoGooseTable(t, d, db)

	res, err = baseline.Run(ctx, db, baseline.Options{Schema: d.Schema})
	require.NoError(t, err)
	require.True(t, res.Changed)
	require.Equal(t, packfacts.LastContiguousPort(), gooseVersion(t, d))
}

// A body that is neither upstream's nor the pack's is refused, with a diff
// naming the function; --force proceeds and says so, and the fix migration
// then still refuses to replace a definition it does not know.
func TestBaselineRefusesAHandEditedBodyUnlessForced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := dbs.RealProvider(t)
	db := openDB(t, d)
	exec(t, db, `CREATE OR REPLACE FUNCTION get_parent_id(p_instance_id text) RETURNS text LANGUAGE plpgsql
		AS $$ BEGIN RETURN NULL; /* hand edit */ END $$`)
	editFetch(t, db)

	_, err := baseline.Run(ctx, db, baseline.Options{Schema: d.Schema})
	var ref *baseline.Refusal
	require.ErrorAs(t, err, &ref)
	require.Contains(t, ref.Reason, "neither upstream's at version 23 nor the pack's")
	require.Contains(t, ref.Diff, "function get_parent_id(p_instance_id text)")
	require.Contains(t, ref.Diff, "function fetch_orchestration_item(p_now_ms bigint")
	require.NotContains(t, ref.Diff, "ack_orchestration_item")
	requireNoGooseTable(t, d, db)

	res, err := baseline.Run(ctx, db, baseline.Options{Schema: d.Schema, Force: true})
	require.NoError(t, err)
	require.Len(t, res.Unvouched, 1)
	require.Contains(t, res.Unvouched[0], "get_parent_id")
	_, err = d.Runner(t).Up(ctx)
	require.ErrorContains(t, err, "0020: fetch_orchestration_item in schema duroxide has a definition this migration does not know")
	require.Equal(t, packfacts.LastContiguousPort(), gooseVersion(t, d), "the refused fix changed nothing")
}

// editFetch replaces fetch_orchestration_item's body by a hand-edited one
// with the same signature.
func editFetch(t *testing.T, db *sql.DB) {
	t.Helper()
	var def string
	require.NoError(t, db.QueryRowContext(context.Background(),
		`SELECT pg_get_functiondef('fetch_orchestration_item(bigint,bigint,bigint,bigint)'::regprocedure)`).Scan(&def))
	edited := strings.Replace(def, "BEGIN", "BEGIN\n    -- hand edit", 1)
	require.NotEqual(t, def, edited)
	exec(t, db, edited)
}

// Upstream versions the pack does not know (a newer duroxide-pg) are
// refused; --force adopts the known state and lists them.
func TestBaselineRefusesANewerUpstreamUnlessForced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := dbs.RealProvider(t)
	db := openDB(t, d)
	exec(t, db, "INSERT INTO _duroxide_migrations (version, name) VALUES (24, '0024_something_new.sql')")
	_, err := baseline.Run(ctx, db, baseline.Options{Schema: d.Schema})
	require.ErrorContains(t, err, "records upstream version(s) 24, which this pack does not know")
	requireNoGooseTable(t, d, db)
	res, err := baseline.Run(ctx, db, baseline.Options{Schema: d.Schema, Force: true})
	require.NoError(t, err)
	require.Equal(t, int64(23), res.State)
	require.Len(t, res.Unvouched, 1)
}

func TestRefusesATamperedCatalogWithTheDiff(t *testing.T) {
	t.Parallel()
	d, db := upstreamBuilt(t, 19)
	var idx string
	require.NoError(t, db.QueryRowContext(context.Background(),
		`SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND indexname NOT LIKE '%pkey' ORDER BY 1 LIMIT 1`, d.Schema).Scan(&idx))
	exec(t, db, "DROP INDEX "+d.Qualify(idx))
	_, err := baseline.Run(context.Background(), db, baseline.Options{Schema: d.Schema})
	var ref *baseline.Refusal
	require.ErrorAs(t, err, &ref)
	require.Contains(t, ref.Diff, "- missing")
	require.Contains(t, ref.Diff, "index "+idx)
	require.Contains(t, err.Error(), "does not match upstream's catalog at version 19")
	requireNoGooseTable(t, d, db)
}

func requireNoGooseTable(t *testing.T, d *testdb.Database, db *sql.DB) {
	t.Helper()
	var exists bool
	require.NoError(t, db.QueryRowContext(context.Background(), "SELECT to_regclass($1) IS NOT NULL",
		d.Qualify(migrate.VersionTable)).Scan(&exists))
	require.False(t, exists, "nothing may be created")
}

func TestRefusesAnExistingGooseTableUnlessForced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := dbs.New(t, packfacts.LastContiguousPort())
	db := openDB(t, d)
	// goose says 3, duroxide-pg says 19: someone migrated by other means.
	exec(t, db, "DELETE FROM "+d.Qualify(migrate.VersionTable)+" WHERE version_id > 3")
	_, err := baseline.Run(ctx, db, baseline.Options{Schema: d.Schema})
	var ref *baseline.Refusal
	require.ErrorAs(t, err, &ref)
	require.Contains(t, err.Error(), "already exists")
	require.Contains(t, err.Error(), "--force")
	require.Equal(t, int64(3), gooseVersion(t, d))

	res, err := baseline.Run(ctx, db, baseline.Options{Schema: d.Schema, Force: true})
	require.NoError(t, err)
	require.True(t, res.Changed)
	require.Equal(t, int64(19), gooseVersion(t, d))
	_, err = d.Runner(t).Up(ctx)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), gooseVersion(t, d))
}

func TestDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, db := upstreamBuilt(t, 12)
	before, err := catalog.Take(ctx, db, d.Schema)
	require.NoError(t, err)
	res, err := baseline.Run(ctx, db, baseline.Options{Schema: d.Schema, DryRun: true})
	require.NoError(t, err)
	require.True(t, res.Changed && res.DryRun)
	require.Contains(t, res.Lines[len(res.Lines)-1], "dry run")
	requireNoGooseTable(t, d, db)
	after, err := catalog.Take(ctx, db, d.Schema)
	require.NoError(t, err)
	require.Empty(t, catalog.Diff(before, after))
}

func TestLaterUpstreamVersionsNeedUpstreamsCatalog(t *testing.T) {
	t.Parallel()
	d, db := upstreamBuilt(t, 21)
	exec(t, db, "ALTER TABLE orchestrator_queue ALTER COLUMN attempt_count DROP NOT NULL")
	exec(t, db, "DROP TABLE kv_delta CASCADE")
	_, err := baseline.Run(context.Background(), db, baseline.Options{Schema: d.Schema})
	var ref *baseline.Refusal
	require.ErrorAs(t, err, &ref)
	require.Contains(t, ref.Diff, "~ differs  table orchestrator_queue column attempt_count not_null")
	require.Contains(t, ref.Diff, "- missing  table kv_delta")
	requireNoGooseTable(t, d, db)
}

func TestRefusesWhatDuroxidePgDidNotCreate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := dbs.New(t, 0)
	db := openDB(t, d)
	_, err := baseline.Run(ctx, db, baseline.Options{Schema: d.Schema})
	require.ErrorContains(t, err, "no _duroxide_migrations table")

	d2, db2 := upstreamBuilt(t, 5)
	exec(t, db2, "DELETE FROM _duroxide_migrations WHERE version = 3")
	_, err = baseline.Run(ctx, db2, baseline.Options{Schema: d2.Schema})
	require.ErrorContains(t, err, "but not 3, which duroxide-pg applies in order")
	require.True(t, baseline.IsRefusal(err))
	require.False(t, errors.Is(err, context.Canceled))
}
