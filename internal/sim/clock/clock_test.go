package clock_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/sim/clock"
)

// A fleet's clocks are spread evenly from lo to hi, ends included.
func TestSpreadCoversTheRangeEvenly(t *testing.T) {
	t.Parallel()
	require.Equal(t, []time.Duration{-100 * time.Millisecond, -50 * time.Millisecond, 0, 50 * time.Millisecond, 100 * time.Millisecond},
		clock.Spreads(-100*time.Millisecond, 100*time.Millisecond, 5))
	require.Equal(t, -3*time.Second, clock.Spread(-3*time.Second, 600*time.Millisecond, 0, 4))
	require.Equal(t, 600*time.Millisecond, clock.Spread(-3*time.Second, 600*time.Millisecond, 3, 4))
}

// A lone host runs on the wall clock, whatever the range.
func TestSpreadOfOneHostIsTheWallClock(t *testing.T) {
	t.Parallel()
	require.Equal(t, time.Duration(0), clock.Spread(-time.Second, time.Second, 0, 1))
	require.Equal(t, []time.Duration{0}, clock.Spreads(-time.Second, time.Second, 1))
}

// A skewed clock reads the wall clock plus its offset.
func TestSkewedRunsItsOffsetAhead(t *testing.T) {
	t.Parallel()
	c := clock.New(time.Hour)
	before := time.Now().UnixMilli()
	got := c.NowMs()
	after := time.Now().UnixMilli()
	require.GreaterOrEqual(t, got, before+time.Hour.Milliseconds())
	require.LessOrEqual(t, got, after+time.Hour.Milliseconds())
	require.Equal(t, time.Hour.Milliseconds(), c.OffsetMs())
	require.Equal(t, []time.Duration{time.Second, time.Second}, clock.Same(2, time.Second))
}
