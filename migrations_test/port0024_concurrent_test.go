package migrations_test

// 0024, the port of upstream 23, runs outside a transaction and builds its
// partial indexes concurrently (its header). These tests interrupt its Up
// and its Down at every statement and in the middle of a concurrent build
// or drop, and check that the next run finishes the work with upstream's
// catalog; that no reader or writer of either queue waits for it; that an
// index already in its end state is not rebuilt; and that the Down still
// refuses, changing nothing, over a later upstream version.

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/baseline"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/packfacts"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// v24Port is the pack's port of upstream 23.
func v24Port(t *testing.T) migrations.Migration {
	t.Helper()
	port, ok := migrations.PortOf(23)
	require.True(t, ok, "the pack ports upstream 23")
	require.True(t, port.NoTransaction, "%s runs outside a transaction", port.File)
	return port
}

// The three indexes upstream 23 makes partial, as upstream 23 and upstream
// 21 define them (the schema's name left out).
var (
	v24Partial = map[string]string{
		"idx_orch_lock":               "CREATE INDEX idx_orch_lock ON orchestrator_queue USING btree (lock_token) WHERE (lock_token IS NOT NULL)",
		"idx_worker_queue_session_id": "CREATE INDEX idx_worker_queue_session_id ON worker_queue USING btree (session_id) WHERE (session_id IS NOT NULL)",
		"idx_worker_queue_tag":        "CREATE INDEX idx_worker_queue_tag ON worker_queue USING btree (tag) WHERE (tag IS NOT NULL)",
	}
	v24Full = map[string]string{
		"idx_orch_lock":               "CREATE INDEX idx_orch_lock ON orchestrator_queue USING btree (lock_token)",
		"idx_worker_queue_session_id": "CREATE INDEX idx_worker_queue_session_id ON worker_queue USING btree (session_id)",
		"idx_worker_queue_tag":        "CREATE INDEX idx_worker_queue_tag ON worker_queue USING btree (tag)",
	}
)

// v24Index is one index of the three, or of their build and drop names.
type v24Index struct {
	def   string
	valid bool
	file  uint32 // relfilenode: a rebuilt index gets a new one
}

