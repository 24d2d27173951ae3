package migrations_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/baseline"
	"github.com/duroxide-pg/migrations/harness/ops/catalog"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/harness/ops/sqlscript"
	"github.com/duroxide-pg/migrations/internal/packfacts"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// psqlPath finds a psql client: PG_BIN, PATH, then Debian's versioned
// directories. t is skipped, with the reason, when there is none.
func psqlPath(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("PG_BIN"); dir != "" {
		if p := filepath.Join(dir, "psql"); fileExists(p) {
			return p
		}
	}
	if p, err := exec.LookPath("psql"); err == nil {
		return p
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql")
	if len(found) > 0 {
		slices.Sort(found)
		return found[len(found)-1]
	}
	t.Skip("no psql client (PG_BIN, PATH, /usr/lib/postgresql/*/bin): the script cannot be run here")
	return ""
}

func fileExists(p string) bool { st, err := os.Stat(p); return err == nil && !st.IsDir() }

// openSQL is a database/sql handle on db.
func openSQL(t *testing.T, db *testdb.Database) *sql.DB {
	t.Helper()
	conn, err := sql.Open("pgx", db.DSN)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// script writes the script `harness sql` would print for db.
func script(t *testing.T, db *testdb.Database, down bool, to int64) string {
	t.Helper()
	plan, err := sqlscript.Read(context.Background(), openSQL(t, db), sqlscript.Options{Schema: db.Schema, Down: down, Target: to})
	require.NoError(t, err)
	var b bytes.Buffer
	require.NoError(t, sqlscript.Write(&b, plan))
	return b.String()
}

// runPsql runs text with psql as the script's header says to (with
// ON_ERROR_STOP, not in one transaction), adding extra to psql's options,
// and returns psql's error and output.
func runPsql(t *testing.T, db *testdb.Database, text string, extra ...string) (string, error) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "migrate.sql")
	require.NoError(t, os.WriteFile(file, []byte(text), 0o644))
	args := append([]string{"-X", "-q", "-v", "ON_ERROR_STOP=1"}, extra...)
	out, err := exec.Command(psqlPath(t), append(args, "-f", file, db.DSN)...).CombinedOutput()
	return string(out), err
}

// endState is what must be equal after the script and after the harness:
// the catalog, every function body, goose's versions and
// _duroxide_migrations' rows.
func endState(t *testing.T, db *testdb.Database) string {
	t.Helper()
	ctx := context.Background()
	conn := openSQL(t, db)
	cat, err := catalog.Take(ctx, conn, db.Schema)
	require.NoError(t, err)
	bodies, err := catalog.Bodies(ctx, conn, db.Schema)
	require.NoError(t, err)
	var goose, upstream string
	require.NoError(t, conn.QueryRowContext(ctx, `SELECT coalesce(string_agg(version_id::text || ':' || is_applied::text, ',' ORDER BY id), '')
		FROM `+db.Qualify(migrate.VersionTable)).Scan(&goose))
	require.NoError(t, conn.QueryRowContext(ctx, `SELECT coalesce(string_agg(version::text || ':' || name, ',' ORDER BY version), '')
		FROM `+db.Qualify("_duroxide_migrations")).Scan(&upstream))
	b, err := json.MarshalIndent(map[string]any{"catalog": json.RawMessage(cat), "bodies": bodies, "goose": goose, "duroxide_migrations": upstream}, "", " ")
	require.NoError(t, err)
	return string(b)
}

// TestSQLScriptEndsWhereMigrateEnds: the script `harness sql` writes, run
// with psql as its header says, leaves the schema exactly as `harness
// migrate` does (catalog, bodies, goose's and duroxide-pg's rows).
func TestSQLScriptEndsWhereMigrateEnds(t *testing.T) {
	t.Parallel()
	latest := migrations.Latest()
	for _, c := range []struct {
		name     string
		from     int64
		down     bool
		to, want int64
	}{
		{"fresh database, up to the latest", 0, false, 0, latest},
		{"pack 19, up to 21 (the fixes only)", 19, false, 21, 21},
		{"pack 21, up to the latest", 21, false, 0, latest},
		{"the latest, down to 19", latest, true, 19, 19},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db := dbs.New(t, c.from)
			out, err := runPsql(t, db, script(t, db, c.down, c.to))
			require.NoError(t, err, out)
			require.Equal(t, endState(t, dbs.New(t, c.want)), endState(t, db))
		})
	}
}

