// Package simconfig holds the run-level settings that both simulators
// (package dispatch's orchestration dispatchers and package worker's
// activity workers) take in the same sense: the schema they run against,
// the lock timeout they fetch with, how long they wait after an empty
// fetch and how long they run. Each simulator's Config embeds Common, so that
// one field means one thing, is documented once and is checked once.
package simconfig

import (
	"errors"
	"fmt"
	"time"

	"github.com/duroxide-pg/migrations/internal/sim/defaults"
)

// Common is what a simulated run shares with every simulator. Embedded
// without a tag, its fields stand in a Config's JSON as the Config's own.
type Common struct {
	// Schema holds the duroxide-pg objects (required).
	Schema string `json:"schema"`
	// LockTimeout is the lock timeout the simulated runtime fetches with,
	// and the extension its renewals ask for (in whole seconds, as
	// duroxide-pg sends it). Its default is each simulator's (the
	// runtime's for the queue it works).
	LockTimeout time.Duration `json:"lock_timeout_ns"`
	// PollInterval is the minimum poll interval: how long a loop whose
	// fetch found nothing waits before it fetches again. Default 100 ms.
	PollInterval time.Duration `json:"poll_interval_ns"`
	// Duration is how long the loops fetch. Default 10 s.
	Duration time.Duration `json:"duration_ns"`
}

// Defaults of Common's fields but LockTimeout.
const (
	DefaultPollInterval = 100 * time.Millisecond
	DefaultDuration     = 10 * time.Second
)

// WithDefaults fills the zero fields: LockTimeout with lockTimeout (the
// caller's default), the others with DefaultPollInterval and
// DefaultDuration.
func (r Common) WithDefaults(lockTimeout time.Duration) Common {
	defaults.Set(&r.LockTimeout, lockTimeout)
	defaults.Set(&r.PollInterval, DefaultPollInterval)
	defaults.Set(&r.Duration, DefaultDuration)
	return r
}

// Validate rejects settings no run can use: no schema, a lock timeout
// under a millisecond, a negative poll interval or duration. Its errors name the field, not the simulator: the
// caller wraps them with its package's name.
func (r Common) Validate() error {
	switch {
	case r.Schema == "":
		return errors.New("Config.Schema is empty")
	case r.LockTimeout < time.Millisecond:
		return fmt.Errorf("LockTimeout %v is under 1 ms", r.LockTimeout)
	case r.PollInterval < 0 || r.Duration < 0:
		return fmt.Errorf("PollInterval %v and Duration %v must not be negative", r.PollInterval, r.Duration)
	}
	return nil
}

// Checked is a simulator's config: it fills its zero fields and rejects
// what cannot run.
type Checked[C any] interface {
	WithDefaults() C
	Validate() error
}

// Ready is cfg with its defaults, or the reason it cannot run: what every
// entry point of a simulator (its Run, its Seed) starts with.
func Ready[C Checked[C]](cfg C) (C, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		var zero C
		return zero, err
	}
	return cfg, nil
}
