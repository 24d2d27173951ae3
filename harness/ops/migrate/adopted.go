package migrate

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
)

// Names fills an empty schema with DefaultSchema and an empty goose table
// with VersionTable. Every call of the operator library that takes a
// schema and a version table applies it once, at its start.
func Names(schema, versionTable string) (string, string) {
	return cmp.Or(schema, DefaultSchema), cmp.Or(versionTable, VersionTable)
}

// RowQuerier is what CheckAdopted reads through: a *sql.DB, *sql.Conn or
// *sql.Tx.
type RowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// CheckAdopted refuses, with ErrNeedsBaseline, a schema that has
// duroxide-pg's bookkeeping table (_duroxide_migrations) but not goose's
// versionTable: goose would try to create every table again. It reports
// whether goose's table exists. It only reads; the runner, the read-only
// commands and the SQL script writer all refuse through it, with one
// message.
func CheckAdopted(ctx context.Context, q RowQuerier, schema, versionTable string) (hasVersionTable bool, err error) {
	var upstream, goose bool
	err = q.QueryRowContext(ctx, `SELECT
		EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = '_duroxide_migrations'),
		EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = $2)`,
		schema, versionTable).Scan(&upstream, &goose)
	if err != nil {
		return false, fmt.Errorf("look for the bookkeeping tables of schema %s: %w", schema, err)
	}
	if upstream && !goose {
		return false, fmt.Errorf("%w: schema %s has duroxide-pg's _duroxide_migrations but no goose table %s; nothing was changed. Adopt it first: `harness baseline --schema %s --dry-run`, then without --dry-run",
			ErrNeedsBaseline, schema, versionTable, schema)
	}
	return goose, nil
}
