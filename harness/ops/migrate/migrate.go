// Package migrate applies the pack's embedded goose migrations to one target
// schema of a database: the schema is created when missing, the
// connection's search_path is set to it (so goose's version table and every
// object land there), and a Postgres session lock keeps concurrent runners
// from applying the same migration twice.
package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/restore"
)

// DefaultSchema is the schema migrations go into unless told otherwise.
const DefaultSchema = "duroxide"

// VersionTable is goose's bookkeeping table, inside the target schema.
const VersionTable = "goose_db_version"

// Runner applies migrations to one schema.
type Runner struct {
	db          *sql.DB
	provider    *goose.Provider
	fsys        fs.FS
	schema      string
	lockRetries int
	log         io.Writer
	restored    []restore.Function
}

// DefaultLockTimeout is how long a migration waits for a lock before it
// fails and is rolled back (lock_timeout on the runner's connections).
// While a migration waits for a lock on a table, every writer of the
// table queues behind it: failing fast and retrying keeps the wait short.
const DefaultLockTimeout = 5 * time.Second

// DefaultLockRetries is how many times Up, UpTo, Down and DownTo run a
// migration again after it failed on the lock timeout.
const DefaultLockRetries = 3

// Options tune a Runner.
type Options struct {
	// Schema is the target schema (DefaultSchema when empty).
	Schema string
	// FS holds the migrations (the embedded pack when nil).
	FS fs.FS
	// VersionTable is goose's table inside the schema (VersionTable when
	// empty).
	VersionTable string
	// Verbose makes goose log each migration it applies.
	Verbose bool
	// Role, when not empty, is the role the migrations run as (SET ROLE on
	// every connection): the owner of the schema's objects.
	Role string
	// LockTimeout bounds each wait for a lock (DefaultLockTimeout when 0;
	// negative: no bound, as the server's lock_timeout says).
	LockTimeout time.Duration
	// LockRetries is how many times a migration that failed on the lock
	// timeout runs again (DefaultLockRetries when 0; negative: never).
	LockRetries int
	// Log receives a line for each retry (nil: discarded).
	Log io.Writer
}

// withDefaults fills what the caller left empty, once.
func (o Options) withDefaults() Options {
	o.Schema, o.VersionTable = Names(o.Schema, o.VersionTable)
	if o.FS == nil {
		o.FS = migrations.FS
	}
	if o.LockTimeout == 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	switch {
	case o.LockRetries == 0:
		o.LockRetries = DefaultLockRetries
	case o.LockRetries < 0:
		o.LockRetries = 0
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	return o
}

// ErrNoSuchVersion is returned for a target version the pack does not have.
var ErrNoSuchVersion = errors.New("no such migration version")

// ErrNeedsBaseline is returned by Open for a schema that duroxide-pg's own
// runner created (it has _duroxide_migrations) and goose has never seen (no
// version table): goose would try to create every table again. Open
// refuses before changing anything.
var ErrNeedsBaseline = errors.New("schema was created by duroxide-pg's own runner and is not adopted")

// Open opens the runner's pool on the database of cfg (OpenDB) and
// prepares a goose provider over the pack's migrations; it refuses names
// CheckName refuses before it connects. The target schema is created, if
// it does not exist, by the first call that needs it, once its arguments
// are checked: a refused call leaves no schema behind. Close closes the
// pool.
func Open(ctx context.Context, cfg *pgx.ConnConfig, opts Options) (*Runner, error) {
	opts = opts.withDefaults()
	if err := opts.checkNames(); err != nil {
		return nil, err
	}
	if opts.LockTimeout > 0 {
		cfg = cfg.Copy()
		cfg.RuntimeParams["lock_timeout"] = strconv.FormatInt(max(opts.LockTimeout.Milliseconds(), 1), 10)
	}
	db, err := openDirect(ctx, cfg, opts.Schema, opts.Role)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			db.Close()
		}
	}()
	if _, err := CheckAdopted(ctx, db, opts.Schema, opts.VersionTable); err != nil {
		return nil, err
	}
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(LockID(opts.Schema)),
		// Wait up to 5 minutes (300 x 1 s) for another runner to finish.
		lock.WithLockTimeout(1, 300),
	)
	if err != nil {
		return nil, fmt.Errorf("session locker: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, opts.FS,
		goose.WithSessionLocker(locker),
		goose.WithTableName(opts.VersionTable),
		goose.WithVerbose(opts.Verbose),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return nil, fmt.Errorf("goose provider: %w", err)
	}
	ok = true
	return &Runner{db: db, provider: provider, fsys: opts.FS, schema: opts.Schema, lockRetries: opts.LockRetries, log: opts.Log}, nil
}

