package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/harness/ops/sqlscript"
)

// runSQL prints the SQL `harness migrate up|down` would run (package
// sqlscript), for review and psql.
func runSQL(ctx context.Context, env *Env, args []string) error {
	fs := newFlags(env, "sql")
	var t target
	t.register(fs)
	to := fs.String("to", "", "target version (up: default the pack's latest; down: required)")
	out := fs.String("o", "", "write the script to this file instead of standard output")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || (pos[0] != "up" && pos[0] != "down") {
		return usagef("sql needs up or down: `harness sql up --dsn DSN [--to N] [-o FILE]` or `harness sql down --to N --dsn DSN`")
	}
	down := pos[0] == "down"
	var version int64
	switch {
	case *to != "":
		v, err := strconv.ParseInt(*to, 10, 64)
		if err != nil || v < 0 {
			return usagef("--to %q is not a version number", *to)
		}
		version = v
	case down:
		return usagef("sql down needs --to N, the version to roll back to")
	}
	if err := t.resolve(); err != nil {
		return err
	}
	if t.cfg.MigrationsFS() != nil {
		return usagef("goose.yaml names a migrations directory: harness sql writes the embedded pack's migrations only")
	}
	db, err := t.connect(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	plan, err := sqlscript.Read(ctx, db, sqlscript.Options{Schema: t.schema, VersionTable: t.cfg.VersionTable, Down: down, Target: version, Role: t.role})
	switch {
	case errors.Is(err, sqlscript.ErrNothingToDo):
		fmt.Fprintf(env.Stderr, "harness: %v; no script written\n", err)
		return nil
	case errors.Is(err, migrate.ErrNoSuchVersion), errors.Is(err, migrate.ErrNeedsBaseline):
		return usagef("%v", err)
	case err != nil:
		return fmt.Errorf("sql: %s", pgErrText(err))
	}
	if *out == "" {
		if err := sqlscript.Write(env.Stdout, plan, t.cfg.VersionTable); err != nil {
			return fmt.Errorf("sql: write the script: %w", err)
		}
		return nil
	}
	f, err := os.Create(*out)
	if err != nil {
		return usagef("cannot write %s: %v", *out, err)
	}
	if err := errors.Join(sqlscript.Write(f, plan, t.cfg.VersionTable), f.Close()); err != nil {
		return fmt.Errorf("sql: write %s: %w", *out, err)
	}
	fmt.Fprintf(env.Stderr, "harness: wrote %s: %d migration(s), goose version %d -> %d of schema %s; run it with psql -v ON_ERROR_STOP=1 --single-transaction -f %s \"$DSN\"\n",
		*out, len(plan.Migrations), plan.From, plan.To, plan.Schema, *out)
	return nil
}
