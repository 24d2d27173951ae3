package migrate_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// queueLockingFix is the pack's last fix whose Up locks the orchestrator
// queue (LOCK TABLE orchestrator_queue IN EXCLUSIVE MODE), which waits for
// every open transaction that wrote the queue.
func queueLockingFix(t *testing.T) migrations.Migration {
	t.Helper()
	var last *migrations.Migration
	for _, m := range migrations.Fixes() {
		if strings.Contains(m.Up, "LOCK TABLE orchestrator_queue IN EXCLUSIVE MODE") {
			last = &m
		}
	}
	if last == nil {
		t.Fatal("no fix of the pack locks the orchestrator queue")
	}
	return *last
}

// A migration that waits for a lock longer than the lock timeout is rolled
// back and retried, each retry logged; once the retries are spent, Up
// fails with lock_not_available and the schema stays where it was.
func TestMigrationGivesUpOnALockAfterItsRetries(t *testing.T) {
	t.Parallel()
	fix := queueLockingFix(t)
	db := dbs.New(t, fix.Version-1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	holder := holdQueueWriteLock(t, ctx, db)
	defer holder.Rollback(ctx)

	var log strings.Builder
	r, err := migrate.Open(ctx, db.Source.Config(), migrate.Options{Schema: db.Schema, LockTimeout: 100 * time.Millisecond, LockRetries: 2, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, upErr := r.UpTo(ctx, fix.Version)
	var pgErr *pgconn.PgError
	if !errors.As(upErr, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("Up with the queue's lock held: %v; want lock_not_available (55P03)", upErr)
	}
	for _, want := range []string{"retry 1 of 2", "retry 2 of 2", fix.File} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the retries' log lacks %q:\n%s", want, log.String())
		}
	}
	if strings.Contains(log.String(), "retry 3") {
		t.Errorf("more retries than asked for:\n%s", log.String())
	}
	if !strings.Contains(upErr.Error(), "3 time(s)") {
		t.Errorf("the error does not say how often the migration waited: %v", upErr)
	}
	if v := version(t, ctx, r); v != fix.Version-1 {
		t.Errorf("after the failed Up the schema is at %d, want %d", v, fix.Version-1)
	}
}

// The lock is released while the migration waits for its first retry: the
// retry applies it.
func TestMigrationRetriedAfterALockTimeoutSucceeds(t *testing.T) {
	t.Parallel()
	fix := queueLockingFix(t)
	db := dbs.New(t, fix.Version-1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	holder := holdQueueWriteLock(t, ctx, db)
	defer holder.Rollback(ctx)

	log := &releaseOnWrite{release: func() { holder.Rollback(ctx) }}
	r, err := migrate.Open(ctx, db.Source.Config(), migrate.Options{Schema: db.Schema, LockTimeout: 100 * time.Millisecond, LockRetries: 3, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	res, err := r.UpTo(ctx, fix.Version)
	if err != nil {
		t.Fatalf("Up after the lock was released: %v (log: %s)", err, log.String())
	}
	if len(res) != 1 || res[0].Source.Version != fix.Version {
		t.Errorf("applied %d migrations, want only %d", len(res), fix.Version)
	}
	if !strings.Contains(log.String(), "retry 1 of 3") || strings.Contains(log.String(), "retry 2") {
		t.Errorf("want exactly one retry logged, got:\n%s", log.String())
	}
	if v := version(t, ctx, r); v != fix.Version {
		t.Errorf("schema at %d, want %d", v, fix.Version)
	}
}

// holdQueueWriteLock opens a transaction that has queued a message and
// keeps it open: it holds ROW EXCLUSIVE on the orchestrator queue, as a
// writer does.
func holdQueueWriteLock(t *testing.T, ctx context.Context, db *testdb.Database) pgx.Tx {
	t.Helper()
	tx, err := db.Conn(t, "").Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+db.Qualify("orchestrator_queue")+
		` (instance_id, work_item, visible_at, created_at) VALUES ('holder', '{}', now(), now())`); err != nil {
		t.Fatal(err)
	}
	return tx
}

// releaseOnWrite is a log that runs release when the first line arrives.
type releaseOnWrite struct {
	mu      sync.Mutex
	buf     strings.Builder
	release func()
	once    sync.Once
}

func (w *releaseOnWrite) Write(p []byte) (int, error) {
	w.once.Do(w.release)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *releaseOnWrite) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func version(t *testing.T, ctx context.Context, r *migrate.Runner) int64 {
	t.Helper()
	v, err := r.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
