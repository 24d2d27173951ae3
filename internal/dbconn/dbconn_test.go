package dbconn_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/dbconn"
)

func TestRedact(t *testing.T) {
	require.Equal(t, "postgres://u:xxxxx@h:5432/db", dbconn.Redact("postgres://u:pw@h:5432/db"))
	require.Equal(t, "postgres://u@h/db", dbconn.Redact("postgres://u@h/db"))
	require.Equal(t, "host=h password=xxxxx user=u", dbconn.Redact("host=h password=pw user=u"))
	require.Equal(t, "postgres://u:xxxxx@%zz/db", dbconn.Redact("postgres://u:pw@%zz/db"), "even a URL that does not parse")
}

// A Source parses its DSN once: a bad one is an error naming it without
// its password, a good one prints redacted and keeps its settings.
func TestParse(t *testing.T) {
	_, err := dbconn.Parse("postgres://u:secret@h:notaport/db")
	require.ErrorContains(t, err, "bad DSN postgres://u:xxxxx@h:notaport/db")
	require.NotContains(t, err.Error(), "secret")
	src, err := dbconn.Parse("postgres://u:secret@h:5433/db?sslmode=disable")
	require.NoError(t, err)
	require.Equal(t, "postgres://u:xxxxx@h:5433/db?sslmode=disable", src.String())
	require.Equal(t, "db", src.Database())
	cfg := src.Config()
	require.Equal(t, uint16(5433), cfg.Port)
	cfg.Database = "changed"
	require.Equal(t, "db", src.Database(), "Config is a copy")
}
