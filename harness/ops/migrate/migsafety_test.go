package migrate_test

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
)

// Four runners started at once on one empty database: all succeed and
// every migration is applied exactly once.
func TestConcurrentMigrateUp(t *testing.T) {
	t.Parallel()
	db := dbs.New(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const runners = 4
	errs := make([]error, runners)
	applied := make([]int, runners)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := migrate.Open(ctx, db.Source.Config(), migrate.Options{Schema: db.Schema})
			if err != nil {
				errs[i] = err
				return
			}
			defer r.Close()
			res, err := r.Up(ctx)
			errs[i], applied[i] = err, len(res)
		}()
	}
	close(start)
	wg.Wait()
	total := 0
	for i, err := range errs {
		if err != nil {
			t.Errorf("runner %d: %v", i+1, err)
		}
		total += applied[i]
	}
	if total != int(latest) {
		t.Errorf("runners applied %v migrations in all (%d), want %d", applied, total, latest)
	}
	conn := db.Conn(t, "")
	var rows, distinct int
	var maxV int64
	if err := conn.QueryRow(ctx, "SELECT count(*)::int, count(DISTINCT version_id)::int, max(version_id) FROM "+
		db.Qualify(migrate.VersionTable)+" WHERE version_id > 0").Scan(&rows, &distinct, &maxV); err != nil {
		t.Fatal(err)
	}
	if rows != int(latest) || distinct != int(latest) || maxV != latest {
		t.Errorf("goose_db_version: %d rows, %d distinct versions, max %d; want one row per version 1..%d", rows, distinct, maxV, latest)
	}
	t.Logf("4 concurrent runners: applied %v (total %d), goose_db_version has %d rows for %d versions", applied, total, rows, distinct)
}

// A migration that fails half-way leaves the database at the previous
// version, its first statement rolled back, with an error naming the file.
func TestBrokenMigrationRollsBack(t *testing.T) {
	t.Parallel()
	db := dbs.New(t, latest)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mfs := fstest.MapFS{}
	entries, err := fs.ReadDir(migrations.FS, ".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := fs.ReadFile(migrations.FS, e.Name())
		if err != nil {
			t.Fatal(err)
		}
		mfs[e.Name()] = &fstest.MapFile{Data: b}
	}
	broken := "9999_broken_half_way.sql"
	mfs[broken] = &fstest.MapFile{Data: []byte("-- +goose Up\nCREATE TABLE half_way (x int);\nSELECT 1/0;\n\n-- +goose Down\nDROP TABLE half_way;\n")}
	r, err := migrate.Open(ctx, db.Source.Config(), migrate.Options{Schema: db.Schema, FS: mfs})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, upErr := r.Up(ctx)
	if upErr == nil {
		t.Fatal("the broken migration succeeded")
	}
	msg := upErr.Error()
	for _, want := range []string{broken, "rolled back", "previous version", "division by zero"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	var run *migrate.RunError
	if !errors.As(upErr, &run) || run.Failed.Path != broken || len(run.Done) != 0 || run.Version != latest || run.Down || run.PartWay {
		t.Errorf("the run's error: %+v; want a RunError at %s, nothing applied before it, the schema at %d", run, broken, latest)
	}
	v, err := r.Version(ctx)
	if err != nil || v != latest {
		t.Errorf("version after the failure: %d, %v; want %d", v, err, latest)
	}
	conn := db.Conn(t, "")
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{db.Schema, "half_way"}.Sanitize()).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Error("the broken migration's first statement was not rolled back")
	}
	t.Logf("broken migration: %v", upErr)
}