// v24Indexes lists the indexes of the two queues named after the three
// (their build and drop names included), by name.
func v24Indexes(t *testing.T, conn *pgx.Conn, db *testdb.Database) map[string]v24Index {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT c.relname, regexp_replace(pg_get_indexdef(i.indexrelid), ' ON \S+\.', ' ON '), i.indisvalid, c.relfilenode
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE c.relnamespace = $1::regnamespace AND c.relname ~ '^idx_(orch_lock|worker_queue_session_id|worker_queue_tag)'`, db.Schema)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]v24Index{}
	for rows.Next() {
		var name string
		var ix v24Index
		require.NoError(t, rows.Scan(&name, &ix.def, &ix.valid, &ix.file))
		out[name] = ix
	}
	require.NoError(t, rows.Err())
	return out
}

// requireV24Indexes asserts that the three indexes have exactly the
// definitions of want, valid, and that nothing else of their names is
// left (no build or drop name).
func requireV24Indexes(t *testing.T, conn *pgx.Conn, db *testdb.Database, want map[string]string, what string) {
	t.Helper()
	got := v24Indexes(t, conn, db)
	defs := map[string]string{}
	for name, ix := range got {
		require.True(t, ix.valid, "%s: %s is invalid", what, name)
		defs[name] = ix.def
	}
	require.Equal(t, want, defs, what)
}

// v24Seed queues messages and work items, some of each claimed, with a
// session or a tag: rows on both sides of every partial index's predicate.
func v24Seed(t *testing.T, conn *pgx.Conn, db *testdb.Database) {
	t.Helper()
	ctx := context.Background()
	_, err := conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (instance_id, work_item, visible_at, created_at, lock_token, locked_until)
		SELECT 'i' || (g %% 50), '{}', now(), now(), CASE WHEN g %% 4 = 0 THEN 'lock_' || g END, CASE WHEN g %% 4 = 0 THEN 1 END
		FROM generate_series(1, 400) g`, db.Qualify("orchestrator_queue")))
	require.NoError(t, err)
	_, err = conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (work_item, visible_at, created_at, session_id, tag)
		SELECT '{}', now(), now(), CASE WHEN g %% 3 = 0 THEN 's' || g END, CASE WHEN g %% 5 = 0 THEN 'gpu' END
		FROM generate_series(1, 400) g`, db.Qualify("worker_queue")))
	require.NoError(t, err)
}

// gooseStatements splits one section of a NO TRANSACTION migration into
// the statements goose runs, each on its own: a StatementBegin ..
// StatementEnd block is one statement; elsewhere a statement ends on a line
// that ends with ";"; comment lines between statements are left out.
func gooseStatements(section string) []string {
	var out []string
	var cur strings.Builder
	block := false
	for _, line := range strings.Split(section, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "-- +goose StatementBegin":
			block = true
			continue
		case trimmed == "-- +goose StatementEnd":
			block = false
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
			continue
		case !block && cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "--")):
			continue
		}
		cur.WriteString(line + "\n")
		if !block && strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
		}
	}
	return out
}

func TestGooseStatementsSplitsLikeGoose(t *testing.T) {
	got := gooseStatements("-- a comment; with a semicolon\nDROP INDEX CONCURRENTLY IF EXISTS a;\n\n-- +goose StatementBegin\nDO $x$\nBEGIN\n    PERFORM 1;\nEND;\n$x$;\n-- +goose StatementEnd\nCREATE INDEX CONCURRENTLY b\n    ON t (c);\n")
	require.Equal(t, []string{"DROP INDEX CONCURRENTLY IF EXISTS a;", "DO $x$\nBEGIN\n    PERFORM 1;\nEND;\n$x$;", "CREATE INDEX CONCURRENTLY b\n    ON t (c);"}, got)
}

// Up, interrupted after any of its statements (a lock timeout, a cancel,
// a lost connection between two of them), is finished by the next `up`:
// upstream 23's catalog (its three partial indexes, valid, under
// upstream's names; nothing left under a build or drop name), row 23
// recorded once. The statements are run by hand up to the interruption,
// as goose would have run them, then `migrate up` runs the whole Up again.
func TestV24UpInterruptedAfterAnyStatementIsFinishedByTheNextUp(t *testing.T) {
	t.Parallel()
	port := v24Port(t)
	stmts := gooseStatements(port.Up)
	require.Greater(t, len(stmts), 10, "the Up runs step by step")
	for k := 0; k <= len(stmts); k++ {
		t.Run(fmt.Sprintf("after %d of %d", k, len(stmts)), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := dbs.New(t, port.Version-1)
			conn := db.Conn(t, migrate.SearchPath(db.Schema))
			v24Seed(t, conn, db)
			for i, s := range stmts[:k] {
				_, err := conn.Exec(ctx, s)
				require.NoError(t, err, "statement %d: %s", i+1, s)
			}
			r := db.Runner(t)
			_, err := r.UpTo(ctx, port.Version)
			require.NoError(t, err)
			requireV24Indexes(t, conn, db, v24Partial, "after the next up")
			requireUpstreamPlus(t, upstreamCatalog(t, packfacts.UpstreamAt(port.Version)), takeCatalog(t, r), packfacts.AddedBy(port.Version), "after the next up")
			var rows int
			require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM _duroxide_migrations WHERE version = 23 AND name = '0023_partial_secondary_indexes.sql'").Scan(&rows))
			require.Equal(t, 1, rows)
		})
	}
}

// Down likewise: interrupted after any of its statements, the next `down`
// ends at upstream 21's catalog, the full indexes valid under upstream's
// names, row 23 gone.
func TestV24DownInterruptedAfterAnyStatementIsFinishedByTheNextDown(t *testing.T) {
	t.Parallel()
	port := v24Port(t)
	stmts := gooseStatements(port.Down)
	require.Greater(t, len(stmts), 10, "the Down runs step by step")
	for k := 0; k <= len(stmts); k++ {
		t.Run(fmt.Sprintf("after %d of %d", k, len(stmts)), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := dbs.New(t, port.Version)
			conn := db.Conn(t, migrate.SearchPath(db.Schema))
			v24Seed(t, conn, db)
			for i, s := range stmts[:k] {
				_, err := conn.Exec(ctx, s)
				require.NoError(t, err, "statement %d: %s", i+1, s)
			}
			r := db.Runner(t)
			_, err := r.DownTo(ctx, port.Version-1)
			require.NoError(t, err)
			requireV24Indexes(t, conn, db, v24Full, "after the next down")
			requireUpstreamPlus(t, upstreamCatalog(t, packfacts.UpstreamAt(port.Version-1)), takeCatalog(t, r), packfacts.AddedBy(port.Version-1), "after the next down")
			var rows int
			require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM _duroxide_migrations WHERE version = 23").Scan(&rows))
			require.Zero(t, rows)
		})
	}
}

// v24Up runs `migrate up` to the port with a short lock timeout and no
// retry, so that a lock the test holds interrupts it.
func v24Up(ctx context.Context, t *testing.T, db *testdb.Database, to int64) error {
	t.Helper()
	r, err := migrate.Open(ctx, db.Source.Config(), migrate.Options{Schema: db.Schema, LockTimeout: 200 * time.Millisecond, LockRetries: -1})
	require.NoError(t, err)
	defer r.Close()
	_, err = r.UpTo(ctx, to)
	return err
}

func requireInterrupted(t *testing.T, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr) && pgErr.Code == "55P03", "up with a lock held: %v; want lock_not_available", err)
	require.Contains(t, err.Error(), "failed part-way", "the error says the finished steps stay")
}

// A concurrent build interrupted by the lock timeout (a writer's
// transaction on worker_queue stays open past it) fails the migration:
// goose does not record it, row 23 is not written, and every column keeps
// a valid index under upstream's name (the full one); the interrupted
// build is left invalid. Once the writer commits, the next `up` drops it,
// builds it again and finishes.
func TestV24InterruptedBuildIsFinishedByTheNextUp(t *testing.T) {
	t.Parallel()
	port := v24Port(t)
	db := dbs.New(t, port.Version-1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn := db.Conn(t, migrate.SearchPath(db.Schema))
	v24Seed(t, conn, db)

	tx, err := db.Conn(t, "").Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO "+db.Qualify("worker_queue")+` (work_item, visible_at, created_at, session_id) VALUES ('{}', now(), now(), 'writer')`)
	require.NoError(t, err)

	requireInterrupted(t, v24Up(ctx, t, db, port.Version))
	r := db.Runner(t)
	v, err := r.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, port.Version-1, v, "goose did not record the interrupted migration")
	var recorded bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM _duroxide_migrations WHERE version = 23)").Scan(&recorded))
	require.False(t, recorded, "row 23 is written last")
	got := v24Indexes(t, conn, db)
	for name, def := range v24Full {
		require.Equal(t, v24Index{def: def, valid: true, file: got[name].file}, got[name], "%s keeps its full index meanwhile", name)
	}
	require.True(t, got["idx_orch_lock_0024_build"].valid, "orchestrator_queue's build finished before the writer's queue")
	require.False(t, got["idx_worker_queue_session_id_0024_build"].valid, "the interrupted build left its index invalid")

	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, v24Up(ctx, t, db, port.Version))
	requireV24Indexes(t, conn, db, v24Partial, "after the next up")
}

// duroxide-pg's runner, connecting while an interrupted 0024 has not
// recorded row 23, applies its own 23 over what the interrupted run left
// (a valid partial index under one build name, an invalid one under
// another); the next `up` still ends at upstream 23's catalog, with
// nothing left under a build name, and keeps the runner's row 23.
func TestV24InterruptedThenDuroxidePgsRunnerThenUp(t *testing.T) {
	t.Parallel()
	p := upstream.Require(t)
	port := v24Port(t)
	db := dbs.New(t, port.Version-1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn := db.Conn(t, migrate.SearchPath(db.Schema))
	v24Seed(t, conn, db)

	tx, err := db.Conn(t, "").Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO "+db.Qualify("worker_queue")+` (work_item, visible_at, created_at) VALUES ('{}', now(), now())`)
	require.NoError(t, err)
	requireInterrupted(t, v24Up(ctx, t, db, port.Version))
	require.NoError(t, tx.Commit(ctx))

	require.NoError(t, p.Migrate(ctx, db.Source, db.Schema), "duroxide-pg's runner applies its 23")
	var name string
	require.NoError(t, conn.QueryRow(ctx, "SELECT name FROM _duroxide_migrations WHERE version = 23").Scan(&name))
	require.Equal(t, "0023_partial_secondary_indexes.sql", name)

	require.NoError(t, v24Up(ctx, t, db, port.Version))
	requireV24Indexes(t, conn, db, v24Partial, "after the runner's 23 and the next up")
	r := db.Runner(t)
	requireUpstreamPlus(t, upstreamCatalog(t, packfacts.UpstreamAt(port.Version)), takeCatalog(t, r), packfacts.AddedBy(port.Version), "after the next up")
}

// A concurrent drop interrupted by the lock timeout (a reader's
// transaction on orchestrator_queue stays open past it, which a drop waits
// for and a build does not) leaves the full index invalid, the partial one
// valid under its build name: lookups by lock token keep a valid index.
// The next `up` drops the invalid one and finishes.
func TestV24InterruptedDropIsFinishedByTheNextUp(t *testing.T) {
	t.Parallel()
	port := v24Port(t)
	db := dbs.New(t, port.Version-1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn := db.Conn(t, migrate.SearchPath(db.Schema))
	v24Seed(t, conn, db)

	tx, err := db.Conn(t, "").Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT count(*) FROM "+db.Qualify("orchestrator_queue"))
	require.NoError(t, err)

	requireInterrupted(t, v24Up(ctx, t, db, port.Version))
	got := v24Indexes(t, conn, db)
	require.False(t, got["idx_orch_lock"].valid, "the interrupted drop left the full index invalid")
	require.Equal(t, v24Index{def: strings.Replace(v24Partial["idx_orch_lock"], "idx_orch_lock", "idx_orch_lock_0024_build", 1), valid: true,
		file: got["idx_orch_lock_0024_build"].file}, got["idx_orch_lock_0024_build"], "the partial index is valid under its build name")

	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, v24Up(ctx, t, db, port.Version))
	requireV24Indexes(t, conn, db, v24Partial, "after the next up")
}

// v24Locks lists the locks the backend pid holds or waits for on the
// relations of db's schema, each as "Mode on relation".
func v24Locks(ctx context.Context, t *testing.T, conn *pgx.Conn, db *testdb.Database, pid int) []string {
	t.Helper()
	rows, err := conn.Query(ctx, `SELECT l.mode || ' on ' || c.relname || CASE WHEN l.granted THEN '' ELSE ' (waiting)' END
		FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
		WHERE l.pid = $1 AND c.relnamespace = $2::regnamespace`, pid, db.Schema)
	require.NoError(t, err)
	locks, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return locks
}

// requireNoLockAWriterWaitsFor asserts that none of locks (v24Locks)
// conflicts with the ROW EXCLUSIVE a writer takes on a table and its
// indexes: a writer neither waits for one held nor queues behind one
// requested.
func requireNoLockAWriterWaitsFor(t *testing.T, locks []string) {
	t.Helper()
	for _, l := range locks {
		mode, _, _ := strings.Cut(l, " on ")
		require.Contains(t, []string{"AccessShareLock", "RowShareLock", "RowExclusiveLock", "ShareUpdateExclusiveLock"}, mode,
			"the migration takes %s, which a writer would wait for (all its locks: %v)", l, locks)
	}
}

// v24BlockedAt waits until the migration's backend (the one with
// application_name app) waits for a lock in the statement statement (a
// regular expression), and returns its pid. Whenever it finds the backend
// waiting, at that statement or another, it asserts that the backend
// takes no lock a writer would wait for. It fails when done reports
// first.
func v24BlockedAt(ctx context.Context, t *testing.T, conn *pgx.Conn, db *testdb.Database, app, statement string, done <-chan error) int {
	t.Helper()
	at := regexp.MustCompile(statement)
	for {
		var pid int
		var query string
		err := conn.QueryRow(ctx, `SELECT pid, query FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&pid, &query)
		if err == nil {
			requireNoLockAWriterWaitsFor(t, v24Locks(ctx, t, conn, db, pid))
			if at.MatchString(query) {
				return pid
			}
		} else {
			require.ErrorIs(t, err, pgx.ErrNoRows)
		}
		select {
		case err := <-done:
			t.Fatalf("the migration ended before it waited at %s: %v", statement, err)
		case <-ctx.Done():
			t.Fatalf("the migration never waited at %s", statement)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// requireNothingWaitsForIt asserts that the migration's backend, waiting,
// takes no lock a writer would wait for and holds SHARE UPDATE EXCLUSIVE
// on queue (the concurrent build's or drop's), and that a writer queues
// into each queue meanwhile.
func requireNothingWaitsForIt(ctx context.Context, t *testing.T, db *testdb.Database, pid int, queue string) {
	t.Helper()
	conn := db.Conn(t, "")
	locks := v24Locks(ctx, t, conn, db, pid)
	require.Contains(t, locks, "ShareUpdateExclusiveLock on "+queue, "the migration's locks: %v", locks)
	requireNoLockAWriterWaitsFor(t, locks)
	writer := db.Conn(t, "")
	_, err := writer.Exec(ctx, "SET lock_timeout = '10s'")
	require.NoError(t, err)
	_, err = writer.Exec(ctx, "INSERT INTO "+db.Qualify("orchestrator_queue")+` (instance_id, work_item, visible_at, created_at) VALUES ('meanwhile', '{}', now(), now())`)
	require.NoError(t, err, "a writer of orchestrator_queue queues a message while the migration waits")
	_, err = writer.Exec(ctx, "INSERT INTO "+db.Qualify("worker_queue")+` (work_item, visible_at, created_at, tag) VALUES ('{}', now(), now(), 'meanwhile')`)
	require.NoError(t, err, "a writer of worker_queue queues an item while the migration waits")
}

// No reader or writer of either queue waits for 0024, Up or Down: with a
// writer's transaction open on worker_queue and a reader's on
// orchestrator_queue, the migration (no lock timeout) waits for the writer
// at worker_queue's build and for the reader at orchestrator_queue's drop,
// as any concurrent build and drop must; at each wait it holds nothing a
// writer conflicts with, and writers of both queues go on. It finishes once
// both commit.
func TestV24WritersOfEitherQueueDoNotWaitForIt(t *testing.T) {
	t.Parallel()
	port := v24Port(t)
	for _, down := range []bool{false, true} {
		name := map[bool]string{false: "up", true: "down"}[down]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			from, to, want := port.Version-1, port.Version, v24Partial
			if down {
				from, to, want = port.Version, port.Version-1, v24Full
			}
			db := dbs.New(t, from)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			conn := db.Conn(t, migrate.SearchPath(db.Schema))
			v24Seed(t, conn, db)

			writer, err := db.Conn(t, "").Begin(ctx)
			require.NoError(t, err)
			_, err = writer.Exec(ctx, "INSERT INTO "+db.Qualify("worker_queue")+` (work_item, visible_at, created_at) VALUES ('{}', now(), now())`)
			require.NoError(t, err)
			reader, err := db.Conn(t, "").Begin(ctx)
			require.NoError(t, err)
			_, err = reader.Exec(ctx, "SELECT count(*) FROM "+db.Qualify("orchestrator_queue"))
			require.NoError(t, err)

			const app = "harness-0024-test"
			cfg := db.Source.Config().Copy()
			cfg.RuntimeParams["application_name"] = app
			r, err := migrate.Open(ctx, cfg, migrate.Options{Schema: db.Schema, LockTimeout: -1, LockRetries: -1})
			require.NoError(t, err)
			defer r.Close()
			done := make(chan error, 1)
			go func() {
				var err error
				if down {
					_, err = r.DownTo(ctx, to)
				} else {
					_, err = r.UpTo(ctx, to)
				}
				done <- err
			}()

			pid := v24BlockedAt(ctx, t, conn, db, app, `^CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_worker_queue_session_id_0024_build\s`, done)
			requireNothingWaitsForIt(ctx, t, db, pid, "worker_queue")
			require.NoError(t, writer.Commit(ctx))

			pid = v24BlockedAt(ctx, t, conn, db, app, `^DROP INDEX CONCURRENTLY IF EXISTS idx_orch_lock;`, done)
			requireNothingWaitsForIt(ctx, t, db, pid, "orchestrator_queue")
			require.NoError(t, reader.Commit(ctx))

			require.NoError(t, <-done)
			requireV24Indexes(t, conn, db, want, "after "+name)
			var meanwhile int
			require.NoError(t, conn.QueryRow(ctx, "SELECT (SELECT count(*) FROM orchestrator_queue WHERE instance_id = 'meanwhile') + (SELECT count(*) FROM worker_queue WHERE tag = 'meanwhile')").Scan(&meanwhile))
			require.Equal(t, 4, meanwhile, "the four writes made while it waited are in the queues")
		})
	}
}