// ensureSchema creates the runner's schema when it does not exist. Only a
// missing schema is created: CREATE SCHEMA IF NOT EXISTS needs the CREATE
// right on the database even when the schema exists, which a schema owner
// does not always have.
func (r *Runner) ensureSchema(ctx context.Context) error {
	var exists bool
	if err := r.db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", r.schema).Scan(&exists); err != nil {
		return fmt.Errorf("look for schema %s: %w", r.schema, err)
	}
	if exists {
		return nil
	}
	if _, err := r.db.ExecContext(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{r.schema}.Sanitize()); err != nil {
		// IF NOT EXISTS does not cover a race: two runners that both find
		// the schema missing can both create it, and the loser gets a
		// unique violation on pg_namespace (or duplicate_schema). The
		// schema exists then, which is all this call needs.
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P06") {
			return nil
		}
		return fmt.Errorf("create schema %s: %w", r.schema, err)
	}
	return nil
}

// prepare checks the owner and creates the schema when missing: what every
// call that runs goose does once its own arguments are checked.
func (r *Runner) prepare(ctx context.Context) error {
	if err := r.checkOwner(ctx); err != nil {
		return err
	}
	return r.ensureSchema(ctx)
}

// checkOwner is CheckOwner on the runner's schema, before any change.
func (r *Runner) checkOwner(ctx context.Context) error {
	return CheckOwner(ctx, r.db, r.schema)
}

// SearchPath is the search_path the migrations run under: the target schema
// only, with pg_temp searched last so that a temporary table can never
// shadow one of the pack's tables inside its functions (they capture this
// path with SET search_path FROM CURRENT).
func SearchPath(schema string) string {
	return pgx.Identifier{schema}.Sanitize() + ", pg_temp"
}

// LockID is the advisory-lock key goose's session locker takes: one per
// schema, so runners on different schemas do not wait for each other.
func LockID(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("duroxide-pg-migrations:goose:" + schema))
	return int64(h.Sum64() & 0x7fffffffffffffff)
}

// Schema is the target schema.
func (r *Runner) Schema() string { return r.schema }

// DB is the runner's connection pool (search_path = the target schema).
func (r *Runner) DB() *sql.DB { return r.db }

// Close releases the connections.
func (r *Runner) Close() error { return r.provider.Close() }

// Up applies every pending migration, then restores every fix of the
// pack that duroxide-pg's runner replaced (Restore).
func (r *Runner) Up(ctx context.Context) ([]*goose.MigrationResult, error) {
	if err := r.prepare(ctx); err != nil {
		return nil, err
	}
	res, err := r.retryOnLockTimeout(ctx, func() ([]*goose.MigrationResult, error) { return r.provider.Up(ctx) })
	if err := r.wrapErr(ctx, "up", err); err != nil {
		return res, err
	}
	return res, r.Restore(ctx)
}