// TestSQLScriptAdoptsARealProviderDatabaseLikeMigrate: on a database the
// real duroxide-pg provider made and baseline adopted, the script's
// guarded fixes and re-applying ports end where `migrate up` ends.
func TestSQLScriptAdoptsARealProviderDatabaseLikeMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	byScript, byHarness := dbs.RealProvider(t), dbs.RealProvider(t)
	_, err := sqlscript.Read(ctx, openSQL(t, byScript), sqlscript.Options{Schema: byScript.Schema})
	require.ErrorIs(t, err, migrate.ErrNeedsBaseline, "not baselined: no script, like migrate")
	for _, db := range []*testdb.Database{byScript, byHarness} {
		_, err := baseline.Run(ctx, openSQL(t, db), baseline.Options{Schema: db.Schema})
		require.NoError(t, err)
	}
	text := script(t, byScript, false, 0)
	require.Contains(t, text, "DO $guard$", "the fixes' guards are in the script")
	out, err := runPsql(t, byScript, text)
	require.NoError(t, err, out)
	require.NoError(t, migrate.To(ctx, byHarness.Source.Config(), byHarness.Schema, migrations.Latest()))
	require.Equal(t, endState(t, byHarness), endState(t, byScript))
}

// TestSQLScriptRefusesADatabaseThatMoved: a script written at one version
// and run after the schema moved changes nothing.
func TestSQLScriptRefusesADatabaseThatMoved(t *testing.T) {
	t.Parallel()
	bug, fix, verr := packfacts.FetchFix()
	require.NoError(t, verr)
	db := dbs.New(t, bug)
	text := script(t, db, false, 0)
	require.NoError(t, migrate.To(context.Background(), db.Source.Config(), db.Schema, fix))
	before := endState(t, db)
	out, err := runPsql(t, db, text)
	require.Error(t, err)
	require.Contains(t, out, fmt.Sprintf("is at goose version %d, not %d as when this script was written; nothing was changed", fix, bug))
	require.Equal(t, before, endState(t, db))
	require.True(t, strings.Contains(text, fmt.Sprintf("pg_advisory_lock(%d)", migrate.LockID(db.Schema))), "it takes the runner's lock")
}

// TestSQLScriptRefusesOneTransaction: run with psql --single-transaction
// (which a NO TRANSACTION migration's CREATE INDEX CONCURRENTLY cannot run
// in, and which would commit at the script's first COMMIT), the script
// stops before its first change and says how to run it.
func TestSQLScriptRefusesOneTransaction(t *testing.T) {
	t.Parallel()
	db := dbs.New(t, packfacts.LastContiguousPort())
	text := script(t, db, false, 0)
	require.Contains(t, text, "NO TRANSACTION", "the plan holds a migration that runs outside a transaction")
	before := endState(t, db)
	out, err := runPsql(t, db, text, "--single-transaction")
	require.Error(t, err)
	require.Contains(t, out, "was started inside a transaction")
	require.Contains(t, out, "without --single-transaction")
	require.Equal(t, before, endState(t, db))
}

