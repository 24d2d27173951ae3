// Package renewal is the duroxide runtime's lease renewal task, which both
// the orchestration dispatchers (dispatch) and the activity workers (worker)
// run while they hold a lease: its period and extension for a lock timeout,
// and the task itself.
package renewal

import (
	"context"
	"math"
	"time"
)

// Interval is the runtime's renewal period for a lock timeout: for
// timeouts of 15 s or more, timeout minus the 2 s buffer (at least 1 s);
// below, ceil(timeout/2) in whole seconds, at least 1 s.
func Interval(timeout time.Duration) time.Duration {
	const buffer = 2 * time.Second
	if timeout >= 15*time.Second {
		return max(timeout-min(buffer, timeout), time.Second)
	}
	half := math.Max(math.Ceil(timeout.Seconds()*0.5), 1)
	return time.Duration(half) * time.Second
}

// ExtendSecs is what duroxide-pg passes to
// renew_orchestration_item_lock: the timeout truncated to whole seconds
// (0 for a sub-second timeout).
func ExtendSecs(timeout time.Duration) int64 { return int64(timeout / time.Second) }

// Start starts the runtime's renewal task of a lease taken with lock
// timeout timeout, as the dispatchers and the activity workers run it: the
// first renewal one Interval(timeout) after the start, then one every
// interval, each asking for ExtendSecs(timeout); it stops for good at the first error. renew
// makes one renewal and returns how to record it; a renewal that fails
// because the task is being stopped is not recorded. The returned function
// stops the task and waits for it.
func Start(ctx context.Context, timeout time.Duration, renew func(ctx context.Context, extendSecs int64) (record func(), err error)) (stop func()) {
	interval := Interval(timeout)
	extend := ExtendSecs(timeout)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-tick.C:
			}
			record, err := renew(rctx, extend)
			if rctx.Err() != nil && err != nil {
				return
			}
			record()
			if err != nil {
				return
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
