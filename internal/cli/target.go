package cli

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/config"
	"github.com/duroxide-pg/migrations/internal/dbconn"
)

// target is where a command acts: a DSN and a schema, from flags or the
// settings file (goose.yaml).
type target struct {
	configPath, dsn, env, schema, role string
	// schemaSet and roleSet: the flag was given (even as "").
	schemaSet, roleSet bool
	flags              *flag.FlagSet
	cfg                *config.Config
	// src is dsn, parsed by resolve: what everything below connects with.
	src *dbconn.Source
}

func (t *target) register(fs *flag.FlagSet) {
	t.flags = fs
	fs.StringVar(&t.configPath, "config", "", "settings file (default ./goose.yaml when present, else ./harness.yaml, the name one release gave it)")
	fs.StringVar(&t.dsn, "dsn", "", "PostgreSQL DSN (postgres://user:pass@host:port/db)")
	fs.StringVar(&t.env, "env", "", "environment name from the settings file instead of --dsn")
	fs.StringVar(&t.schema, "schema", "", "target schema (default from the settings file, else duroxide)")
	fs.StringVar(&t.role, "role", "", "act as this role (SET ROLE) on every connection: the owner of the schema's objects")
}

// resolve fills dsn, src and schema: the DSN is parsed here, once. A
// settings file under its old name is said on env's stderr.
func (t *target) resolve(env *Env) error {
	cfg, err := config.Load(t.configPath)
	if err != nil {
		return Usagef("%v", err)
	}
	if d := cfg.Deprecation(); d != "" {
		fmt.Fprintf(env.Stderr, "%s: deprecated: %s\n", env.Program, d)
	}
	t.cfg = cfg
	if t.dsn != "" && t.env != "" {
		return Usagef("give --dsn or --env, not both")
	}
	envSchema := ""
	if t.env != "" {
		if t.dsn, envSchema, err = cfg.DSN(t.env); err != nil {
			return Usagef("%v", err)
		}
	}
	if t.dsn == "" {
		return Usagef("no database: give --dsn postgres://user@host:5432/db or --env NAME (from %s)", cfg.Name())
	}
	if t.src, err = dbconn.Parse(t.dsn); err != nil {
		return Usagef("%s", oneLine(err.Error()))
	}
	t.flags.Visit(func(f *flag.Flag) {
		t.schemaSet = t.schemaSet || f.Name == "schema"
		t.roleSet = t.roleSet || f.Name == "role"
	})
	// The first that is set; an explicit --schema "" is refused, not
	// replaced.
	schemaFrom := "--schema"
	switch {
	case t.schemaSet:
	case envSchema != "":
		t.schema, schemaFrom = envSchema, fmt.Sprintf("the schema of environment %s (%s)", t.env, cfg.Name())
	case cfg.Schema != "":
		t.schema, schemaFrom = cfg.Schema, "the schema of "+cfg.Name()
	default:
		t.schema = migrate.DefaultSchema
	}
	return checkNames(schemaFrom, t.schema, t.role, t.roleSet, t.cfg.VersionTable, cfg.Name())
}

// checkNames refuses, as bad input, a schema, role or version table name
// the commands cannot act on as given (migrate.CheckName): before anything
// connects.
func checkNames(schemaFrom, schema, role string, roleSet bool, versionTable, settingsFile string) error {
	if err := migrate.CheckName(schemaFrom, schema, false); err != nil {
		return Usagef("%v", err)
	}
	if roleSet || role != "" {
		if err := migrate.CheckName("--role", role, true); err != nil {
			return Usagef("%v", err)
		}
	}
	if versionTable != "" {
		if err := migrate.CheckName("version_table ("+settingsFile+")", versionTable, false); err != nil {
			return Usagef("%v", err)
		}
	}
	return nil
}

// open connects a migration runner with run's settings (verbosity, lock
// timeout and retries, log) and the target's names; connection failures
// are bad input.
func (t *target) open(ctx context.Context, run migrate.Options) (*migrate.Runner, error) {
	run.Schema, run.VersionTable, run.Role = t.schema, t.cfg.VersionTable, t.role
	r, err := migrate.Open(ctx, t.src.Config(), run)
	if errors.Is(err, migrate.ErrNeedsBaseline) || errors.Is(err, migrate.ErrPooler) {
		return nil, Usagef("%v", err)
	}
	if errors.Is(err, migrate.ErrUnreachable) {
		return nil, t.unreachable(err)
	}
	if err != nil {
		return nil, Usagef("cannot use %s: %s; check the DSN, that the server runs and that the role may create schema %q",
			t.src, oneLine(pgErrText(err)), t.schema)
	}
	return r, nil
}