// TestSQLScriptStoppedHalfWayLeavesTheLastCommittedMigration: a script
// stopped by an error leaves the schema at the last migration it
// recorded, every earlier one whole, and a script written again from there
// ends where migrate ends.
func TestSQLScriptStoppedHalfWayLeavesTheLastCommittedMigration(t *testing.T) {
	t.Parallel()
	start := packfacts.LastContiguousPort()
	db := dbs.New(t, start)
	text := script(t, db, false, 0)
	// Break the third migration the script runs: it fails before its first
	// statement, after the two before it committed.
	third := migrations.MustPack()[start+2]
	marker := "\n-- ==== " + third.File
	i := strings.Index(text, marker)
	require.Positive(t, i, "the script runs %s", third.File)
	broken := text[:i] + "\nSELECT 1/0;" + text[i:]
	out, err := runPsql(t, db, broken)
	require.Error(t, err)
	require.Contains(t, out, "division by zero")
	var v int64
	require.NoError(t, openSQL(t, db).QueryRowContext(context.Background(), "SELECT max(version_id) FROM "+db.Qualify(migrate.VersionTable)).Scan(&v))
	require.Equal(t, third.Version-1, v, "the two migrations before %s committed, each in its own transaction", third.File)
	require.Equal(t, endState(t, dbs.New(t, third.Version-1)), endState(t, db))
	out, err = runPsql(t, db, script(t, db, false, 0))
	require.NoError(t, err, out)
	require.Equal(t, endState(t, dbs.New(t, migrations.Latest())), endState(t, db))
}

// TestSQLScriptStopsOnALockItWaitedTooLongFor: the script bounds every wait
// for a lock (--lock-timeout, set before its first statement that takes
// one). A writer of the queue holding its transaction open keeps 0029 (which
// takes EXCLUSIVE on orchestrator_queue) from starting: psql stops with
// SQLSTATE 55P03 after the bound, instead of holding every later writer
// behind the migration's wait, and the migration before it stays committed
// and recorded. A script written again from there finishes the job.
func TestSQLScriptStopsOnALockItWaitedTooLongFor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	scoped, ok := migrations.FixOf("orchestrator_queue_head_offer")
	require.True(t, ok)
	locker := scoped
	for _, m := range migrations.Fixes() {
		if slices.Contains(m.Fixes, "orchestrator_queue_head_offer") && strings.Contains(m.Locks, "EXCLUSIVE on orchestrator_queue") {
			locker = m // the first fix that holds the queue's writers off
			break
		}
	}
	require.Contains(t, locker.Locks, "EXCLUSIVE on orchestrator_queue", "%s takes EXCLUSIVE on the queue", locker.File)
	start := locker.Version - 2
	db := dbs.New(t, start)
	plan, err := sqlscript.Read(ctx, openSQL(t, db), sqlscript.Options{Schema: db.Schema, LockTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	var b bytes.Buffer
	require.NoError(t, sqlscript.Write(&b, plan))
	text := b.String()
	first := strings.Index(text, "SET lock_timeout = '300ms';")
	require.Positive(t, first, "the script sets its bound")
	require.Less(t, first, strings.Index(text, "SELECT pg_advisory_lock("), "before the migration lock")
	require.Less(t, first, strings.Index(text, "\n-- ==== "), "before the first migration")

	// A writer of the queue, its transaction open: ROW EXCLUSIVE on it.
	writer, err := openSQL(t, db).BeginTx(ctx, nil)
	require.NoError(t, err)
	defer writer.Rollback() //nolint:errcheck // rolled back at the end
	_, err = writer.ExecContext(ctx, "LOCK TABLE "+db.Qualify("orchestrator_queue")+" IN ROW EXCLUSIVE MODE")
	require.NoError(t, err)

	out, err := runPsql(t, db, text, "-v", "VERBOSITY=verbose")
	require.Error(t, err, "psql stops")
	require.Contains(t, out, "55P03: canceling statement due to lock timeout", "the lock timeout's SQLSTATE:\n%s", out)
	var v int64
	require.NoError(t, openSQL(t, db).QueryRowContext(ctx, "SELECT max(version_id) FROM "+db.Qualify(migrate.VersionTable)).Scan(&v))
	require.Equal(t, locker.Version-1, v, "the migration before %s stays committed and recorded", locker.File)
	require.NoError(t, writer.Rollback())

	out, err = runPsql(t, db, script(t, db, false, 0))
	require.NoError(t, err, out)
	require.Equal(t, endState(t, dbs.New(t, migrations.Latest())), endState(t, db))
}