// UpTo applies pending migrations up to and including version, then
// restores every fix of the pack up to the schema's goose version that
// duroxide-pg's runner replaced (Restore).
func (r *Runner) UpTo(ctx context.Context, version int64) ([]*goose.MigrationResult, error) {
	if err := r.checkVersion(version); err != nil {
		return nil, err
	}
	if err := r.prepare(ctx); err != nil {
		return nil, err
	}
	res, err := r.retryOnLockTimeout(ctx, func() ([]*goose.MigrationResult, error) { return r.provider.UpTo(ctx, version) })
	if err := r.wrapErr(ctx, fmt.Sprintf("up to %d", version), err); err != nil {
		return res, err
	}
	return res, r.Restore(ctx)
}

// Restore puts back every fix of the pack, up to the schema's goose
// version, whose function duroxide-pg's runner (or anyone) replaced with a
// definition the pack knows (package restore): goose's table says which
// fixes were applied, the live definitions say which are in force. It
// refuses, changing nothing, when a fixed function holds a definition
// nobody knows. Up and UpTo run it after goose's migrations; Restored
// says what it did.
func (r *Runner) Restore(ctx context.Context) error {
	r.restored = nil
	v, err := r.Version(ctx)
	if err != nil {
		return err
	}
	_, err = r.retryOnLockTimeout(ctx, func() ([]*goose.MigrationResult, error) {
		plan, err := restore.Apply(ctx, r.db, r.schema, v, LockID(r.schema))
		r.restored = plan
		return nil, err
	})
	return err
}

// Restored is what the last Restore (or Up, UpTo) found for each function
// the pack fixes: those it restored have the action restore.Restore, those
// it left (a behaviour no fix of the pack serves yet) restore.Left.
func (r *Runner) Restored() []restore.Function { return r.restored }

// Down rolls back the newest applied migration.
func (r *Runner) Down(ctx context.Context) (*goose.MigrationResult, error) {
	if err := r.prepare(ctx); err != nil {
		return nil, err
	}
	var res *goose.MigrationResult
	_, err := r.retryOnLockTimeout(ctx, func() ([]*goose.MigrationResult, error) {
		var err error
		res, err = r.provider.Down(ctx)
		return nil, err
	})
	return res, r.wrapErr(ctx, "down", err)
}

// DownTo rolls back every migration newer than version (0 rolls back all).
func (r *Runner) DownTo(ctx context.Context, version int64) ([]*goose.MigrationResult, error) {
	if version != 0 {
		if err := r.checkVersion(version); err != nil {
			return nil, err
		}
	}
	if err := r.prepare(ctx); err != nil {
		return nil, err
	}
	res, err := r.retryOnLockTimeout(ctx, func() ([]*goose.MigrationResult, error) { return r.provider.DownTo(ctx, version) })
	return res, r.wrapErr(ctx, fmt.Sprintf("down to %d", version), err)
}

// ApplyVersion runs the Up (up = true) or the Down of one migration,
// whatever else is applied: a state goose's linear history does not reach
// (the tests use it to take a fix back under a later port, as duroxide-pg's
// runner can leave a database). Not for production use.
func (r *Runner) ApplyVersion(ctx context.Context, version int64, up bool) error {
	if err := r.prepare(ctx); err != nil {
		return err
	}
	_, err := r.provider.ApplyVersion(ctx, version, up)
	return r.wrapErr(ctx, fmt.Sprintf("apply version %d (up=%v)", version, up), err)
}

// Status lists every migration of the pack with its state in the database.
func (r *Runner) Status(ctx context.Context) ([]*goose.MigrationStatus, error) {
	if err := r.ensureSchema(ctx); err != nil {
		return nil, err
	}
	st, err := r.provider.Status(ctx)
	return st, r.wrapErr(ctx, "status", err)
}

// Version is the newest applied version (0 when none).
func (r *Runner) Version(ctx context.Context) (int64, error) {
	if err := r.ensureSchema(ctx); err != nil {
		return 0, err
	}
	v, err := r.provider.GetDBVersion(ctx)
	return v, r.wrapErr(ctx, "version", err)
}

