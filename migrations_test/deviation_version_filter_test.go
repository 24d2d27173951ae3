package migrations_test

// The pack's deviations from upstream's behaviour are listed in
// docs/OPERATIONS.md ("Where the pack differs from upstream"). This file
// proves the one that is not a fix: the version filter's packed version.

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
)

// TestVersionFilterPacksInBigint: fetch_orchestration_item's version filter
// packs an execution's pinned version as major*1000000 + minor*1000 + patch.
// Upstream computes it in 32-bit integers, so a pinned major of 2148 or more
// overflows and the fetch fails with 22003 (numeric_value_out_of_range) for
// every dispatcher that passes a filter while such an execution waits. The
// pack computes it in bigint at every version from 0013 on (its 0020 fix
// included) and returns the row. The difference is listed, not matched:
// upstream's failing call fetches nothing for anyone, and no caller can rely
// on it.
func TestVersionFilterPacksInBigint(t *testing.T) {
	t.Parallel()
	const packed = 2_148_000_000 // 2148.0.0, above 2^31-1
	try := func(h *schemaDB) (*orchItem, error) {
		h.startInstance("far-future", "P", "1.0.0", clock0, "pinned_duroxide_version", pinVersion(2148, 0, 0))
		h.enqueueOrch("far-future", externalItem("far-future", "go"), clock0+100)
		return h.fetchOrchErr(clock0+1_000, lockMs, packed, packed)
	}
	for _, v := range []int64{19, migrations.Latest()} {
		t.Run(fmt.Sprintf("pack %04d", v), func(t *testing.T) {
			t.Parallel()
			it, err := try(newAtVersion(t, v).on(t))
			require.NoError(t, err)
			require.NotNil(t, it, "the pinned execution is in range and is fetched")
			require.Equal(t, "far-future", it.Instance)
		})
	}
	t.Run("upstream's own text (real provider)", func(t *testing.T) {
		t.Parallel()
		_, err := try(openUpstream(t).on(t))
		requirePgError(t, err, "22003", "integer out of range")
	})
}
