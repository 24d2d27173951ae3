// Package pgtest gives tests and the harness a throwaway PostgreSQL server,
// whatever the machine has: local server binaries (the default), an existing
// server reached by DSN, or a Docker container. Each caller gets its own
// uniquely named databases and everything it created is removed on Close.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/dbconn"
)

// Backend names a way of obtaining a PostgreSQL server.
type Backend string

// The backends. Auto picks the first that works: DSN when a DSN is given,
// else Local when server binaries are found, else Docker when a daemon
// answers.
const (
	Auto   Backend = "auto"
	Local  Backend = "local"
	DSN    Backend = "dsn"
	Docker Backend = "docker"
)

// ErrUnavailable marks a backend that cannot run on this machine (no
// binaries, no Docker daemon). Tests skip on it; commands report it.
var ErrUnavailable = errors.New("backend unavailable")

// Options choose and configure the backend. OptionsFromEnv fills them from
// the environment.
type Options struct {
	Backend Backend // HARNESS_BACKEND; empty means Auto
	DSN     string  // HARNESS_DSN: an existing server (never DATABASE_URL, see OptionsFromEnv)
	PGBin   string  // PG_BIN: directory holding initdb, postgres
	Image   string  // HARNESS_PG_IMAGE: Docker image (default postgres:16-alpine)
	// Preload are libraries a started server loads (shared_preload_libraries),
	// each where the server ships it (the local backend looks in its lib
	// directory and leaves out what is not there; Docker's images ship
	// contrib). An existing server (DSN) is taken as it is.
	Preload []string
	// Settings are server parameters ("name=value") a started server gets
	// after the backend's own (so they override them): a test that needs
	// PostgreSQL's defaults passes "max_connections=100" and
	// "max_locks_per_transaction=64". An existing server (DSN) is taken as
	// it is.
	Settings []string
	// ClockOffset, when not zero, runs a started server's clock this far
	// from the real one (a whole number of seconds; positive: ahead), with
	// libfaketime preloaded into the postmaster and so its backends
	// (FaketimeEnv): a database clock that disagrees with its callers'.
	// Only the local backend starts such a server: Start fails with
	// ErrNoFaketime without libfaketime, and refuses an existing server
	// (DSN) or Docker.
	ClockOffset time.Duration
	// Logf receives progress messages; nil discards them.
	Logf func(format string, args ...any)
}

// DefaultLockCapacity are Options.Settings that give a started server
// PostgreSQL's defaults for the settings that size the shared lock table
// (max_locks_per_transaction x max_connections entries): what a bulk
// transaction meets on a server nobody tuned.
func DefaultLockCapacity() []string {
	return []string{"max_connections=100", "max_locks_per_transaction=64", "max_prepared_transactions=0"}
}

// OptionsFromEnv reads HARNESS_BACKEND, HARNESS_DSN, PG_BIN and
// HARNESS_PG_IMAGE. It does not read DATABASE_URL: that usually names the
// application's own database (duroxide-pg's and duroxide-node's tests use
// it), and throwaway work must run on a server only when it was named for
// that.
func OptionsFromEnv() Options {
	dsn := os.Getenv("HARNESS_DSN")
	return Options{
		Backend: Backend(os.Getenv("HARNESS_BACKEND")),
		DSN:     dsn,
		PGBin:   os.Getenv("PG_BIN"),
		Image:   os.Getenv("HARNESS_PG_IMAGE"),
	}
}

// instance is what a backend provides: a server to connect to, and how to
// get rid of it.
type instance interface {
	// adminConfig is a connection to a maintenance database of the server
	// with the right to create databases.
	adminConfig() *pgx.ConnConfig
	// close stops the server if the backend owns it.
	close(ctx context.Context) error
}

// Server is a running PostgreSQL reachable by the harness.
type Server struct {
	backend Backend
	inst    instance

	mu      sync.Mutex
	created []string // databases this Server created, dropped on Close
}

