package migrate

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// OpenDB opens a pool on the database of cfg (left unchanged) whose
// connections have search_path set to schema (schema "": left as the
// server sets it, for callers whose every statement names its schema,
// which then also work through a transaction pooler that refuses the
// startup parameter) and, when role is not empty,
// run SET ROLE role first: the migrations then run with role's privileges
// and what they create belongs to it. It is the one place the operator
// library opens a pool; nothing connects until the pool is used.
func OpenDB(cfg *pgx.ConnConfig, schema, role string) *sql.DB {
	cfg = cfg.Copy()
	if schema != "" {
		cfg.RuntimeParams["search_path"] = SearchPath(schema)
	}
	var opts []stdlib.OptionOpenDB
	if role != "" {
		opts = append(opts, stdlib.OptionAfterConnect(func(ctx context.Context, c *pgx.Conn) error {
			if _, err := c.Exec(ctx, "SET ROLE "+pgx.Identifier{role}.Sanitize()); err != nil {
				return fmt.Errorf("SET ROLE %s: %w", role, err)
			}
			return nil
		}))
	}
	return stdlib.OpenDB(*cfg, opts...)
}

// openDirect opens a pool on the database of cfg for schema (as role, when
// set) and checks that it reaches the server itself, not a transaction
// pooler.
func openDirect(ctx context.Context, cfg *pgx.ConnConfig, schema, role string) (*sql.DB, error) {
	db := OpenDB(cfg, schema, role)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		if unsupportedStartup(err) {
			return nil, poolerErr(oneLine(err.Error()))
		}
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := CheckDirect(ctx, db, schema); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}
