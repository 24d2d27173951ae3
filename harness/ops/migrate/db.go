package migrate

import (
	"context"
	"database/sql"
	"errors"
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
				return fmt.Errorf("SET ROLE %s: %w", role, errors.Join(ErrRole, err))
			}
			return nil
		}))
	}
	return stdlib.OpenDB(*cfg, opts...)
}

// ErrUnreachable marks a connection the server refused or that could not
// be made (errors.Is): the command's input may be right, the server is
// not there for it.
var ErrUnreachable = errors.New("the server refused the connection or could not be reached")

// ErrRole marks a connection on which SET ROLE failed (the role does not
// exist, or the user may not take it): the command's input, not the
// server.
var ErrRole = errors.New("SET ROLE failed")

// unreachable is a failed connection: its error, and ErrUnreachable.
type unreachable struct{ err error }

func (u unreachable) Error() string   { return u.err.Error() }
func (u unreachable) Unwrap() []error { return []error{u.err, ErrUnreachable} }

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
		if errors.Is(err, ErrRole) {
			return nil, fmt.Errorf("connect: %w", err)
		}
		return nil, fmt.Errorf("connect: %w", unreachable{err})
	}
	if err := CheckDirect(ctx, db, schema); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}
