package migrate

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// ErrPooler is returned, before anything changes, when the connection goes
// through a connection pooler that does not keep a session to its client
// (PgBouncer in transaction or statement mode): goose's session lock would
// not stay with the runner, and the search_path the migrations run under
// would not reach every transaction.
var ErrPooler = errors.New("the connection goes through a connection pooler that does not keep sessions")

func poolerErr(evidence string) error {
	return fmt.Errorf("%w (%s); nothing was changed. Run the migrations over a direct connection to PostgreSQL (its own port, usually 5432, not PgBouncer's 6432); the application can keep using the pooler",
		ErrPooler, evidence)
}

// unsupportedStartup reports whether err is PgBouncer refusing a startup
// parameter (it rejects search_path unless told to ignore it).
func unsupportedStartup(err error) bool {
	return err != nil && strings.Contains(err.Error(), "unsupported startup parameter")
}

// CheckDirect refuses a connection through a pooler that does not keep
// sessions. Two signs, either is enough: the search_path asked for at
// connection start is not in effect, or session state set on one
// connection is missing on its next statement or visible on another
// connection of the same pool (what transaction pooling does: server
// connections go back to the pool after every transaction).
func CheckDirect(ctx context.Context, db *sql.DB, schema string) error {
	var path string
	if err := db.QueryRowContext(ctx, "SELECT current_setting('search_path')").Scan(&path); err != nil {
		return fmt.Errorf("read search_path: %w", err)
	}
	norm := func(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, `"`, ""), " ", "") }
	if norm(path) != norm(SearchPath(schema)) {
		return poolerErr(fmt.Sprintf("search_path is %q, not the %q asked for at connection start", path, SearchPath(schema)))
	}
	evidence, err := SessionsShared(ctx, db)
	if err != nil {
		return err
	}
	if evidence != "" {
		return poolerErr(evidence)
	}
	return nil
}

// SessionsShared probes two connections of db's pool: it says how session
// state fails to stay with its connection (a pooler in transaction or
// statement mode), or "" when it does.
func SessionsShared(ctx context.Context, db *sql.DB) (string, error) {
	a, err := db.Conn(ctx)
	if err != nil {
		return "", fmt.Errorf("probe the connection: %w", err)
	}
	defer a.Close()
	b, err := db.Conn(ctx)
	if err != nil {
		return "", fmt.Errorf("probe the connection: %w", err)
	}
	defer b.Close()
	raw := make([]byte, 8)
	_, _ = rand.Read(raw)
	token := hex.EncodeToString(raw)
	const read = "SELECT coalesce(current_setting('duroxide_migrations.probe', true), '')"
	if _, err := a.ExecContext(ctx, "SELECT set_config('duroxide_migrations.probe', $1, false)", token); err != nil {
		return "", fmt.Errorf("probe the connection: %w", err)
	}
	defer a.ExecContext(context.WithoutCancel(ctx), "SELECT set_config('duroxide_migrations.probe', '', false)") //nolint:errcheck
	var own, other string
	if err := a.QueryRowContext(ctx, read).Scan(&own); err != nil {
		return "", fmt.Errorf("probe the connection: %w", err)
	}
	if err := b.QueryRowContext(ctx, read).Scan(&other); err != nil {
		return "", fmt.Errorf("probe the connection: %w", err)
	}
	switch {
	case own != token:
		return "a setting made on a connection is gone at its next statement", nil
	case other == token:
		return "a setting made on one connection is seen on another: their sessions are shared", nil
	}
	return "", nil
}
