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
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/harness/baseline"
	"github.com/duroxide-pg/migrations/harness/catalog"
	"github.com/duroxide-pg/migrations/harness/migrate"
	"github.com/duroxide-pg/migrations/harness/pgtest"
	"github.com/duroxide-pg/migrations/harness/testdb"
)

var (
	srv *pgtest.Server
	dbs *testdb.Pool
)

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
		srv = s
		dbs = testdb.NewPool(s, "duroxide")
	}))
}

// chain holds one template database per version 1..19, made by migrating
// one database a step at a time and cloning it after each step (much faster
// than migrating 19 templates from scratch).
var chain struct {
	once  sync.Once
	names map[int64]string
	err   error
}

func buildChain(ctx context.Context) (map[int64]string, error) {
	base, err := srv.CreateDatabase(ctx, "baseline_chain_", "")
	if err != nil {
		return nil, err
	}
	names := map[int64]string{0: base}
	for v := int64(1); v <= baseline.UpstreamVersions; v++ {
		r, err := migrate.Open(ctx, srv.DSN(base), migrate.Options{Schema: dbs.Schema()})
		if err != nil {
			return nil, err
		}
		_, err = r.UpTo(ctx, v)
		_ = r.Close()
		if err != nil {
			return nil, err
		}
		if names[v], err = cloneRetrying(ctx, fmt.Sprintf("baseline_tmpl_v%d_", v), base); err != nil {
			return nil, err
		}
	}
	return names, nil
}

func cloneRetrying(ctx context.Context, prefix, template string) (string, error) {
	for attempt := 0; ; attempt++ {
		// 55006: the template is briefly still in use.
		name, err := srv.CreateDatabase(ctx, prefix, template)
		if err == nil || attempt == 30 {
			return name, err
		}
		time.Sleep(time.Duration(10*(attempt+1)) * time.Millisecond)
	}
}

// newDB is a fresh database at version v (0..19), dropped when t passes.
func newDB(t *testing.T, v int64) *testdb.Database {
	t.Helper()
	ctx := context.Background()
	chain.once.Do(func() { chain.names, chain.err = buildChain(ctx) })
	require.NoError(t, chain.err)
	if v == 0 {
		return dbs.New(t, 0)
	}
	name, err := cloneRetrying(ctx, "baseline_test_", chain.names[v])
	require.NoError(t, err)
	t.Cleanup(func() {
		if !t.Failed() {
			_ = srv.DropDatabase(context.Background(), name)
		}
	})
	return &testdb.Database{Name: name, Schema: dbs.Schema(), DSN: srv.DSN(name)}
}

// upstreamBuilt is a database at version v built by the pack, then stripped
// of goose's table: what duroxide-pg's own runner leaves behind.
func upstreamBuilt(t *testing.T, v int64) (*testdb.Database, *sql.DB) {
	t.Helper()
	d := newDB(t, v)
	db := openDB(t, d)
	exec(t, db, "DROP TABLE "+d.Qualify(migrate.VersionTable))
	return d, db
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
	for v := int64(1); v <= baseline.UpstreamVersions; v++ {
		name := fmt.Sprintf("v%04d.json", v)
		want, err := os.ReadFile(filepath.Join("..", "..", "migrations_test", "testdata", "catalog", name))
		require.NoError(t, err)
		got, err := baseline.Expected.ReadFile("expected/" + name)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got),
			"harness/baseline/expected/%s differs from migrations_test/testdata/catalog/%s: copy it over", name, name)
	}
}

func TestBaselineAtEveryUpstreamVersionThenUp(t *testing.T) {
	for v := int64(1); v <= baseline.UpstreamVersions; v++ {
		t.Run(fmt.Sprintf("v%02d", v), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			d, db := upstreamBuilt(t, v)
			res, err := baseline.Run(ctx, db, baseline.Options{Schema: d.Schema})
			require.NoError(t, err)
			require.True(t, res.Changed)
			require.Equal(t, v, res.Upstream)
			require.Equal(t, v, res.Baseline)
			require.Equal(t, v, gooseVersion(t, d))

			// Idempotent: a second run changes nothing.
			res, err = baseline.Run(ctx, db, baseline.Options{Schema: d.Schema})
			require.NoError(t, err)
			require.False(t, res.Changed)

			r := d.Runner(t)
			applied, err := r.Up(ctx)
			require.NoError(t, err)
			require.Len(t, applied, int(r.Latest()-v), "up applies exactly %d..%d", v+1, r.Latest())
			require.Equal(t, r.Latest(), gooseVersion(t, d))

			// And after up, baseline still has nothing to do.
			res, err = baseline.Run(ctx, db, baseline.Options{Schema: d.Schema})
			require.NoError(t, err)
			require.False(t, res.Changed)
		})
	}
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
	require.Contains(t, err.Error(), "does not match the pack's catalog at version 19")
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
	d := newDB(t, 19)
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
	require.Equal(t, migrate.PackLatest(), gooseVersion(t, d))
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

