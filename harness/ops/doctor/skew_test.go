package doctor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/doctor"
)

// The clock check is critical from the pack's lease bound on (the "-- Lease
// bound:" line of sql/, migrations.LeaseBound), a warning below it, and
// its critical message names the bound and what it means for the leases,
// either way round. The host's clock is moved by Options.Now, 3 s on
// either side of the bound: far more than the round trip.
func TestClockSkewIsCriticalFromThePacksLeaseBound(t *testing.T) {
	t.Parallel()
	bound := migrations.LeaseBound()
	require.Positive(t, bound, "the pack states a lease bound")
	d := dbs.New(t, migrations.Latest())
	db := openDB(t, d)
	const margin = 3 * time.Second
	skewed := func(t *testing.T, dbAhead time.Duration) doctor.Finding {
		t.Helper()
		r, err := doctor.Check(context.Background(), db, doctor.Options{Schema: d.Schema,
			Now: func() time.Time { return time.Now().Add(-dbAhead) }})
		require.NoError(t, err)
		require.InDelta(t, dbAhead.Milliseconds(), r.ClockSkewMs, float64(margin.Milliseconds())/2)
		return finding(r, "clock")
	}

	t.Run("the database clock ahead, below the bound: a warning", func(t *testing.T) {
		f := skewed(t, bound-margin)
		require.Equal(t, doctor.Warning, f.Severity, f.Message)
		require.NotContains(t, f.Message, "lease bound")
	})
	t.Run("the database clock ahead, past the bound: critical, naming it", func(t *testing.T) {
		f := skewed(t, bound+margin)
		require.Equal(t, doctor.Critical, f.Severity, f.Message)
		require.Contains(t, f.Message, "ahead of this host")
		require.Contains(t, f.Message, "at or beyond the pack's lease bound ("+bound.String()+")")
		require.Contains(t, f.Message, "gets its leases from its own clock plus "+bound.String())
		require.Contains(t, f.Message, "expired_leases")
		require.Contains(t, f.Action, "NTP")
	})
	t.Run("the database clock behind, past the bound: critical, naming it", func(t *testing.T) {
		f := skewed(t, -(bound + margin))
		require.Equal(t, doctor.Critical, f.Severity, f.Message)
		require.Contains(t, f.Message, "behind this host")
		require.Contains(t, f.Message, "at or beyond the pack's lease bound ("+bound.String()+")")
		require.Contains(t, f.Message, "the leases follow the callers' clocks")
	})
	t.Run("the database clock behind, below the bound: a warning", func(t *testing.T) {
		f := skewed(t, -(bound - margin))
		require.Equal(t, doctor.Warning, f.Severity, f.Message)
	})
}
