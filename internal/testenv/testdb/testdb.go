// Package testdb hands each test its own database at a chosen migration
// version, cloned in tens of milliseconds from a template database that was
// migrated once per version (the pgtestdb approach), so tests can run in
// parallel without sharing state.
package testdb

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
)

// Latest asks for a database with every migration of the pack applied.
const Latest int64 = -1

// Pool creates test databases on one server.
type Pool struct {
	srv    *pgtest.Server
	schema string

	mu        sync.Mutex
	templates map[int64]*template
	states    map[string]*template
}

type template struct {
	once sync.Once
	name string
	err  error
	done bool // guarded by Pool.mu
}

// NewPool prepares databases on srv whose migrations go into schema.
func NewPool(srv *pgtest.Server, schema string) *Pool {
	if schema == "" {
		schema = migrate.DefaultSchema
	}
	return &Pool{srv: srv, schema: schema, templates: map[int64]*template{}, states: map[string]*template{}}
}

// Server is the server the databases live on.
func (p *Pool) Server() *pgtest.Server { return p.srv }

// Schema is the target schema of every database.
func (p *Pool) Schema() string { return p.schema }

// Database is one test's database.
type Database struct {
	Name   string
	Schema string
	// DSN connects with the server's default search_path: call functions
	// schema-qualified, as duroxide-pg does. Source is the same, parsed:
	// what the simulators and the migration runner take.
	DSN    string
	Source *dbconn.Source
	srv    *pgtest.Server
}

// Template returns the name of a database migrated to version (Latest for
// all), creating it on first use.
func (p *Pool) Template(ctx context.Context, version int64) (string, error) {
	tpl := entry(p, p.templates, version)
	tpl.once.Do(func() {
		tpl.name, tpl.err = p.buildTemplate(ctx, version)
		p.mu.Lock()
		tpl.done = true
		p.mu.Unlock()
	})
	return tpl.name, tpl.err
}

// entry returns m's template of key, adding an empty one on first use.
func entry[K comparable](p *Pool, m map[K]*template, key K) *template {
	p.mu.Lock()
	defer p.mu.Unlock()
	tpl, ok := m[key]
	if !ok {
		tpl = &template{}
		m[key] = tpl
	}
	return tpl
}

// nearestBelow returns the newest finished template older than version, so
// that building a template only applies the migrations in between.
func (p *Pool) nearestBelow(version int64) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	best, name := int64(0), ""
	for v, tpl := range p.templates {
		if tpl.done && tpl.err == nil && v > best && (version == Latest || v < version) {
			best, name = v, tpl.name
		}
	}
	return name
}

func (p *Pool) buildTemplate(ctx context.Context, version int64) (string, error) {
	db, err := p.clone(ctx, fmt.Sprintf("harness_tmpl_v%d_", max(version, 0)), p.nearestBelow(version))
	if err != nil {
		return "", err
	}
	r, err := migrate.Open(ctx, db.Source.Config(), migrate.Options{Schema: p.schema})
	if err != nil {
		return "", err
	}
	defer r.Close()
	if version == Latest {
		_, err = r.Up(ctx)
	} else if version > 0 {
		_, err = r.UpTo(ctx, version)
	}
	if err != nil {
		return "", fmt.Errorf("template at version %d: %w", version, err)
	}
	return db.Name, nil
}

// clone creates a database named prefix… from template ("" for an empty
// one), retrying while the template is briefly in use by another clone
// (55006). It is the one way this package makes a database.
func (p *Pool) clone(ctx context.Context, prefix, template string) (*Database, error) {
	for attempt := 0; ; attempt++ {
		name, err := p.srv.CreateDatabase(ctx, prefix, template)
		if err == nil {
			src, err := p.srv.Source(name)
			if err != nil {
				return nil, err
			}
			return &Database{Name: name, Schema: p.schema, DSN: src.DSN(), Source: src, srv: p.srv}, nil
		}
		if template == "" || attempt == 20 || ctx.Err() != nil {
			return nil, err
		}
		time.Sleep(time.Duration(10*(attempt+1)) * time.Millisecond)
	}
}

// Create makes a fresh database at version, for callers that cannot fail
// a test from where they are (a goroutine). The caller drops it.
func (p *Pool) Create(ctx context.Context, version int64) (*Database, error) {
	tpl, err := p.Template(ctx, version)
	if err != nil {
		return nil, err
	}
	return p.clone(ctx, "harness_test_", tpl)
}

