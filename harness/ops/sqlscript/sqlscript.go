// Package sqlscript writes the plain SQL that `harness migrate up` (or
// `down`) would run on one schema of a database, as one script a DBA can
// review and then run with psql. The script carries what the runner would
// do and nothing else: the pack's migration lock, a refusal when the
// schema is no longer at the goose version the script was written for,
// each migration's own section (its guards included, so a fix still
// refuses a definition it does not know) in its own transaction, as goose
// runs it (a file marked NO TRANSACTION statement by statement), and
// goose's bookkeeping rows. Rows of _duroxide_migrations are in the
// sections themselves.
package sqlscript

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/harness/ops/restore"
)

// Options say which script to write.
type Options struct {
	// Schema is the target schema (migrate.DefaultSchema when empty).
	Schema string
	// VersionTable is goose's table in the schema (migrate.VersionTable
	// when empty).
	VersionTable string
	// Down writes the rollback to Target instead of the upgrade.
	Down bool
	// Target is the goose version to end at (0 with Down: every migration
	// rolled back; 0 without: the pack's latest).
	Target int64
	// Role, when not empty, is the role the script acts as (SET ROLE at
	// its start): the owner of the schema's objects.
	Role string
	// LockTimeout bounds each wait of the script for a lock, the pack's
	// migration lock included (its lock_timeout, set before its first
	// statement that takes a lock): migrate.DefaultLockTimeout when 0;
	// negative, no bound (the server's setting).
	LockTimeout time.Duration
}

// Plan is what a script does.
type Plan struct {
	Schema string
	// VersionTable is goose's table in Schema.
	VersionTable string
	// From is the schema's goose version now (0 when goose has no table
	// yet, which the script then creates).
	From int64
	// To is the version the script ends at.
	To int64
	// Migrations are the files it runs, in order.
	Migrations []migrations.Migration
	// Down is true for a rollback.
	Down bool
	// NewVersionTable is true when goose's table does not exist yet.
	NewVersionTable bool
	// Role is Options.Role.
	Role string
	// LockTimeout is Options.LockTimeout, its default applied (negative:
	// no bound).
	LockTimeout time.Duration
	// Restore is, going up, what the restore step would do to each fixed
	// function were it run now (the script decides again when it runs,
	// after its migrations).
	Restore []restore.Function
}

// ErrNothingToDo is returned when the schema is already at the target.
var ErrNothingToDo = errors.New("nothing to do")

// Querier is what Read reads through.
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Read works out the plan for the schema as it is now. It refuses, like
// `harness migrate`, a schema that duroxide-pg's own runner made and that
// was never baselined, and a target the pack does not have.
func Read(ctx context.Context, q Querier, opts Options) (Plan, error) {
	opts.Schema, opts.VersionTable = migrate.Names(opts.Schema, opts.VersionTable)
	p := Plan{Schema: opts.Schema, VersionTable: opts.VersionTable, Down: opts.Down, Role: opts.Role,
		LockTimeout: cmp.Or(opts.LockTimeout, migrate.DefaultLockTimeout)}
	latest := migrations.Latest()
	if opts.Target == 0 && !opts.Down {
		opts.Target = latest
	}
	if opts.Target < 0 || opts.Target > latest {
		return p, fmt.Errorf("%w: %d (the pack has 1..%d)", migrate.ErrNoSuchVersion, opts.Target, latest)
	}
	goose, err := migrate.CheckAdopted(ctx, q, opts.Schema, opts.VersionTable)
	if err != nil {
		return p, err
	}
	p.NewVersionTable = !goose
	if goose {
		var v sql.NullInt64
		table := pgx.Identifier{opts.Schema, opts.VersionTable}.Sanitize()
		if err := q.QueryRowContext(ctx, "SELECT max(version_id) FROM "+table).Scan(&v); err != nil {
			return p, fmt.Errorf("read %s: %w", table, err)
		}
		p.From = v.Int64
	}
	p.To = opts.Target
	for _, m := range migrations.MustPack() {
		if (!opts.Down && m.Version > p.From && m.Version <= p.To) || (opts.Down && m.Version > p.To && m.Version <= p.From) {
			p.Migrations = append(p.Migrations, m)
		}
	}
	if opts.Down {
		for i, j := 0, len(p.Migrations)-1; i < j; i, j = i+1, j-1 {
			p.Migrations[i], p.Migrations[j] = p.Migrations[j], p.Migrations[i]
		}
	}
	if !opts.Down && goose && p.From > 0 {
		if p.Restore, err = restore.Plan(ctx, q, opts.Schema, max(p.From, p.To)); err != nil {
			return p, err
		}
		if err := restore.Refusal(p.Restore); err != nil && len(p.Migrations) == 0 {
			return p, err
		}
	}
	if len(p.Migrations) == 0 && !restore.Pending(p.Restore) {
		return p, fmt.Errorf("%w: schema %s is at goose version %d and every fix of the pack is in force", ErrNothingToDo, opts.Schema, p.From)
	}
	return p, nil
}