// upstreamLater adds what upstream's own versions 20 and 21 add (see
// /work/shared/reference/duroxide-pg-catalog/upstream-later-v002*.json),
// and records them in _duroxide_migrations.
func upstreamLater(t *testing.T, db *sql.DB) {
	t.Helper()
	exec(t, db, `CREATE TABLE kv_delta (instance_id text NOT NULL, key text NOT NULL, value text,
		last_updated_at_ms bigint NOT NULL, PRIMARY KEY (instance_id, key))`)
	for _, f := range []string{
		`get_kv_all_values(p_instance text) RETURNS TABLE(out_key text, out_value text)`,
		`get_kv_value(p_instance text, p_key text) RETURNS TABLE(out_value text, out_found boolean)`,
		`get_instance_stats(p_instance text) RETURNS TABLE(out_found boolean, out_history_event_count bigint,
			out_history_size_bytes bigint, out_queue_pending_count bigint, out_kv_user_key_count bigint, out_kv_total_value_bytes bigint)`,
	} {
		exec(t, db, "CREATE FUNCTION "+f+" LANGUAGE plpgsql AS $$ BEGIN RETURN; END $$")
	}
	exec(t, db, `INSERT INTO _duroxide_migrations (version, name) VALUES (20, '0020_add_kv_delta.sql'), (21, '0021_add_instance_stats.sql')`)
}

func TestLaterUpstreamVersionsBaselineAt19(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, db := upstreamBuilt(t, 19)
	upstreamLater(t, db)
	res, err := baseline.Run(ctx, db, baseline.Options{Schema: d.Schema})
	require.NoError(t, err)
	require.Equal(t, int64(21), res.Upstream)
	require.Equal(t, int64(19), res.Baseline)
	require.Contains(t, fmt.Sprint(res.Lines), "baselining at 19")
	require.Equal(t, int64(19), gooseVersion(t, d))
	_, err = d.Runner(t).Up(ctx)
	require.NoError(t, err)
	require.Equal(t, migrate.PackLatest(), gooseVersion(t, d))
}

func TestLaterUpstreamVersionsStillNeedEveryObjectOf19(t *testing.T) {
	t.Parallel()
	d, db := upstreamBuilt(t, 19)
	upstreamLater(t, db)
	exec(t, db, "ALTER TABLE orchestrator_queue ALTER COLUMN attempt_count DROP NOT NULL")
	_, err := baseline.Run(context.Background(), db, baseline.Options{Schema: d.Schema})
	var ref *baseline.Refusal
	require.ErrorAs(t, err, &ref)
	require.Contains(t, ref.Diff, "~ differs  table orchestrator_queue column attempt_count not_null")
	require.NotContains(t, ref.Diff, "kv_delta", "objects of later versions are allowed")
	requireNoGooseTable(t, d, db)
}

func TestRefusesWhatDuroxidePgDidNotCreate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newDB(t, 0)
	db := openDB(t, d)
	_, err := baseline.Run(ctx, db, baseline.Options{Schema: d.Schema})
	require.ErrorContains(t, err, "no _duroxide_migrations table")

	d2, db2 := upstreamBuilt(t, 5)
	exec(t, db2, "DELETE FROM _duroxide_migrations WHERE version = 3")
	_, err = baseline.Run(ctx, db2, baseline.Options{Schema: d2.Schema})
	require.ErrorContains(t, err, "not 1..5 without gaps")
	require.True(t, baseline.IsRefusal(err))
	require.False(t, errors.Is(err, context.Canceled))
}
