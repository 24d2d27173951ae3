package migrations_test

// 0027 runs outside a transaction, in steps (its header). These tests
// interrupt it and check that the schema keeps the old fetch and that the
// next `up` finishes the work: an index an interrupted concurrent build
// left invalid is dropped and built again.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// queueSomeMessages queues n messages over instances i0..i(n/2-1), two each.
func queueSomeMessages(t *testing.T, conn *pgx.Conn, db *testdb.Database, n int) {
	t.Helper()
	_, err := conn.Exec(context.Background(), fmt.Sprintf(`INSERT INTO %s (instance_id, work_item, visible_at, created_at)
		SELECT 'i' || (g / 2), '{}', now() - interval '1 minute' + g * interval '1 ms', now() FROM generate_series(0, %d) g`,
		db.Qualify("orchestrator_queue"), n-1))
	require.NoError(t, err)
}

// instanceHeadIndex reports whether idx_orch_instance_head exists, is
// valid, and is the plain (instance_id, visible_at, id) index, and how many
// other indexes of that name's family (the renamed invalid one) remain.
func instanceHeadIndex(t *testing.T, conn *pgx.Conn, db *testdb.Database) (def string, valid bool, leftovers int) {
	t.Helper()
	ctx := context.Background()
	err := conn.QueryRow(ctx, `SELECT pg_get_indexdef(i.indexrelid), i.indisvalid
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE c.relnamespace = $1::regnamespace AND c.relname = 'idx_orch_instance_head'`, db.Schema).Scan(&def, &valid)
	if errors.Is(err, pgx.ErrNoRows) {
		def, valid = "", false
	} else {
		require.NoError(t, err)
	}
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_class
		WHERE relnamespace = $1::regnamespace AND relname = 'idx_orch_instance_head_invalid'`, db.Schema).Scan(&leftovers))
	return def, valid, leftovers
}

// headlessMessages counts queued messages whose instance has no head at or
// before them.
func headlessMessages(t *testing.T, conn *pgx.Conn, db *testdb.Database) int {
	t.Helper()
	var n int
	require.NoError(t, conn.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*) FROM %[1]s q
		WHERE NOT EXISTS (SELECT 1 FROM %[2]s h WHERE h.instance_id = q.instance_id AND (h.visible_at, h.id) <= (q.visible_at, q.id))`,
		db.Qualify("orchestrator_queue"), db.Qualify("orchestrator_queue_heads"))).Scan(&n))
	return n
}

