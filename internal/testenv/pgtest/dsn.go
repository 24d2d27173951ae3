package pgtest

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/dbconn"
)

// dsnServer is an existing server the harness does not own: it only creates
// and drops its own uniquely named databases there.
type dsnServer struct {
	cfg *pgx.ConnConfig
}

func openDSN(ctx context.Context, dsn string) (*dsnServer, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("bad DSN %s: %w", dbconn.Redact(dsn), err)
	}
	if cfg.Database == "" {
		cfg.Database = "postgres"
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", dbconn.Redact(dsn), err)
	}
	defer conn.Close(ctx)
	var canCreate bool
	if err := conn.QueryRow(ctx, `SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&canCreate); err != nil {
		return nil, fmt.Errorf("check CREATEDB privilege: %w", err)
	}
	if !canCreate {
		return nil, fmt.Errorf("role %q on %s may not create databases; grant CREATEDB or use another backend", cfg.User, dbconn.Redact(dsn))
	}
	return &dsnServer{cfg: cfg}, nil
}

func (s *dsnServer) adminConfig() *pgx.ConnConfig { return s.cfg }

func (s *dsnServer) close(context.Context) error { return nil }
