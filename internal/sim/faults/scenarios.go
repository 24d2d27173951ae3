package faults

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/duroxide-pg/migrations/internal/sim/clock"
	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
	"github.com/duroxide-pg/migrations/internal/sim/simconfig"
)

// Scenario is one named fault scenario.
type Scenario struct {
	Name   string
	Config Config // Schema and Restart are the caller's
	Checks Checks
	// NeedsRestart: the scenario restarts the server (Config.Restart must be
	// set; only a server the harness owns can be restarted).
	NeedsRestart bool
}

// defaultLockTimeout is the scenarios' lock timeout T.
const defaultLockTimeout = 500 * time.Millisecond

// base is the shape every scenario shares: 4 dispatchers on 3 hot
// instances, T = 500 ms, 20 ms turns.
func base(d time.Duration) Config {
	return Config{Config: dispatch.Config{
		Common:      simconfig.Common{LockTimeout: defaultLockTimeout, Duration: d},
		Dispatchers: 4, Instances: 3, HistoryEvents: 20, EventBytes: 100, TurnTime: 20 * time.Millisecond}}
}

// uniformSkews are the uniform clock offsets the skew scenarios use, for a
// lock timeout t: -60 s, -2t, 0, +2t, +60 s.
func uniformSkews(t time.Duration) []time.Duration {
	return []time.Duration{-60 * time.Second, -2 * t, 0, 2 * t, 60 * time.Second}
}

// MixedSkews spreads n dispatchers' clocks evenly over [-t/4, +t/4].
func MixedSkews(n int, t time.Duration) []time.Duration { return clock.Spreads(-t/4, t/4, n) }

// Scenarios are the fault scenarios, each running for d:
//
//   - kill: a backend terminated mid-fetch or mid-ack every ~100 ms;
//   - crash: 15% of fetches are followed by a crash of their dispatcher;
//   - timeouts: statement_timeout 25 ms and lock_timeout 5 ms on every
//     dispatcher session;
//   - restart: the server restarted once (fast shutdown + start);
//   - skew<S>: every dispatcher's clock offset by S (uniform, no dead lease
//     allowed), and skew-mixed: offsets within ±T/4.
//
// Every scenario checks exclusion, conservation and the attempt_count
// bound; all but timeouts (whose cancelled acks fail their orchestration,
// as the runtime does) also require every instance to advance.
func Scenarios(d time.Duration) []Scenario {
	var out []Scenario
	kill := base(d)
	kill.KillEvery = 100 * time.Millisecond
	out = append(out, Scenario{Name: "kill", Config: kill, Checks: Checks{RequireAdvance: true}})
	crash := base(d)
	crash.CrashProb = 0.15
	out = append(out, Scenario{Name: "crash", Config: crash, Checks: Checks{RequireAdvance: true}})
	to := base(d)
	to.StatementTimeout, to.SessionLockTimeout = 25*time.Millisecond, 5*time.Millisecond
	out = append(out, Scenario{Name: "timeouts", Config: to})
	rs := base(d + time.Second)
	rs.Restarts = 1
	out = append(out, Scenario{Name: "restart", Config: rs, Checks: Checks{RequireAdvance: true}, NeedsRestart: true})
	for _, s := range uniformSkews(defaultLockTimeout) {
		c := base(d)
		c.Skews = clock.Same(c.Dispatchers, s)
		out = append(out, Scenario{Name: fmt.Sprintf("skew%+dms", s.Milliseconds()), Config: c,
			Checks: Checks{ForbidDeadLeases: true, RequireAdvance: true}})
	}
	mixed := base(d)
	mixed.Skews = MixedSkews(mixed.Dispatchers, defaultLockTimeout)
	out = append(out, Scenario{Name: "skew-mixed", Config: mixed, Checks: Checks{RequireAdvance: true}})
	return out
}

// mixed is a soak round: every fault at once, with parameters drawn from
// rng, for d. withRestart adds one server restart.
func mixed(rng *rand.Rand, d time.Duration, withRestart bool) Scenario {
	c := base(d)
	c.Dispatchers = 2 + rng.IntN(7)
	c.Instances = 1 + rng.IntN(4)
	c.LockTimeout = time.Duration(300+rng.IntN(700)) * time.Millisecond
	c.TurnTime = time.Duration(rng.IntN(int(c.LockTimeout/time.Millisecond)/4)) * time.Millisecond
	c.KillEvery = time.Duration(100+rng.IntN(400)) * time.Millisecond
	c.CrashProb = 0.05 + 0.1*rng.Float64()
	if rng.IntN(2) == 0 {
		c.StatementTimeout = time.Duration(40+rng.IntN(100)) * time.Millisecond
		c.SessionLockTimeout = time.Duration(5+rng.IntN(20)) * time.Millisecond
	}
	c.Skews = MixedSkews(c.Dispatchers, c.LockTimeout)
	if rng.IntN(3) == 0 {
		c.Skews = clock.Same(c.Dispatchers, uniformSkews(c.LockTimeout)[rng.IntN(5)])
	}
	c.RandSeed = rng.Uint64()
	if withRestart {
		c.Restarts = 1
	}
	return Scenario{Name: "mixed", Config: c, NeedsRestart: withRestart}
}
