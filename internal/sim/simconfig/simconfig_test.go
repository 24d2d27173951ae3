package simconfig_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
	"github.com/duroxide-pg/migrations/internal/sim/simconfig"
	"github.com/duroxide-pg/migrations/internal/sim/worker"
)

func TestWithDefaultsFillsOnlyTheZeroFields(t *testing.T) {
	require.Equal(t, simconfig.Common{LockTimeout: 3 * time.Second, PollInterval: 100 * time.Millisecond, Duration: 10 * time.Second},
		simconfig.Common{}.WithDefaults(3*time.Second))
	set := simconfig.Common{Schema: "s", LockTimeout: time.Second, PollInterval: time.Millisecond, Duration: time.Minute}
	require.Equal(t, set, set.WithDefaults(3*time.Second))
}

func TestValidateNamesTheFieldAndTheSimulatorWrapsIt(t *testing.T) {
	require.EqualError(t, simconfig.Common{LockTimeout: time.Second}.Validate(), "Config.Schema is empty")
	require.EqualError(t, simconfig.Common{Schema: "s", LockTimeout: time.Microsecond}.Validate(), "LockTimeout 1µs is under 1 ms")
	require.NoError(t, simconfig.Common{Schema: "s", LockTimeout: time.Millisecond}.Validate())
	require.EqualError(t, dispatch.Config{}.Validate(), "dispatch: Config.Schema is empty")
	require.EqualError(t, worker.Config{Common: simconfig.Common{Schema: "s"}}.Validate(), "worker: LockTimeout 0s is under 1 ms")
}

// A negative duration or count is an error, never silently a default.
func TestANegativeSettingIsRefusedNotDefaulted(t *testing.T) {
	_, err := simconfig.Ready(dispatch.Config{Common: simconfig.Common{Schema: "s", LockTimeout: -time.Second}})
	require.EqualError(t, err, "dispatch: LockTimeout -1s is under 1 ms")
	_, err = simconfig.Ready(dispatch.Config{Common: simconfig.Common{Schema: "s", Duration: -time.Second}})
	require.EqualError(t, err, "dispatch: PollInterval 100ms and Duration -1s must not be negative")
	_, err = simconfig.Ready(dispatch.Config{Common: simconfig.Common{Schema: "s"}, Dispatchers: -1})
	require.ErrorContains(t, err, "must not be negative")
	_, err = simconfig.Ready(worker.Config{Common: simconfig.Common{Schema: "s"}, Slots: -2})
	require.ErrorContains(t, err, "must not be negative")
}

func TestReadyIsTheConfigWithItsDefaultsOrWhyItCannotRun(t *testing.T) {
	cfg, err := simconfig.Ready(worker.Config{Common: simconfig.Common{Schema: "s"}})
	require.NoError(t, err)
	require.Equal(t, worker.DefaultLockTimeout, cfg.LockTimeout)
	require.Equal(t, worker.DefaultRuntimes, cfg.Runtimes)
	_, err = simconfig.Ready(dispatch.Config{})
	require.EqualError(t, err, "dispatch: Config.Schema is empty")
}

// The shared fields stand in the simulators' configs' JSON under their own
// keys, as when each config declared them.
func TestTheSharedFieldsFlattenIntoEachConfigsJSON(t *testing.T) {
	run := simconfig.Common{Schema: "s", LockTimeout: 2, PollInterval: 3, Duration: 4}
	for _, cfg := range []any{dispatch.Config{Common: run}, worker.Config{Common: run}} {
		b, err := json.Marshal(cfg)
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, json.Unmarshal(b, &m))
		require.NotContains(t, m, "Run")
		require.Equal(t, "s", m["schema"])
		require.Equal(t, 2.0, m["lock_timeout_ns"])
		require.Equal(t, 3.0, m["poll_interval_ns"])
		require.Equal(t, 4.0, m["duration_ns"])
	}
}
