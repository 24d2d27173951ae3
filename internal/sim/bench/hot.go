package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/duroxide-pg/migrations/internal/sim/settings"
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

// hotScenario runs HotConfig.
type hotScenario struct{ noCells }

// settings: the lock timeout is calibrated when none is given (0), and a
// lock timeout given on the command line is used as given.
func (hotScenario) settings(c *Config, l *settings.List) {
	l.Int(&c.HotHistory, "HotHistory", 5000, 0)
	l.Int(&c.HotDispatchers, "HotDispatchers", 16, 0)
	l.Duration(&c.HotLockTimeout, "HotLockTimeout", 0, 0).
		Flag("hot-lock-timeout", "hot scenario's lock timeout; 0: calibrated at start like the organic repro").
		OnSet(func() { c.CalibrateHotLockTimeout = c.HotLockTimeout == 0 })
	l.After(func() {
		if c.HotLockTimeout == 0 {
			c.CalibrateHotLockTimeout = true
		}
	})
}

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
	if err := r.prepSides(ctx, ScenarioHot, hotConfig(r.cfg), false); err != nil {
		return err
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
