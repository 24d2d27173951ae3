package repro

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The organic and worker repros' settings are checked where their
// defaults are, before anything connects.
func TestCheckSettingsRefusesWhatCannotRun(t *testing.T) {
	require.NoError(t, OrganicDefaults().CheckSettings())
	for name, edit := range map[string]func(*OrganicConfig){
		"no dispatcher":         func(c *OrganicConfig) { c.Dispatchers = 0 },
		"no instance":           func(c *OrganicConfig) { c.Instances = 0 },
		"a negative history":    func(c *OrganicConfig) { c.HistoryEvents = -1 },
		"an empty event":        func(c *OrganicConfig) { c.EventBytes = 0 },
		"a negative lock":       func(c *OrganicConfig) { c.LockTimeout = -time.Second },
		"no poll interval":      func(c *OrganicConfig) { c.PollInterval = 0 },
		"a negative turn":       func(c *OrganicConfig) { c.TurnTime = -time.Millisecond },
		"no duration":           func(c *OrganicConfig) { c.Duration = 0 },
		"a negative clock skew": func(c *OrganicConfig) { c.Skew = -time.Millisecond },
	} {
		c := OrganicDefaults()
		edit(&c)
		require.Error(t, c.CheckSettings(), name)
	}

	require.NoError(t, WorkerDefaults().CheckSettings())
	for name, edit := range map[string]func(*WorkerConfig){
		"no runtime":                  func(c *WorkerConfig) { c.Runtimes = 0 },
		"no slot":                     func(c *WorkerConfig) { c.Slots = 0 },
		"no duration":                 func(c *WorkerConfig) { c.Duration = 0 },
		"a negative lock":             func(c *WorkerConfig) { c.LockTimeout = -time.Second },
		"a lock not in whole seconds": func(c *WorkerConfig) { c.LockTimeout = 1500 * time.Millisecond },
	} {
		c := WorkerDefaults()
		edit(&c)
		require.Error(t, c.CheckSettings(), name)
	}
}
