package faults_test

import (
	"context"
	"testing"
	"time"

	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
	"github.com/duroxide-pg/migrations/internal/sim/faults"
	"github.com/duroxide-pg/migrations/internal/sim/simconfig"
)

// fuzzConfig maps fuzz inputs onto a bounded scenario: 1-8 dispatchers,
// lock timeout 100-1100 ms, turn time up to half of it, one uniform skew
// (within ±60 s) or a mixed fleet (within ±T/4), and a fault mask (bit 0
// kills, bit 1 crashes, bit 2 low statement/lock timeouts).
func fuzzConfig(dispatchers uint8, lockMs, turnMs uint16, skewMs int32, mixed bool, faultMask uint8, seed uint64) (faults.Config, faults.Checks) {
	c := faults.Config{
		Config: dispatch.Config{
			Common:        simconfig.Common{LockTimeout: time.Duration(100+int(lockMs%1001)) * time.Millisecond, Duration: 1200 * time.Millisecond},
			Dispatchers:   1 + int(dispatchers%8),
			Instances:     2,
			HistoryEvents: 10,
		},
		RandSeed: seed | 1,
	}
	c.TurnTime = time.Duration(int(turnMs)%(int(c.LockTimeout/time.Millisecond)/2+1)) * time.Millisecond
	skew := time.Duration(skewMs%60_001) * time.Millisecond
	if mixed {
		c.Skews = faults.MixedSkews(c.Dispatchers, c.LockTimeout)
	} else {
		c.Skews = make([]time.Duration, c.Dispatchers)
		for i := range c.Skews {
			c.Skews[i] = skew
		}
	}
	if faultMask&1 != 0 {
		c.KillEvery = 150 * time.Millisecond
	}
	if faultMask&2 != 0 {
		c.CrashProb = 0.1
	}
	if faultMask&4 != 0 {
		c.StatementTimeout, c.SessionLockTimeout = 40*time.Millisecond, 5*time.Millisecond
	}
	// Exclusion, conservation and the attempt_count bound always; no dead
	// lease with a uniform skew and no fault that delays the lease read.
	return c, faults.Checks{ForbidDeadLeases: !mixed && faultMask == 0}
}

// FuzzInvariants: every invariant holds at the pack's latest version for
// any scenario the inputs describe. The seed corpus (testdata/fuzz) runs in
// plain `go test`, about 1.5 s per entry; `make fuzz` explores.
func FuzzInvariants(f *testing.F) {
	f.Fuzz(func(t *testing.T, dispatchers uint8, lockMs, turnMs uint16, skewMs int32, mixed bool, faultMask uint8, seed uint64) {
		cfg, checks := fuzzConfig(dispatchers, lockMs, turnMs, skewMs, mixed, faultMask, seed)
		db := dbs.New(t, latest)
		cfg.Schema = db.Schema
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := faults.Run(ctx, db.Source, cfg, checks)
		if err != nil {
			t.Fatal(err)
		}
		if err := res.Report.Err(); err != nil {
			t.Fatalf("config %+v: %v\n%s", cfg, err, res.Line())
		}
		t.Log(res.Line())
	})
}