// Start obtains a server with the chosen backend.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	backend := opts.Backend
	if backend == "" {
		backend = Auto
	}
	if opts.ClockOffset != 0 && (backend == DSN || backend == Docker || (backend == Auto && opts.DSN != "")) {
		return nil, fmt.Errorf("a server whose clock is %s off needs the local backend: it starts the server with libfaketime (the %s backend cannot)", opts.ClockOffset, backend)
	}
	switch backend {
	case Local:
		return wrap(Local)(startLocal(ctx, opts))
	case DSN:
		if opts.DSN == "" {
			return nil, errors.New("HARNESS_BACKEND=dsn needs HARNESS_DSN to name a server (DATABASE_URL is not read: throwaway work runs only on a server named for it)")
		}
		return wrap(DSN)(openDSN(ctx, opts.DSN))
	case Docker:
		return wrap(Docker)(startDocker(ctx, opts))
	case Auto:
		if opts.DSN != "" {
			return wrap(DSN)(openDSN(ctx, opts.DSN))
		}
		srv, errLocal := wrap(Local)(startLocal(ctx, opts))
		if errLocal == nil || !errors.Is(errLocal, ErrUnavailable) {
			return srv, errLocal
		}
		srv, errDocker := wrap(Docker)(startDocker(ctx, opts))
		if errDocker == nil || !errors.Is(errDocker, ErrUnavailable) {
			return srv, errDocker
		}
		return nil, fmt.Errorf("no PostgreSQL available: %w\n"+
			"  get one of: (1) local server binaries (apt-get install postgresql, or set PG_BIN to their directory),\n"+
			"  (2) an existing server: HARNESS_DSN=postgres://user@host:5432/postgres,\n"+
			"  (3) a Docker daemon (HARNESS_BACKEND=docker)\n  local: %v\n  docker: %v",
			ErrUnavailable, errLocal, errDocker)
	default:
		return nil, fmt.Errorf("unknown backend %q: use auto, local, dsn or docker", backend)
	}
}

func wrap(b Backend) func(instance, error) (*Server, error) {
	return func(inst instance, err error) (*Server, error) {
		if err != nil {
			return nil, fmt.Errorf("%s backend: %w", b, err)
		}
		return &Server{backend: b, inst: inst}, nil
	}
}

// Backend reports which backend provided the server.
func (s *Server) Backend() Backend { return s.backend }

// ConnConfig returns a connection configuration for database name.
func (s *Server) ConnConfig(name string) *pgx.ConnConfig {
	cfg := s.inst.adminConfig().Copy()
	cfg.Database = name
	return cfg
}

// Source opens connections to database name.
func (s *Server) Source(name string) (*dbconn.Source, error) { return dbconn.Parse(s.DSN(name)) }

// DSN returns a URL for database name, password included (never print it;
// use Redact).
func (s *Server) DSN(name string) string {
	cfg := s.ConnConfig(name)
	u := url.URL{
		Scheme: "postgres",
		Host:   fmt.Sprintf("%s:%d", cfg.Host, cfg.Port),
		Path:   "/" + name,
	}
	if cfg.Password != "" {
		u.User = url.UserPassword(cfg.User, cfg.Password)
	} else {
		u.User = url.User(cfg.User)
	}
	q := url.Values{}
	q.Set("sslmode", "disable")
	if cfg.TLSConfig != nil {
		q.Set("sslmode", "require")
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// CreateDatabase creates a new database with a unique name starting with
// prefix, from template when template is not empty, and returns its name.
// Close drops it unless Forget is called first.
func (s *Server) CreateDatabase(ctx context.Context, prefix, template string) (string, error) {
	name := UniqueName(prefix)
	stmt := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		stmt += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	if err := s.admin(ctx, stmt); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	s.mu.Lock()
	s.created = append(s.created, name)
	s.mu.Unlock()
	return name, nil
}

// DropDatabase drops a database this Server created, closing any sessions
// still connected to it.
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	if err := s.admin(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	s.Forget(name)
	return nil
}

// Forget removes name from the databases Close drops (to keep a failed
// test's database for inspection).
func (s *Server) Forget(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, n := range s.created {
		if n == name {
			s.created = append(s.created[:i], s.created[i+1:]...)
			return
		}
	}
}

// Close drops every database this Server created and stops the server when
// the backend owns it.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	names := append([]string(nil), s.created...)
	s.mu.Unlock()
	var errs []error
	if s.backend == DSN {
		// Templates are created last and must be dropped after their clones.
		for i := len(names) - 1; i >= 0; i-- {
			if err := s.DropDatabase(ctx, names[i]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := s.inst.close(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (s *Server) admin(ctx context.Context, stmt string) error {
	conn, err := pgx.ConnectConfig(ctx, s.inst.adminConfig())
	if err != nil {
		return fmt.Errorf("connect to %s: %w", dbconn.Redact(s.DSN(s.inst.adminConfig().Database)), err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, stmt)
	return err
}

// UniqueName returns prefix followed by 12 random hex digits.
func UniqueName(prefix string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return prefix + hex.EncodeToString(b[:])
}

// Restart stops the server with a fast shutdown and starts it again on the
// same address, as an operator's restart would. Only the local backend owns
// its server; the others return an error.
func (s *Server) Restart(ctx context.Context) error {
	ls, ok := s.inst.(*localServer)
	if !ok {
		return fmt.Errorf("restart: the %s backend does not own its server", s.backend)
	}
	return ls.restart(ctx)
}

// RequireServer starts the environment's server (OptionsFromEnv) for the
// test and closes it when the test ends. Where no backend can run the test
// skips, saying why.
func RequireServer(t testing.TB) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := Start(ctx, OptionsFromEnv())
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("no PostgreSQL here: %v", err)
	}
	if err != nil {
		t.Fatalf("start a server: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	return srv
}