// NewState makes a fresh database in a start state for t (dropped like
// New's). The state's template is built once per key: a database at pack
// version from, handed to build.
func (p *Pool) NewState(t testing.TB, key string, from int64, build func(ctx context.Context, db *Database) error) *Database {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tpl := entry(p, p.states, key)
	tpl.once.Do(func() {
		base, err := p.Template(ctx, from)
		if err != nil {
			tpl.err = err
			return
		}
		db, err := p.clone(ctx, "harness_state_", base)
		if err != nil {
			tpl.err = err
			return
		}
		tpl.name = db.Name
		if err := build(ctx, db); err != nil {
			tpl.err = fmt.Errorf("start state %s: %w", key, err)
		}
	})
	if tpl.err != nil {
		t.Fatalf("%v", tpl.err)
	}
	return p.adopt(t, tpl.name)
}

// New makes a fresh database at version for t. It is dropped when t passes;
// when t fails it is kept and its DSN logged, for inspection.
func (p *Pool) New(t testing.TB, version int64) *Database {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tpl, err := p.Template(ctx, version)
	if err != nil {
		t.Fatalf("test database at version %d: %v", version, err)
	}
	return p.adopt(t, tpl)
}

// adopt clones template for t: dropped when t passes; when t fails it is
// kept and its DSN logged, for inspection.
func (p *Pool) adopt(t testing.TB, template string) *Database {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := p.clone(ctx, "harness_test_", template)
	if err != nil {
		t.Fatalf("test database from %s: %v", template, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if p.srv.Backend() == pgtest.Local {
				t.Logf("test database %s is left as it was until the throwaway server stops; to keep it, run against your own server with HARNESS_DSN", db.Name)
				return
			}
			p.srv.Forget(db.Name)
			t.Logf("kept database %s for inspection: %s", db.Name, dbconn.Redact(db.DSN))
			return
		}
		if err := db.Drop(context.Background()); err != nil {
			t.Errorf("drop %s: %v", db.Name, err)
		}
	})
	return db
}

// Drop removes the database.
func (d *Database) Drop(ctx context.Context) error { return d.srv.DropDatabase(ctx, d.Name) }

// Runner opens a migration runner on the database (closed with t).
func (d *Database) Runner(t testing.TB) *migrate.Runner {
	t.Helper()
	r, err := migrate.Open(context.Background(), d.Source.Config(), migrate.Options{Schema: d.Schema})
	if err != nil {
		t.Fatalf("migration runner: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// PgxPool opens a pgx pool on the database (closed with t). Its sessions
// have an empty search_path, so any SQL that is not schema-qualified fails
// loudly, and the functions are proved to find their own tables.
func (d *Database) PgxPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(d.DSN)
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Conn opens a single connection (closed with t) with the given
// search_path ("" for an empty one).
func (d *Database) Conn(t testing.TB, searchPath string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(d.DSN)
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	cfg.RuntimeParams["search_path"] = searchPath
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// Qualify returns schema.name, quoted, for use in SQL text.
func (d *Database) Qualify(name string) string {
	return pgx.Identifier{d.Schema, name}.Sanitize()
}

// RunTests is the body of a test binary's TestMain: it starts one throwaway
// server (HARNESS_BACKEND and friends choose it), hands it to setup, runs the
// tests and stops the server, returning the exit code. With no server to be
// had it reports why and fails: the default path must run.
//
//	func TestMain(m *testing.M) {
//		os.Exit(testdb.RunTests(m, func(srv *pgtest.Server) { dbs = testdb.NewPool(srv, "duroxide") }))
//	}
func RunTests(m *testing.M, setup func(*pgtest.Server)) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	srv, err := pgtest.Start(ctx, pgtest.OptionsFromEnv())
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "no PostgreSQL server for the tests: %v\n", err)
		return 1
	}
	defer func() {
		if err := srv.Close(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "stop the test server: %v\n", err)
		}
	}()
	setup(srv)
	return m.Run()
}

// MustSource parses dsn for a test, failing it when dsn does not parse.
func MustSource(t testing.TB, dsn string) *dbconn.Source {
	t.Helper()
	src, err := dbconn.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return src
}