func pgErrText(err error) string {
	// pgx errors embed the DSN's host but never the password; still redact
	// anything that looks like a URL with credentials.
	return dbconn.Redact(err.Error())
}

// inspect reads the target's state without changing anything.
func (t *target) inspect(ctx context.Context) (*migrate.State, error) {
	st, err := migrate.Inspect(ctx, t.src.Config(), migrate.Options{Schema: t.schema, VersionTable: t.cfg.VersionTable, Role: t.role})
	if errors.Is(err, migrate.ErrNeedsBaseline) || errors.Is(err, migrate.ErrPooler) {
		return nil, Usagef("%v", err)
	}
	if errors.Is(err, migrate.ErrUnreachable) {
		return nil, t.unreachable(err)
	}
	if err != nil {
		return nil, Usagef("cannot use %s: %s; check the DSN and that the server runs", t.src, oneLine(pgErrText(err)))
	}
	return st, nil
}

// connect opens a pool on t's database with search_path = the target
// schema, without creating anything; connection failures are bad input.
func (t *target) connect(ctx context.Context) (*sql.DB, error) {
	return t.connectWithPath(ctx, t.schema)
}

// connectQualified is connect for commands whose every statement names
// the schema (doctor): the server's search_path is left alone, so that
// they also work through PgBouncer in transaction mode, which refuses a
// search_path startup parameter.
//
// With --role it first makes sure, over connections without the role, that
// sessions stay with their connection: through a transaction pooler, the
// SET ROLE each connection starts with would stay on a server connection
// the application shares.
func (t *target) connectQualified(ctx context.Context) (*sql.DB, error) {
	if t.role != "" {
		plain := migrate.OpenDB(t.src.Config(), "", "")
		shared, err := migrate.SessionsShared(ctx, plain)
		plain.Close()
		if err != nil {
			return nil, t.unreachable(err)
		}
		if shared != "" {
			return nil, Usagef("--role %s through a connection pooler (%s): the role each connection starts with would stay on a server connection others share; drop --role or connect to PostgreSQL directly", t.role, shared)
		}
	}
	return t.connectWithPath(ctx, "")
}

func (t *target) connectWithPath(ctx context.Context, searchPath string) (*sql.DB, error) {
	db := migrate.OpenDB(t.src.Config(), searchPath, t.role)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, t.unreachable(err)
	}
	return db, nil
}

// unreachable is the error of a failed connection: ExitUnavailable, or
// bad input when it failed on --role (SET ROLE).
func (t *target) unreachable(err error) error {
	if errors.Is(err, migrate.ErrRole) {
		return Usagef("cannot use %s as role %s: %s", t.src, t.role, oneLine(pgErrText(err)))
	}
	return unreachableError{fmt.Sprintf("cannot use %s: %s; check the DSN and that the server runs", t.src, oneLine(pgErrText(err)))}
}

// checkTo refuses, before anything connects, a --to the pack does not
// have: for up a version of the pack, for down one or 0 (everything
// rolled back). version < 0 means no --to.
func (t *target) checkTo(version int64, down bool) error {
	if version < 0 || (down && version == 0) {
		return nil
	}
	sources, err := migrate.Sources(nil)
	if err != nil {
		return fmt.Errorf("read the pack's migrations: %w", err)
	}
	var latest int64
	for _, src := range sources {
		if src.Version == version {
			return nil
		}
		latest = max(latest, src.Version)
	}
	allowed := fmt.Sprintf("a version of the pack, 1..%d", latest)
	if down {
		allowed += ", or 0 to roll back everything"
	}
	return Usagef("--to %d: version %d does not exist; give %s", version, version, allowed)
}

// checkMigrationsDir refuses to go on when the settings file names a migrations
// directory whose files differ from the pack built into the harness: every
// command applies, writes and checks the built-in pack, so that migrate,
// sql, baseline and doctor agree; in a checkout, goose.yaml's sql/ is the
// same files unless they were edited since the harness was built.
func (t *target) checkMigrationsDir(command string) error {
	dir := t.cfg.MigrationsFS()
	if dir == nil {
		return nil
	}
	if diff := differingMigration(dir, migrations.FS); diff != "" {
		return Usagef("%[4]s's migrations_dir %[1]s differs from the pack built into this harness (%[2]s): harness %[3]s uses the built-in pack only, as every command does; rebuild the harness (make build, or go run), or run it where %[4]s does not name that directory",
			t.cfg.MigrationsDir, diff, command, t.cfg.Name())
	}
	return nil
}
