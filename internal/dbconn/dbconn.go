// Package dbconn hands connections down from the one place that reads a
// DSN: the command's entry point (a flag, goose.yaml, a throwaway server)
// parses it once into a Source, and everything below opens its
// connections from that Source: each simulated dispatcher and worker its
// own, a measurement its one, the migration runner its pool (from
// Config). Only a process outside Go, such as the real runtime, is given
// the DSN itself.
package dbconn

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Source opens connections to one database.
type Source struct {
	dsn string
	cfg *pgx.ConnConfig
}

// Parse reads dsn (a URL or key=value DSN) into a Source. Its error
// names the DSN with the password redacted.
func Parse(dsn string) (*Source, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("bad DSN %s: %w", Redact(dsn), err)
	}
	return &Source{dsn: dsn, cfg: cfg}, nil
}

// Connect opens a connection the caller owns.
func (s *Source) Connect(ctx context.Context) (*pgx.Conn, error) {
	return pgx.ConnectConfig(ctx, s.cfg.Copy())
}

// Config is a copy of the connection settings, for a caller that changes
// them before it connects (a search_path, a role, a pool).
func (s *Source) Config() *pgx.ConnConfig { return s.cfg.Copy() }

// Database is the name of the database the Source connects to.
func (s *Source) Database() string { return s.cfg.Database }

// DSN is the DSN the Source was parsed from, password included: only for
// a process outside Go that connects on its own (never print it; String
// is the printable form).
func (s *Source) DSN() string { return s.dsn }

// String is the DSN with its password redacted.
func (s *Source) String() string { return Redact(s.dsn) }

// urlPassword matches the password part of a URL-shaped DSN, even one that
// does not parse.
var urlPassword = regexp.MustCompile(`(://[^:/@\s]*):[^@\s]*@`)

// Redact replaces the password of a URL or key=value DSN with "xxxxx".
func Redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" && u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			return u.String()
		}
		return dsn
	}
	if strings.Contains(dsn, "://") {
		return urlPassword.ReplaceAllString(dsn, "$1:xxxxx@")
	}
	fields := strings.Fields(dsn)
	for i, f := range fields {
		if strings.HasPrefix(strings.ToLower(f), "password=") {
			fields[i] = "password=xxxxx"
		}
	}
	return strings.Join(fields, " ")
}