// Write writes the script of p.
func Write(w io.Writer, p Plan) error {
	versionTable := p.VersionTable
	schema := pgx.Identifier{p.Schema}.Sanitize()
	table := pgx.Identifier{versionTable}.Sanitize()
	verb := "up"
	if p.Down {
		verb = "down"
	}
	var b strings.Builder
	bound := "no lock_timeout of its own (written with --lock-timeout 0): it waits for a lock as long as the server's lock_timeout says"
	if p.LockTimeout > 0 {
		bound = fmt.Sprintf("lock_timeout %s (--lock-timeout) before its first statement that takes a lock: a wait longer than that, the pack's migration lock included, stops it with SQLSTATE 55P03 (writers queue behind a migration that waits for a lock at most that long)", lockTimeoutText(p.LockTimeout))
	}
	fmt.Fprintf(&b, `-- harness sql: what `+"`harness migrate %s --to %d`"+` runs on schema %s, now at goose version %d.
-- Review it, then run it with psql, not inside a transaction:
--   psql -v ON_ERROR_STOP=1 -f THIS_FILE "$DSN"
-- Like the harness, it runs each migration in its own transaction (a file
-- marked NO TRANSACTION, statement by statement: it builds an index
-- concurrently), so it refuses to start inside one (psql --single-transaction).
-- It sets %s.
-- It waits for the pack's migration lock, refuses (changing nothing) when the
-- schema is no longer at goose version %d, and records each migration in
-- %s as the harness would.
-- Stopped half-way (a lock timeout, any error): every migration before the
-- one it stopped in is committed and recorded there; the one it stopped in was
-- rolled back (a NO TRANSACTION file keeps the steps it finished, each safe to
-- run again). To resume, write the script again (harness sql %s) and run that:
-- it starts where this one stopped. The harness retries a lock timeout by
-- itself (harness migrate); psql does not.
-- Migrations: %s.

`, verb, p.To, p.Schema, p.From, bound, p.From, versionTable, verb, fileList(p.Migrations))
	// In a transaction block, now() is the block's start and
	// statement_timestamp() this statement's; on its own, one is the other.
	b.WriteString(`DO $session$
BEGIN
    IF now() <> statement_timestamp() THEN
        RAISE EXCEPTION 'harness sql: this script was started inside a transaction; it runs each migration in its own; nothing was changed'
            USING ERRCODE = '25001', HINT = 'Run it without --single-transaction (-1): psql -v ON_ERROR_STOP=1 -f FILE.';
    END IF;
END;
$session$;
`)
	if p.LockTimeout > 0 {
		fmt.Fprintf(&b, "SET lock_timeout = '%dms';\n", max(p.LockTimeout.Milliseconds(), 1))
	}
	if p.Role != "" {
		fmt.Fprintf(&b, "SET ROLE %s;\n", pgx.Identifier{p.Role}.Sanitize())
	}
	// The ownership check of `harness migrate` (migrate.CheckOwner).
	fmt.Fprintf(&b, `DO $owner$
DECLARE
    v_others text;
BEGIN
    SELECT string_agg(DISTINCT pg_get_userbyid(o.owner)::text, ', ') INTO v_others
    FROM (
        SELECT n.nspowner AS owner FROM pg_namespace n WHERE n.nspname = %[1]s
        UNION ALL
        SELECT c.relowner FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %[1]s AND c.relkind IN ('r', 'p', 'S', 'v', 'm')
        UNION ALL
        SELECT p.proowner FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = %[1]s
    ) o
    WHERE pg_get_userbyid(o.owner) <> current_user;
    IF v_others IS NOT NULL THEN
        RAISE EXCEPTION 'harness sql: schema %% and its objects belong to %%, and this script runs as %%; nothing was changed', %[1]s, v_others, current_user
            USING ERRCODE = '42501', HINT = 'Run it as the owner (psql -U), or write it with harness sql --role OWNER.';
    END IF;
END;
$owner$;
`, quoteLiteral(p.Schema))
	if p.NewVersionTable {
		fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\n", schema)
	}
	fmt.Fprintf(&b, "SET search_path TO %s;\n", migrate.SearchPath(p.Schema))
	fmt.Fprintf(&b, "-- The lock `harness migrate` holds while it runs (held to the end of the script).\nSELECT pg_advisory_lock(%d);\n\n", migrate.LockID(p.Schema))
	if p.NewVersionTable {
		fmt.Fprintf(&b, `-- goose's version table, as goose creates it.
CREATE TABLE IF NOT EXISTS %s (
    id integer PRIMARY KEY GENERATED BY DEFAULT AS IDENTITY,
    version_id bigint NOT NULL,
    is_applied boolean NOT NULL,
    tstamp timestamp NOT NULL DEFAULT now()
);
INSERT INTO %s (version_id, is_applied) SELECT 0, true WHERE NOT EXISTS (SELECT 1 FROM %s);

`, table, table, table)
	}
	fmt.Fprintf(&b, `DO $moved$
DECLARE
    v_version bigint := (SELECT max(version_id) FROM %s);
BEGIN
    IF v_version IS DISTINCT FROM %d THEN
        RAISE EXCEPTION 'harness sql: schema %% is at goose version %%, not %d as when this script was written; nothing was changed', current_schema(), v_version
            USING ERRCODE = '55000', HINT = 'Write the script again: harness sql';
    END IF;
END;
$moved$;
`, table, p.From, p.From)
	for _, m := range p.Migrations {
		section, what := m.Up, "Up"
		if p.Down {
			section, what = m.Down, "Down"
		}
		record := fmt.Sprintf("INSERT INTO %s (version_id, is_applied) VALUES (%d, true);\n", table, m.Version)
		if p.Down {
			record = fmt.Sprintf("DELETE FROM %s WHERE version_id = %d;\n", table, m.Version)
		}
		if m.NoTransaction {
			fmt.Fprintf(&b, "\n-- ==== %s (%s, NO TRANSACTION: each statement commits on its own) ====\n%s\n%s", m.File, what, strings.TrimSpace(section), record)
			continue
		}
		fmt.Fprintf(&b, "\n-- ==== %s (%s) ====\nBEGIN;\n%s\n%sCOMMIT;\n", m.File, what, strings.TrimSpace(section), record)
	}
	if !p.Down {
		fmt.Fprintf(&b, "\n-- ==== the restore step (%s): every fix of the pack up to goose version %d that duroxide-pg's runner replaced, installed again ====\nBEGIN;\n%sCOMMIT;\n",
			restore.File, max(p.From, p.To), restore.Script(max(p.From, p.To)))
	}
	fmt.Fprintf(&b, "\nSELECT pg_advisory_unlock(%d);\n-- End: schema %s at goose version %d.\n", migrate.LockID(p.Schema), p.Schema, max(p.From, p.To))
	_, err := io.WriteString(w, b.String())
	return err
}

// lockTimeoutText is d as lock_timeout reads it back ("5s", "500ms").
func lockTimeoutText(d time.Duration) string {
	if d%time.Second == 0 {
		return fmt.Sprintf("%ds", int64(d/time.Second))
	}
	return fmt.Sprintf("%dms", d.Milliseconds())
}

func fileList(ms []migrations.Migration) string {
	if len(ms) == 0 {
		return "none (the restore step only)"
	}
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.File
	}
	return strings.Join(names, ", ")
}

// quoteLiteral is s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