func fetchText(t *testing.T, conn *pgx.Conn, db *testdb.Database) string {
	t.Helper()
	var src string
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT md5(prosrc) FROM pg_proc
		WHERE pronamespace = $1::regnamespace AND proname = 'fetch_orchestration_item'`, db.Schema).Scan(&src))
	return src
}

// An index build interrupted by the lock timeout (a writer's transaction
// stays open past it) fails the migration: goose does not record it and
// the old fetch stays. Once the writer commits, the next `up` drops the
// invalid index the build left, builds it again, and finishes: every
// message has its head, the writer's included, and the fetch is the fix.
func TestV27InterruptedBuildIsFinishedByTheNextUp(t *testing.T) {
	t.Parallel()
	before, fix := scaleFix(t)
	db := dbs.New(t, before)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn := db.Conn(t, "")
	queueSomeMessages(t, conn, db, 200)
	oldFetch := fetchText(t, conn, db)

	writer := db.Conn(t, "")
	tx, err := writer.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO "+db.Qualify("orchestrator_queue")+
		` (instance_id, work_item, visible_at, created_at) VALUES ('writer', '{}', now() - interval '1 hour', now())`)
	require.NoError(t, err)

	r, err := migrate.Open(ctx, db.Source.Config(), migrate.Options{Schema: db.Schema, LockTimeout: 200 * time.Millisecond, LockRetries: -1})
	require.NoError(t, err)
	defer r.Close()
	_, upErr := r.UpTo(ctx, fix)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(upErr, &pgErr) && pgErr.Code == "55P03", "up with a writer's transaction open: %v; want lock_not_available", upErr)
	require.Contains(t, upErr.Error(), "failed part-way", "the error says the finished steps stay")
	v, err := r.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, before, v, "goose did not record the interrupted migration")
	require.Equal(t, oldFetch, fetchText(t, conn, db), "the old fetch stays until the last step")
	_, valid, _ := instanceHeadIndex(t, conn, db)
	require.False(t, valid, "the interrupted build left its index invalid")

	require.NoError(t, tx.Commit(ctx))
	_, err = r.UpTo(ctx, fix)
	require.NoError(t, err)
	def, valid, leftovers := instanceHeadIndex(t, conn, db)
	require.True(t, valid, "the next up built the index again: %s", def)
	require.Contains(t, def, "(instance_id, visible_at, id)")
	require.Zero(t, leftovers, "the invalid index was dropped")
	require.Zero(t, headlessMessages(t, conn, db))
	require.NotEqual(t, oldFetch, fetchText(t, conn, db), "the fix is installed")

	var instance string
	require.NoError(t, conn.QueryRow(ctx, "SELECT out_instance_id FROM "+db.Qualify("fetch_orchestration_item")+
		"((extract(epoch FROM clock_timestamp()) * 1000)::bigint, 30000)").Scan(&instance))
	require.Equal(t, "writer", instance, "the fix fetches the oldest instance, the one queued while the index was built")
}

// An invalid index of the fix's name (a concurrent build cancelled before
// this pack ran, here a unique one that failed) is not taken for the
// index: the Up drops it and builds the right one.
func TestV27RebuildsAnInvalidIndexOfItsName(t *testing.T) {
	t.Parallel()
	before, _ := scaleFix(t)
	db := dbs.New(t, before)
	ctx := context.Background()
	conn := db.Conn(t, "")
	queueSomeMessages(t, conn, db, 100)
	_, err := conn.Exec(ctx, "CREATE UNIQUE INDEX CONCURRENTLY idx_orch_instance_head ON "+db.Qualify("orchestrator_queue")+" (instance_id)")
	require.Error(t, err, "two messages per instance: the unique build fails")
	_, valid, _ := instanceHeadIndex(t, conn, db)
	require.False(t, valid)

	require.NoError(t, migrate.To(ctx, db.Source.Config(), db.Schema, migrations.Latest()))
	def, valid, leftovers := instanceHeadIndex(t, conn, db)
	require.True(t, valid)
	require.NotContains(t, def, "UNIQUE")
	require.Contains(t, def, "(instance_id, visible_at, id)")
	require.Zero(t, leftovers)
	require.Zero(t, headlessMessages(t, conn, db))
}

// A writer of the queue does not wait for 0027 while it waits for another
// writer: with one writer's transaction open, the Up's index build waits
// for it (as any build must) without queueing a table lock that writers
// would queue behind, so a second writer, bounded by a 2 s lock_timeout,
// queues its message meanwhile. The Up finishes once the first commits,
// with a head for both messages.
func TestV27IndexBuildDoesNotHoldWritersBehindIt(t *testing.T) {
	t.Parallel()
	before, fix := scaleFix(t)
	db := dbs.New(t, before)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn := db.Conn(t, "")
	queueSomeMessages(t, conn, db, 100)
	insert := "INSERT INTO " + db.Qualify("orchestrator_queue") + ` (instance_id, work_item, visible_at, created_at) VALUES ($1, '{}', now() - interval '1 hour', now())`

	first := db.Conn(t, "")
	tx, err := first.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, insert, "first")
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- migrate.To(ctx, db.Source.Config(), db.Schema, fix) }()
	// Wait until the migration waits on the open transaction.
	for {
		var waiting bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid())`).Scan(&waiting))
		if waiting {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the migration ended while a writer's transaction was open: %v", err)
		case <-ctx.Done():
			t.Fatal("the migration never waited for the open writer")
		case <-time.After(20 * time.Millisecond):
		}
	}
	second := db.Conn(t, "")
	_, err = second.Exec(ctx, "SET lock_timeout = '2s'")
	require.NoError(t, err)
	_, err = second.Exec(ctx, insert, "second")
	require.NoError(t, err, "a writer queues a message while the migration waits")

	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done)
	require.Zero(t, headlessMessages(t, conn, db))
	var heads int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM "+db.Qualify("orchestrator_queue_heads")+" WHERE instance_id IN ('first', 'second')").Scan(&heads))
	require.Equal(t, 2, heads)
}
