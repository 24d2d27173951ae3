package migrations_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
)

// The lease bound has one home, the fixes' "-- Lease bound:" lines: every
// fix that has one says the same bound (migrations.LeaseBound, which
// harness doctor reads), and at the pack's latest every body that starts a
// lease from the database clock is the body of such a fix, for every
// behaviour the pack serves: none takes the later of the two clocks
// unbounded any more.
func TestEveryLeaseFromTheDatabaseClockIsBoundedAtTheLatest(t *testing.T) {
	bound := migrations.LeaseBound()
	require.Positive(t, bound, "the pack states a lease bound")
	var stating []string
	for _, m := range migrations.Fixes() {
		if m.LeaseBoundMs != 0 {
			stating = append(stating, m.File)
			require.Equal(t, bound.Milliseconds(), m.LeaseBoundMs, "%s states another bound", m.File)
		}
	}
	require.NotEmpty(t, stating)

	checked := 0
	for _, m := range migrations.Fixes() {
		for _, fn := range m.Fixes {
			for _, k := range migrations.KnownDefinitions(fn) {
				fix, body, ok := migrations.FixFor(fn, k.BehavesAs, migrations.Latest())
				require.True(t, ok)
				if !strings.Contains(body.Source, "v_db_ms") {
					continue // reads no database clock
				}
				checked++
				require.NotContains(t, body.Source, "greatest(v_now_ms, v_db_ms)", "%s's %s (upstream %d behaviour): unbounded", fix.File, fn, k.BehavesAs)
				require.Contains(t, body.Source, "least(greatest(v_db_ms - v_now_ms, 0), c_lease_bound_ms)", "%s's %s", fix.File, fn)
				require.True(t, slices.Contains(stating, fix.File), "%s's %s has no -- Lease bound: line", fix.File, fn)
			}
		}
	}
	require.GreaterOrEqual(t, checked, 6, "the two fetches, the batched fetch, the three renewals")
}
