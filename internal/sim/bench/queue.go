package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/duroxide-pg/migrations/internal/sim/settings"
)

// QueueConfig is the queue-only scenario's part of Config: QueueInstances
// instances without history, each of QueueDispatchers dispatchers on both
// sides and on the bare queue (runBareCell), at QueueLockTimeout.
type QueueConfig struct {
	QueueInstances   int           `json:"queue_instances"`
	QueueDispatchers []int         `json:"queue_dispatchers"`
	QueueLockTimeout time.Duration `json:"-"`
}

// queueScenario runs QueueConfig.
type queueScenario struct{ noCells }

func (queueScenario) settings(c *Config, l *settings.List) {
	l.Int(&c.QueueInstances, "QueueInstances", 2000, 0)
	l.Ints(&c.QueueDispatchers, "QueueDispatchers", []int{1, 8}, 1)
	l.Duration(&c.QueueLockTimeout, "QueueLockTimeout", 100*time.Millisecond, 0)
}

func (queueScenario) name() string { return queueOnly }

func (queueScenario) steps(c Config) int { return 3 * len(c.QueueDispatchers) }

func (queueScenario) prepare(ctx context.Context, r *runState) error {
	if err := r.prepSides(ctx, queueOnly, queueConfig(r.cfg, 1), true); err != nil {
		return err
	}
	return r.prep(ctx, queueOnly, sideBare, r.after, queueConfig(r.cfg, 1), true)
}

func (queueScenario) cells(c Config, cmp Comparison[Sample]) []Cell {
	var out []Cell
	for _, n := range c.QueueDispatchers {
		out = append(out, Cell{Scenario: queueOnly, Dispatchers: n, Instances: c.QueueInstances, HistoryEvents: 0,
			LockTimeoutMs: c.QueueLockTimeout.Milliseconds(), DurationS: c.Duration.Seconds(), Comparison: cmp})
	}
	return out
}

func (queueScenario) round(ctx context.Context, r *runState, round int) error {
	for _, n := range r.cfg.QueueDispatchers {
		if err := r.dispatchCell(ctx, round, queueOnly, n, queueConfig(r.cfg, n)); err != nil {
			return err
		}
		c := r.cellOf[(&Cell{Scenario: queueOnly, Dispatchers: n}).Name()]
		r.note(round, c.Name()+" bare")
		sample, err := runBareCell(ctx, r.src, r.schemas[schemaKey{queueOnly, sideBare}], n, r.cfg, r.cpu)
		if err != nil {
			return fmt.Errorf("bench: %s bare round %d: %w", c.Name(), round, err)
		}
		c.record(round, sideBare, sample)
	}
	return nil
}
