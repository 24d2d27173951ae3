package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// ErrNotOwner is returned before anything changes when the role the
// migrations would run as (the connecting role, or --role) is not the owner
// of the target schema and every object in it.
var ErrNotOwner = errors.New("the role does not own the schema and its objects")

// Ownership is who owns a schema and its objects, seen from a connection.
type Ownership struct {
	// Role is the role the connection acts as (current_user).
	Role string
	// Owners are the owners of the schema and of its tables, sequences,
	// views and functions, the most frequent first (none for a schema that
	// does not exist yet).
	Owners []Owner
}

// Owner is one role owning objects of the schema.
type Owner struct {
	Role    string
	Objects int
	// Example names one of its objects, e.g. "function ack_worker".
	Example string
}

// ReadOwnership reads who owns schema and its objects.
func ReadOwnership(ctx context.Context, db *sql.DB, schema string) (Ownership, error) {
	var o Ownership
	if err := db.QueryRowContext(ctx, "SELECT current_user::text").Scan(&o.Role); err != nil {
		return o, fmt.Errorf("read the current role: %w", err)
	}
	rows, err := db.QueryContext(ctx, `
		WITH objects AS (
			SELECT 'schema ' || n.nspname AS name, n.nspowner AS owner
			FROM pg_namespace n WHERE n.nspname = $1
			UNION ALL
			SELECT CASE c.relkind WHEN 'S' THEN 'sequence ' WHEN 'v' THEN 'view ' ELSE 'table ' END || c.relname, c.relowner
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'S', 'v', 'm')
			UNION ALL
			SELECT 'function ' || p.proname, p.proowner
			FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
			WHERE n.nspname = $1
		)
		SELECT pg_get_userbyid(owner)::text, count(*), min(name)
		FROM objects GROUP BY owner ORDER BY count(*) DESC, 1`, schema)
	if err != nil {
		return o, fmt.Errorf("read the owners of schema %s: %w", schema, err)
	}
	defer rows.Close()
	for rows.Next() {
		var w Owner
		if err := rows.Scan(&w.Role, &w.Objects, &w.Example); err != nil {
			return o, fmt.Errorf("read the owners of schema %s: %w", schema, err)
		}
		o.Owners = append(o.Owners, w)
	}
	return o, rows.Err()
}

// CheckOwner refuses (ErrNotOwner, nothing changed) when the schema or any
// of its objects belongs to a role other than the one the connection acts
// as. A superuser could replace them, but what the migrations create would
// then belong to the superuser, and the application's role (which duroxide-pg
// runs as, and which owns what its own runner made) would be denied it.
func CheckOwner(ctx context.Context, db *sql.DB, schema string) error {
	o, err := ReadOwnership(ctx, db, schema)
	if err != nil {
		return err
	}
	var others []string
	for _, w := range o.Owners {
		if w.Role != o.Role {
			others = append(others, fmt.Sprintf("%s (%d objects, e.g. %s)", w.Role, w.Objects, w.Example))
		}
	}
	if len(others) == 0 {
		return nil
	}
	hint := fmt.Sprintf("connect as that role, or add --role %s to act as it", o.Owners[0].Role)
	if len(o.Owners) > 1 {
		hint = "give every object one owner first (ALTER ... OWNER TO, or REASSIGN OWNED), then connect as it or use --role"
	}
	return fmt.Errorf("%w: schema %s and its objects belong to %s, and the migrations would run as %s; nothing was changed. What they create would belong to %s and the owner's role could not use it; %s",
		ErrNotOwner, schema, strings.Join(others, ", "), o.Role, o.Role, hint)
}
