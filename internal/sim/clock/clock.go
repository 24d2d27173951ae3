// Package clock is time for the simulators: a simulated host's clock (the
// wall clock plus a fixed skew, read in the epoch milliseconds the runtime
// passes as p_now_ms), how the skews of a simulated fleet are spread, and
// a sleep that a context cuts short.
package clock

import (
	"context"
	"time"
)

// Skewed is a clock that runs a fixed offset ahead of the wall clock
// (behind for a negative offset). The zero value is the wall clock.
type Skewed struct{ offsetMs int64 }

// New returns a clock skew ahead of the wall clock, to the millisecond.
func New(skew time.Duration) Skewed { return Skewed{offsetMs: skew.Milliseconds()} }

// NowMs is the clock's time in epoch milliseconds.
func (c Skewed) NowMs() int64 { return time.Now().UnixMilli() + c.offsetMs }

// OffsetMs is the clock's offset from the wall clock in milliseconds.
func (c Skewed) OffsetMs() int64 { return c.offsetMs }

// Spread is host i's offset (0-based) when n hosts' clocks are spread
// evenly over [lo, hi]: lo + (hi-lo)*i/(n-1). A lone host (n <= 1) runs on
// the wall clock.
func Spread(lo, hi time.Duration, i, n int) time.Duration {
	if n <= 1 {
		return 0
	}
	return lo + time.Duration(float64(hi-lo)*float64(i)/float64(n-1))
}

// Spreads is every offset of Spread(lo, hi, i, n), for i from 0 to n-1.
func Spreads(lo, hi time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = Spread(lo, hi, i, n)
	}
	return out
}

// Same is n offsets all equal to skew.
func Same(n int, skew time.Duration) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = skew
	}
	return out
}

// Sleep waits for d, or until ctx ends, whichever comes first.
func Sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
