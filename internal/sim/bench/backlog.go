package bench

import (
	"context"
	"time"

	"github.com/duroxide-pg/migrations/internal/sim/settings"
)

// BacklogConfig is the backlog scenario's part of Config: BacklogInstances
// instances with BacklogHistory events each, fetched and acked by each of
// BacklogDispatchers dispatchers at BacklogLockTimeout.
type BacklogConfig struct {
	BacklogInstances   int           `json:"backlog_instances"`
	BacklogHistory     int           `json:"backlog_history_events"`
	BacklogDispatchers []int         `json:"backlog_dispatchers"`
	BacklogLockTimeout time.Duration `json:"-"`
}

// backlogScenario runs BacklogConfig.
type backlogScenario struct{ noCells }

func (backlogScenario) settings(c *Config, l *settings.List) {
	l.Int(&c.BacklogInstances, "BacklogInstances", 200, 0)
	l.Int(&c.BacklogHistory, "BacklogHistory", 500, 0)
	l.Ints(&c.BacklogDispatchers, "BacklogDispatchers", []int{1, 4, 8, 16}, 1)
	l.Duration(&c.BacklogLockTimeout, "BacklogLockTimeout", 100*time.Millisecond, 0)
}

func (backlogScenario) name() string { return backlog }

func (backlogScenario) steps(c Config) int { return 2 * len(c.BacklogDispatchers) }

func (backlogScenario) prepare(ctx context.Context, r *runState) error {
	return r.prepSides(ctx, backlog, backlogConfig(r.cfg, 1), false)
}

func (backlogScenario) cells(c Config, cmp Comparison[Sample]) []Cell {
	var out []Cell
	for _, n := range c.BacklogDispatchers {
		out = append(out, Cell{Scenario: backlog, Dispatchers: n, Instances: c.BacklogInstances, HistoryEvents: c.BacklogHistory,
			LockTimeoutMs: c.BacklogLockTimeout.Milliseconds(), DurationS: c.Duration.Seconds(), Comparison: cmp})
	}
	return out
}

func (backlogScenario) round(ctx context.Context, r *runState, round int) error {
	for _, n := range r.cfg.BacklogDispatchers {
		if err := r.dispatchCell(ctx, round, backlog, n, backlogConfig(r.cfg, n)); err != nil {
			return err
		}
	}
	return nil
}
