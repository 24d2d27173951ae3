package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/fingerprint"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
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
				if !hasFunction(t, db, fn) {
					// Only an unreleased upstream migration adds it (0033's
					// fetch_work_items): give the schema that migration
					// first, as duroxide-pg's runner would.
					applyInFlight(t, db, inFlightAdding(t, fn))
				}
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

// inFlightAdding is the in-flight upstream migration (a port the tests can
// apply, internal/testenv/upstream) that defines function fn.
func inFlightAdding(t *testing.T, fn string) string {
	t.Helper()
	for _, u := range fingerprint.UnreleasedMigrations() {
		if fingerprint.NameOf(u.Function) == fn && slices.Contains(upstream.InFlight(), u.File) {
			return u.File
		}
	}
	t.Fatalf("no in-flight upstream migration the tests can apply defines %s", fn)
	return ""
}