// A database duroxide-pg's runner took to 23 already has the partial
// indexes: adopting it (baseline, then up through the port) rebuilds none
// of them (each keeps its file), and leaves nothing under a build name.
func TestV24RebuildsNothingOnADatabaseUpstreamTookTo23(t *testing.T) {
	t.Parallel()
	port := v24Port(t)
	db := dbs.RealProvider(t)
	ctx := context.Background()
	conn := db.Conn(t, migrate.SearchPath(db.Schema))
	v24Seed(t, conn, db)
	before := v24Indexes(t, conn, db)
	requireV24Indexes(t, conn, db, v24Partial, "made by duroxide-pg's runner")

	sqlDB := migrate.OpenDB(db.Source.Config(), db.Schema, "")
	defer sqlDB.Close()
	_, err := baseline.Run(ctx, sqlDB, baseline.Options{Schema: db.Schema})
	require.NoError(t, err)
	require.NoError(t, migrate.To(ctx, db.Source.Config(), db.Schema, port.Version))
	require.Equal(t, before, v24Indexes(t, conn, db), "no index rebuilt, renamed or added")
}

// Down refuses, changing nothing, while _duroxide_migrations records an
// upstream version above 23: its first statement is the guard, so no
// index is touched.
func TestV24DownRefusesOverALaterUpstreamVersionAndChangesNothing(t *testing.T) {
	t.Parallel()
	port := v24Port(t)
	db := dbs.New(t, port.Version)
	ctx := context.Background()
	conn := db.Conn(t, migrate.SearchPath(db.Schema))
	v24Seed(t, conn, db)
	_, err := conn.Exec(ctx, "INSERT INTO _duroxide_migrations (version, name) VALUES (24, '0024_something_later.sql')")
	require.NoError(t, err)
	before := v24Indexes(t, conn, db)

	r := db.Runner(t)
	_, err = r.DownTo(ctx, port.Version-1)
	requireRefused(t, err, "above 23")
	require.Equal(t, before, v24Indexes(t, conn, db), "nothing was changed")
	v, err := r.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, port.Version, v)
	var rows int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM _duroxide_migrations WHERE version IN (23, 24)").Scan(&rows))
	require.Equal(t, 2, rows)
}

// The Up's guard refuses a row 23 that names another file before any
// statement that changes something.
func TestV24UpRefusesAnotherFileAsVersion23AndChangesNothing(t *testing.T) {
	t.Parallel()
	port := v24Port(t)
	db := dbs.New(t, port.Version-1)
	ctx := context.Background()
	conn := db.Conn(t, migrate.SearchPath(db.Schema))
	_, err := conn.Exec(ctx, "INSERT INTO _duroxide_migrations (version, name) VALUES (23, '0023_something_else.sql')")
	require.NoError(t, err)
	before := v24Indexes(t, conn, db)
	err = migrate.To(ctx, db.Source.Config(), db.Schema, port.Version)
	requireRefused(t, err, "0023_something_else.sql")
	require.Equal(t, before, v24Indexes(t, conn, db), "nothing was changed")
}
