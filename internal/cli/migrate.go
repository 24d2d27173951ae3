package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/config"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
)

// target is where a command acts: a DSN and a schema, from flags or
// goose.yaml.
type target struct {
	configPath, dsn, env, schema, role string
	cfg                                *config.Config
}

func (t *target) register(fs interface {
	StringVar(*string, string, string, string)
}) {
	fs.StringVar(&t.configPath, "config", "", "settings file (default ./goose.yaml when present)")
	fs.StringVar(&t.dsn, "dsn", "", "PostgreSQL DSN (postgres://user:pass@host:port/db)")
	fs.StringVar(&t.env, "env", "", "environment name from goose.yaml instead of --dsn")
	fs.StringVar(&t.schema, "schema", "", "target schema (default from goose.yaml, else duroxide)")
	fs.StringVar(&t.role, "role", "", "act as this role (SET ROLE) on every connection: the owner of the schema's objects")
}

// resolve fills dsn and schema, checking the DSN parses.
func (t *target) resolve() error {
	cfg, err := config.Load(t.configPath)
	if err != nil {
		return usagef("%v", err)
	}
	t.cfg = cfg
	if t.dsn != "" && t.env != "" {
		return usagef("give --dsn or --env, not both")
	}
	envSchema := ""
	if t.env != "" {
		if t.dsn, envSchema, err = cfg.DSN(t.env); err != nil {
			return usagef("%v", err)
		}
	}
	if t.dsn == "" {
		return usagef("no database: give --dsn postgres://user@host:5432/db or --env NAME (from goose.yaml)")
	}
	if _, err := pgx.ParseConfig(t.dsn); err != nil {
		return usagef("bad DSN %s: %v", pgtest.Redact(t.dsn), oneLine(err.Error()))
	}
	for _, s := range []string{t.schema, envSchema, cfg.Schema, migrate.DefaultSchema} {
		if s != "" {
			t.schema = s
			break
		}
	}
	return nil
}

// open connects a migration runner; connection failures are bad input.
func (t *target) open(ctx context.Context, verbose bool) (*migrate.Runner, error) {
	r, err := migrate.Open(ctx, t.dsn, migrate.Options{
		Schema:       t.schema,
		FS:           t.cfg.MigrationsFS(),
		VersionTable: t.cfg.VersionTable,
		Verbose:      verbose,
		Role:         t.role,
	})
	if errors.Is(err, migrate.ErrNeedsBaseline) || errors.Is(err, migrate.ErrPooler) {
		return nil, usagef("%v", err)
	}
	if err != nil {
		return nil, usagef("cannot use %s: %s; check the DSN, that the server runs and that the role may create schema %q",
			pgtest.Redact(t.dsn), oneLine(pgErrText(err)), t.schema)
	}
	return r, nil
}

func pgErrText(err error) string {
	// pgx errors embed the DSN's host but never the password; still redact
	// anything that looks like a URL with credentials.
	return pgtest.Redact(err.Error())
}

func runMigrate(ctx context.Context, env *env, args []string) error {
	fs := newFlags(env, "migrate")
	var t target
	t.register(fs)
	to := fs.String("to", "", "target version: up applies up to it, down rolls back to it")
	verbose := fs.Bool("v", false, "log each migration")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("migrate needs one action: up, down, status or version (e.g. `harness migrate up --dsn ...`)")
	}
	action := pos[0]
	switch action {
	case "up", "down", "status", "version":
	default:
		return usagef("unknown migrate action %q: use up, down, status or version", action)
	}
	var version int64 = -1
	if *to != "" {
		if action != "up" && action != "down" {
			return usagef("--to only applies to up and down")
		}
		v, err := strconv.ParseInt(*to, 10, 64)
		if err != nil || v < 0 {
			return usagef("--to %q is not a version number", *to)
		}
		version = v
	}
	if err := t.resolve(); err != nil {
		return err
	}
	// status, version and the check before down only read: goose's own
	// provider would create the schema and its table to answer them.
	switch action {
	case "status", "version", "down":
		st, err := t.inspect(ctx)
		if err != nil {
			return err
		}
		switch {
		case action == "version":
			fmt.Fprintln(env.Stdout, st.Version())
			if !st.TableExists {
				fmt.Fprintf(env.Stderr, "harness: %s\n", missingWhat(st))
			}
			return nil
		case action == "status":
			return printStatus(env, t, st)
		case !st.SchemaExists || !st.TableExists:
			return usagef("%s: nothing to roll back; nothing was created", missingWhat(st))
		}
	}
	r, err := t.open(ctx, *verbose)
	if err != nil {
		return err
	}
	defer r.Close()
	if version > r.Latest() || (version == 0 && action == "up") {
		return usagef("version %d does not exist: the pack has 1..%d", version, r.Latest())
	}
	switch action {
	case "up":
		var err error
		if version >= 0 {
			_, err = r.UpTo(ctx, version)
		} else {
			_, err = r.Up(ctx)
		}
		if errors.Is(err, migrate.ErrNoSuchVersion) {
			return usagef("%v", err)
		}
		if err != nil {
			return err
		}
		return printVersion(ctx, env, r, "now at version")
	case "down":
		var err error
		if version >= 0 {
			_, err = r.DownTo(ctx, version)
		} else {
			_, err = r.Down(ctx)
		}
		if errors.Is(err, migrate.ErrNoSuchVersion) {
			return usagef("%v", err)
		}
		if err != nil {
			return err
		}
		return printVersion(ctx, env, r, "now at version")
	}
	return nil
}

// inspect reads the target's state without changing anything.
func (t *target) inspect(ctx context.Context) (*migrate.State, error) {
	st, err := migrate.Inspect(ctx, t.dsn, migrate.Options{Schema: t.schema, VersionTable: t.cfg.VersionTable, Role: t.role})
	if errors.Is(err, migrate.ErrNeedsBaseline) || errors.Is(err, migrate.ErrPooler) {
		return nil, usagef("%v", err)
	}
	if err != nil {
		return nil, usagef("cannot use %s: %s; check the DSN and that the server runs", pgtest.Redact(t.dsn), oneLine(pgErrText(err)))
	}
	return st, nil
}

// missingWhat says what a schema lacks for goose ("" when nothing).
func missingWhat(st *migrate.State) string {
	switch {
	case !st.SchemaExists:
		return fmt.Sprintf("schema %s does not exist", st.Schema)
	case !st.TableExists:
		return fmt.Sprintf("schema %s has no goose version table", st.Schema)
	}
	return ""
}

// printStatus lists every migration of the pack with its state, as goose's
// status does, from what ReadState read.
func printStatus(env *env, t target, st *migrate.State) error {
	sources, err := migrate.Sources(t.cfg.MigrationsFS())
	if err != nil {
		return err
	}
	if !st.TableExists {
		fmt.Fprintf(env.Stderr, "harness: %s: every migration is pending\n", missingWhat(st))
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "VERSION\tSTATE\tAPPLIED AT\tFILE\n")
	for _, s := range sources {
		state, at := "pending", "-"
		if when, ok := st.AppliedAt(s.Version); ok {
			state, at = "applied", when.UTC().Format("2006-01-02 15:04:05Z")
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.Version, state, at, s.Path)
	}
	return tw.Flush()
}

func printVersion(ctx context.Context, env *env, r *migrate.Runner, prefix string) error {
	v, err := r.Version(ctx)
	if err != nil {
		return err
	}
	if prefix == "" {
		fmt.Fprintln(env.Stdout, v)
		return nil
	}
	fmt.Fprintf(env.Stdout, "%s %d (schema %s)\n", prefix, v, r.Schema())
	return nil
}
