package renewal_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/sim/renewal"
)

func TestRenewalIntervalFollowsTheRuntime(t *testing.T) {
	for _, c := range []struct {
		timeout, want time.Duration
		extend        int64
	}{
		{30 * time.Millisecond, time.Second, 0}, // sub-second: 1 s, and renews by 0 s
		{2 * time.Second, time.Second, 2},
		{5 * time.Second, 3 * time.Second, 5}, // the runtime default: every 3 s
		{2500 * time.Millisecond, 2 * time.Second, 2},
		{15 * time.Second, 13 * time.Second, 15},
		{30 * time.Second, 28 * time.Second, 30},
	} {
		require.Equal(t, c.want, renewal.Interval(c.timeout), "interval for %v", c.timeout)
		require.Equal(t, c.extend, renewal.ExtendSecs(c.timeout), "extension for %v", c.timeout)
	}
}