// Latest is the newest version among the runner's migrations (Options.FS);
// for the embedded pack it is migrations.Latest().
func (r *Runner) Latest() int64 {
	var v int64
	for _, s := range r.provider.ListSources() {
		v = max(v, s.Version)
	}
	return v
}

func (r *Runner) checkVersion(version int64) error {
	for _, s := range r.provider.ListSources() {
		if s.Version == version {
			return nil
		}
	}
	return fmt.Errorf("%w: %d (the pack has 1..%d)", ErrNoSuchVersion, version, r.Latest())
}

// retryOnLockTimeout runs step, and again up to r.lockRetries times while
// it fails because a migration waited longer than lock_timeout for a lock
// (SQLSTATE 55P03: that migration was rolled back, the ones before it
// stay). Each retry waits a little longer first and is logged. It returns
// the migrations applied by every run, and the last error.
func (r *Runner) retryOnLockTimeout(ctx context.Context, step func() ([]*goose.MigrationResult, error)) ([]*goose.MigrationResult, error) {
	var done []*goose.MigrationResult
	for attempt := 1; ; attempt++ {
		res, err := step()
		done = append(done, res...)
		var partial *goose.PartialError
		if errors.As(err, &partial) {
			done = append(done, partial.Applied...)
		}
		if err == nil || !isLockTimeout(err) || attempt > r.lockRetries {
			if err != nil && isLockTimeout(err) {
				const hint = "waited longer than lock_timeout for a lock %d time(s) (the migration's header names the locks it takes; pg_stat_activity shows who holds them): %w"
				if partial != nil {
					partial.Err = fmt.Errorf(hint, attempt, partial.Err)
				} else {
					err = fmt.Errorf(hint, attempt, err)
				}
			}
			if partial != nil {
				partial.Applied = done
			}
			return done, err
		}
		what, undone := "a migration", "was rolled back"
		if partial != nil && partial.Failed != nil {
			what = partial.Failed.Source.Path
			if r.outsideTransaction(what) {
				undone = "stopped (it runs outside a transaction: its finished steps stay, each safe to run again)"
			}
		}
		wait := time.Duration(attempt) * time.Second
		fmt.Fprintf(r.log, "harness: %s waited longer than lock_timeout for a lock and %s; retry %d of %d in %v\n",
			what, undone, attempt, r.lockRetries, wait)
		select {
		case <-ctx.Done():
			return done, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// outsideTransaction reports whether the migration file at path runs
// outside a transaction (goose's NO TRANSACTION annotation).
func (r *Runner) outsideTransaction(path string) bool {
	text, err := fs.ReadFile(r.fsys, path)
	return err == nil && migrations.OutsideTransaction(string(text))
}

// isLockTimeout reports whether err is PostgreSQL's lock_not_available
// (SQLSTATE 55P03), what lock_timeout raises.
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// RunError is a run of migrations (Up, UpTo, Down, DownTo, ApplyVersion)
// that stopped at a migration that failed: what the run applied (or,
// going down, rolled back) before it, where it stopped, and the version
// goose's table records once it stopped. Each migration commits on its
// own, so the ones the run finished before the failure stay. errors.As
// finds it; it unwraps to the failure's own error (a *pgconn.PgError, for
// one the server raised).
type RunError struct {
	// Op is what the run was asked: "up", "up to 30", "down", "down to 23".
	Op string
	// Down is true for a run that rolls migrations back.
	Down bool
	// Done are the versions the run applied (rolled back, going down)
	// before it stopped, in the order it ran them, retries included.
	Done []int64
	// Failed is the migration that failed.
	Failed Source
	// PartWay is true when Failed runs outside a transaction (goose's NO
	// TRANSACTION): the steps it finished stay, and goose's table says what
	// it said before it.
	PartWay bool
	// Version is the newest version goose's table records after the
	// failure, -1 when it could not be read.
	Version int64
	// Err is the failure's own error.
	Err error
}

func (e *RunError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "migrate %s: ", e.Op)
	did := "applied"
	if e.Down {
		did = "rolled back"
	}
	if len(e.Done) == 0 {
		fmt.Fprintf(&b, "this run %s nothing before it stopped at %s", did, e.Failed.Path)
	} else {
		fmt.Fprintf(&b, "this run %s %s (each committed), then stopped at %s", did, versionList(e.Done), e.Failed.Path)
	}
	what := "which"
	if e.Down {
		what = "whose Down"
	}
	switch {
	case e.PartWay && e.Down:
		fmt.Fprintf(&b, ", %s failed part-way: it runs outside a transaction (NO TRANSACTION), so the steps it finished stay, each safe to run again, and goose's table still records the migration as applied", what)
	case e.PartWay:
		fmt.Fprintf(&b, ", %s failed part-way: it runs outside a transaction (NO TRANSACTION), so the steps it finished stay, each safe to run again, and goose's table does not record it", what)
	default:
		fmt.Fprintf(&b, ", %s failed and was rolled back", what)
	}
	switch {
	case e.Version < 0:
		b.WriteString("; the schema's version could not be read after the failure (`harness migrate status` says it)")
	case e.Down:
		fmt.Fprintf(&b, "; the schema is at version %d, %d still applied", e.Version, e.Failed.Version)
	case e.Version < e.Failed.Version:
		fmt.Fprintf(&b, "; the schema is at version %d, the previous version, %d still pending", e.Version, e.Failed.Version)
	default:
		fmt.Fprintf(&b, "; the schema is at version %d, %d still pending", e.Version, e.Failed.Version)
	}
	again := "up"
	if e.Down {
		again = "down"
	}
	if e.PartWay {
		fmt.Fprintf(&b, ", and the next %s finishes it", again)
	} else {
		fmt.Fprintf(&b, "; the next %s starts with it", again)
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	return b.String()
}

func (e *RunError) Unwrap() error { return e.Err }

// versionList is "25, 26, 27".
func versionList(vs []int64) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = strconv.FormatInt(v, 10)
	}
	return strings.Join(parts, ", ")
}

// wrapErr names the operation in err; a run stopped by a failed migration
// (goose's PartialError) becomes a *RunError, which reads the schema's
// version from goose's table once the run has stopped.
func (r *Runner) wrapErr(ctx context.Context, op string, err error) error {
	if err == nil || errors.Is(err, goose.ErrNoNextVersion) {
		return nil
	}
	var partial *goose.PartialError
	if !errors.As(err, &partial) || partial.Failed == nil || partial.Failed.Source == nil {
		return fmt.Errorf("migrate %s: %w", op, err)
	}
	re := &RunError{Op: op, Down: partial.Failed.Direction == "down", Err: partial.Err,
		Failed:  Source{Version: partial.Failed.Source.Version, Path: partial.Failed.Source.Path},
		PartWay: r.outsideTransaction(partial.Failed.Source.Path), Version: -1}
	for _, a := range partial.Applied {
		if a != nil && a.Source != nil {
			re.Done = append(re.Done, a.Source.Version)
		}
	}
	// The run's context may be what stopped it (a Ctrl-C): read the
	// version all the same, for a few seconds at most.
	readCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if v, err := r.provider.GetDBVersion(readCtx); err == nil {
		re.Version = v
	}
	return re
}

// To opens a runner on the database of cfg, migrates schema up to version
// and closes it: the one-liner for tools that need a schema at a given
// version.
func To(ctx context.Context, cfg *pgx.ConnConfig, schema string, version int64) error {
	r, err := Open(ctx, cfg, Options{Schema: schema})
	if err != nil {
		return fmt.Errorf("schema %s: %w", schema, err)
	}
	defer r.Close()
	if _, err := r.UpTo(ctx, version); err != nil {
		return fmt.Errorf("schema %s: %w", schema, err)
	}
	return nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
