package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/duroxide-pg/migrations/internal/sim/defaults"
)

// HotConfig is the hot scenario's part of Config: HotDispatchers
// dispatchers on one instance with HotHistory events.
type HotConfig struct {
	HotHistory     int `json:"hot_history_events"`
	HotDispatchers int `json:"hot_dispatchers"`
	// HotLockTimeout is the hot scenario's lock timeout, unless
	// CalibrateHotLockTimeout (the default) measures it at start, like the
	// organic repro (dispatch.Calibrate); it must then be 0.
	HotLockTimeout          time.Duration `json:"-"`
	CalibrateHotLockTimeout bool          `json:"-"`
}

func hotDefaults() HotConfig {
	return HotConfig{HotHistory: 5000, HotDispatchers: 16, CalibrateHotLockTimeout: true}
}

// withDefaults fills the zero fields; the lock timeout is calibrated when
// none is given.
func (c HotConfig) withDefaults() HotConfig {
	d := hotDefaults()
	defaults.Set(&c.HotHistory, d.HotHistory)
	defaults.Set(&c.HotDispatchers, d.HotDispatchers)
	if c.HotLockTimeout == 0 {
		c.CalibrateHotLockTimeout = true
	}
	return c
}

// hotScenario runs HotConfig.
type hotScenario struct{ noCells }

func (hotScenario) setDefaults(c *Config) { c.HotConfig = c.HotConfig.withDefaults() }

func (hotScenario) name() string { return ScenarioHot }

func (hotScenario) steps(Config) int { return 2 }

func (hotScenario) validate(c Config, chosen bool) error {
	if c.CalibrateHotLockTimeout && c.HotLockTimeout != 0 {
		return fmt.Errorf("bench: HotLockTimeout %v with CalibrateHotLockTimeout: give one", c.HotLockTimeout)
	}
	if chosen && !c.CalibrateHotLockTimeout && c.HotLockTimeout < time.Millisecond {
		return fmt.Errorf("bench: HotLockTimeout %v: give at least 1ms, or CalibrateHotLockTimeout", c.HotLockTimeout)
	}
	return nil
}

// prepare seeds both sides, then calibrates the lock timeout on the
// before side when asked to.
func (hotScenario) prepare(ctx context.Context, r *runState) error {
	for _, side := range []string{sideBefore, sideAfter} {
		if err := r.prep(ctx, ScenarioHot, side, r.versionOf(side), hotConfig(r.cfg), false); err != nil {
			return err
		}
	}
	if !r.cfg.CalibrateHotLockTimeout {
		return nil
	}
	r.phase("calibrating the hot lock timeout")
	cal, err := calibrateHot(ctx, r.src, r.schemas[schemaKey{ScenarioHot, sideBefore}], r.cfg)
	if err != nil {
		return err
	}
	r.res.HotCalibration = &cal
	r.cfg.HotLockTimeout = cal.LockTimeout
	r.res.Settings.HotLockTimeoutMs = cal.LockTimeoutMs
	return nil
}

func (hotScenario) cells(c Config, cmp Comparison[Sample]) []Cell {
	return []Cell{{Scenario: ScenarioHot, Dispatchers: c.HotDispatchers, Instances: 1, HistoryEvents: c.HotHistory,
		LockTimeoutMs: c.HotLockTimeout.Milliseconds(), DurationS: c.Duration.Seconds(), Comparison: cmp}}
}

func (hotScenario) round(ctx context.Context, r *runState, round int) error {
	return r.dispatchCell(ctx, round, ScenarioHot, r.cfg.HotDispatchers, hotConfig(r.cfg))
}
