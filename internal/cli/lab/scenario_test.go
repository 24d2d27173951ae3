package lab

import (
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every scenario of the lab, repro or bench, has the one shape: a name
// no other has, a summary, flags that register on one flag set beside
// everyone else's, and defaults that pass its own validation whether it
// runs or not.
func TestEveryScenarioHasTheOneShape(t *testing.T) {
	for cmd, list := range map[string][]scenario{"repro": reproScenarios(), "bench": benchScenarios()} {
		fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		seen := map[string]bool{}
		for _, s := range list {
			require.NotEmpty(t, s.name(), cmd)
			require.False(t, seen[scenarioKey(s.name())], "%s: %s registered twice", cmd, s.name())
			seen[scenarioKey(s.name())] = true
			require.NotEmpty(t, s.summary(), "%s %s", cmd, s.name())
			require.NotPanics(t, func() { s.register(fs) }, "%s %s: its flags clash with another's", cmd, s.name())
		}
		require.NoError(t, fs.Parse(nil))
		for _, s := range list {
			require.NoError(t, s.validate(false), "%s %s: defaults, not run", cmd, s.name())
			require.NoError(t, s.validate(true), "%s %s: defaults, run", cmd, s.name())
		}
	}
}
