package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"time"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/harness/ops/restore"
	"github.com/duroxide-pg/migrations/harness/ops/sqlscript"
)

// writeRestore writes the restore step for goose version to (default the
// pack's latest: the text of restore.File) to out (standard output when
// empty). It reads no database: the statement decides on the database it
// runs on.
func writeRestore(env *Env, to, out string) error {
	version := migrations.Latest()
	if to != "" {
		v, err := strconv.ParseInt(to, 10, 64)
		if err != nil || v < 1 || v > version {
			return Usagef("--to %q: give a version of the pack, 1..%d", to, version)
		}
		version = v
	}
	script := restore.Script(version)
	if out == "" {
		_, err := fmt.Fprint(env.Stdout, script)
		return err
	}
	if err := os.WriteFile(out, []byte(script), 0o644); err != nil {
		return Usagef("cannot write %s: %v", out, err)
	}
	fmt.Fprintf(env.Stderr, "harness: the restore step at goose version %d written to %s\n", version, out)
	return nil
}

// runSQL prints the SQL `harness migrate up|down` would run (package
// sqlscript), for review and psql.
func runSQL(ctx context.Context, env *Env, args []string) error {
	fs := NewFlags(env, "sql")
	var t target
	t.register(fs)
	to := fs.String("to", "", "target version (up: default the pack's latest; down: required)")
	out := fs.String("o", "", "write the script to this file instead of standard output")
	lockTimeout := fs.Duration("lock-timeout", migrate.DefaultLockTimeout,
		"the script's lock_timeout, set before its first statement that takes a lock: the longest it waits for one (the pack's migration lock included) before it stops with SQLSTATE 55P03 (0: the server's setting)")
	pos, err := Parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || (pos[0] != "up" && pos[0] != "down" && pos[0] != "restore") {
		return Usagef("sql needs up, down or restore: `harness sql up --dsn DSN [--to N] [-o FILE]`, `harness sql down --to N --dsn DSN` or `harness sql restore [--to N] [-o FILE]`")
	}
	if pos[0] == "restore" {
		return writeRestore(env, *to, *out)
	}
	down := pos[0] == "down"
	if *lockTimeout < 0 || (*lockTimeout > 0 && *lockTimeout < time.Millisecond) {
		return Usagef("--lock-timeout %v: give a duration of a millisecond or more (5s), or 0 for the server's setting", *lockTimeout)
	}
	bound := *lockTimeout
	if bound == 0 {
		bound = -1 // the options say negative for none
	}
	var version int64
	switch {
	case *to != "":
		v, err := strconv.ParseInt(*to, 10, 64)
		if err != nil || v < 0 {
			return Usagef("--to %q is not a version number: give a version of the pack (0 for down: everything)", *to)
		}
		version = v
	case down:
		return Usagef("sql down needs --to N, the version to roll back to")
	}
	if err := t.resolve(env); err != nil {
		return err
	}
	if *to != "" {
		if err := t.checkTo(version, down); err != nil {
			return err
		}
	}
	if err := t.checkMigrationsDir("sql"); err != nil {
		return err
	}
	db, err := t.connect(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	plan, err := sqlscript.Read(ctx, db, sqlscript.Options{Schema: t.schema, VersionTable: t.cfg.VersionTable, Down: down, Target: version, Role: t.role, LockTimeout: bound})
	switch {
	case errors.Is(err, sqlscript.ErrNothingToDo):
		fmt.Fprintf(env.Stderr, "harness: %v; no script written\n", err)
		return nil
	case errors.Is(err, migrate.ErrNoSuchVersion), errors.Is(err, migrate.ErrNeedsBaseline):
		return Usagef("%v", err)
	case err != nil:
		return fmt.Errorf("sql: %s", pgErrText(err))
	}
	if *out == "" {
		if err := sqlscript.Write(env.Stdout, plan); err != nil {
			return fmt.Errorf("sql: write the script: %w", err)
		}
		return nil
	}
	f, err := os.Create(*out)
	if err != nil {
		return Usagef("cannot write %s: %v", *out, err)
	}
	if err := errors.Join(sqlscript.Write(f, plan), f.Close()); err != nil {
		return fmt.Errorf("sql: write %s: %w", *out, err)
	}
	fmt.Fprintf(env.Stderr, "harness: wrote %s: %d migration(s), goose version %d -> %d of schema %s; run it with psql -v ON_ERROR_STOP=1 -f %s \"$DSN\" (not --single-transaction: each migration commits on its own)\n",
		*out, len(plan.Migrations), plan.From, plan.To, plan.Schema, *out)
	return nil
}

// differingMigration names the first .sql file that is not the same in a
// and b ("" when they hold the same .sql files, byte for byte).
func differingMigration(a, b fs.FS) string {
	names := func(fsys fs.FS) []string {
		m, _ := fs.Glob(fsys, "*.sql")
		return m
	}
	an, bn := names(a), names(b)
	for _, n := range an {
		if !slices.Contains(bn, n) {
			return n + " is not in the built pack"
		}
	}
	for _, n := range bn {
		x, errA := fs.ReadFile(a, n)
		y, errB := fs.ReadFile(b, n)
		switch {
		case errA != nil:
			return n + " is missing from the directory"
		case errB != nil || !bytes.Equal(x, y):
			return n + " differs"
		}
	}
	return ""
}
