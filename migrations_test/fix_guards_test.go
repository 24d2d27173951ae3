package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
)

// Every fix identifies what it replaces: a definition of any function it
// fixes that it does not know (a DBA's hot fix) makes its Up fail with
// SQLSTATE 55000 naming that function, and nothing is changed.
func TestEveryFixRefusesADefinitionItDoesNotKnow(t *testing.T) {
	t.Parallel()
	for _, m := range migrations.Fixes() {
		for _, fn := range m.Fixes {
			t.Run(fmt.Sprintf("%s over a hand-edited %s", m.File, fn), func(t *testing.T) {
				t.Parallel()
				db := dbs.New(t, m.Version-1)
				editByHand(t, db, fn)
				h := &schemaDB{t: t, db: db, pool: db.PgxPool(t)}
				before := h.texts(`SELECT p.proname::text || md5(p.prosrc) FROM pg_proc p
					WHERE p.pronamespace = $1::regnamespace ORDER BY 1`, db.Schema)

				r := db.Runner(t)
				_, err := r.UpTo(context.Background(), m.Version)
				var pgErr *pgconn.PgError
				require.True(t, errors.As(err, &pgErr), "want the guard's error, got %v", err)
				require.Equal(t, "55000", pgErr.Code)
				require.Contains(t, pgErr.Message, fn)
				v, err := r.Version(context.Background())
				require.NoError(t, err)
				require.Equal(t, m.Version-1, v, "the migration was not recorded")
				require.Equal(t, before, h.texts(`SELECT p.proname::text || md5(p.prosrc) FROM pg_proc p
					WHERE p.pronamespace = $1::regnamespace ORDER BY 1`, db.Schema), "no function changed")
			})
		}
	}
}
