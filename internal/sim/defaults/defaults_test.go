package defaults_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/sim/defaults"
)

// Zero fields take the default; set fields keep their value, and so do
// negative ones, which the configs' Validate rejects.
func TestSetFillsOnlyUnsetFields(t *testing.T) {
	t.Parallel()
	n, neg, set := 0, -3, 7
	defaults.Set(&n, 16)
	defaults.Set(&neg, 16)
	defaults.Set(&set, 16)
	require.Equal(t, []int{16, -3, 7}, []int{n, neg, set})
	d := time.Duration(0)
	defaults.Set(&d, time.Second)
	require.Equal(t, time.Second, d)
}
