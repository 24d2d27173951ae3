package migrations_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/harness/catalog"
	migrations "github.com/duroxide-pg/migrations/sql"
)

// TestEveryFixChangesExactlyTheFunctionsItNames: a fix migration (read
// from sql/) leaves the catalog as it was (tables, columns, indexes,
// signatures and attributes of every function) and changes the body of
// every function its "-- Fixes:" line names, and of no other.
func TestEveryFixChangesExactlyTheFunctionsItNames(t *testing.T) {
	t.Parallel()
	for _, m := range migrations.Fixes() {
		t.Run(m.File, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			before := dbs.New(t, m.Version-1).Runner(t)
			after := dbs.New(t, m.Version).Runner(t)

			catBefore, err := catalog.Take(ctx, before.DB(), before.Schema())
			require.NoError(t, err)
			catAfter, err := catalog.Take(ctx, after.DB(), after.Schema())
			require.NoError(t, err)
			require.Empty(t, catalog.Diff(catBefore, catAfter), "the catalog is unchanged")

			bodiesBefore, err := catalog.Bodies(ctx, before.DB(), before.Schema())
			require.NoError(t, err)
			bodiesAfter, err := catalog.Bodies(ctx, after.DB(), after.Schema())
			require.NoError(t, err)
			var changed []string
			for id, md5 := range bodiesAfter {
				if bodiesBefore[id] != md5 {
					name, _, _ := strings.Cut(id, "(")
					changed = append(changed, name)
				}
			}
			sort.Strings(changed)
			want := slices.Clone(m.Fixes)
			sort.Strings(want)
			require.Equal(t, want, changed, fmt.Sprintf("%s changes the bodies of exactly the functions it names", m.File))
		})
	}
}
