package lab

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/sim/repro"
)

func TestWorkerReproUsageErrors(t *testing.T) {
	bug, fix, verr := repro.WorkerVersions()
	require.NoError(t, verr)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"repro", "sideways"}, "worker-minimal, worker, runtime, upgrade or all"},
		{[]string{"repro", "worker", "extra"}, "[minimal|organic|worker-minimal|worker|runtime|upgrade|all]"},
		{[]string{"repro", "worker", "--worker-versions", "19,20"}, fmt.Sprintf("compares versions %d and %d only", bug, fix)},
		{[]string{"repro", "all", "--worker-versions", fmt.Sprintf("%d,%d", bug, fix-1)}, "worker repro compares"},
		{[]string{"repro", "worker-minimal", "--worker-versions", fmt.Sprintf("%d,%d", bug, migrations.Latest()+1)}, fmt.Sprintf("between 1 and %d", migrations.Latest())},
		{[]string{"repro", "worker-minimal", "--worker-versions", "24"}, "exactly two versions"},
		{[]string{"repro", "worker", "--worker-runtimes", "0"}, "worker: worker-runtimes 0: at least 1"},
		{[]string{"repro", "worker", "--worker-slots", "0"}, "worker: worker-slots 0: at least 1"},
		{[]string{"repro", "worker", "--worker-duration", "0s"}, "worker: worker-duration 0s: at least 1ns"},
		{[]string{"repro", "worker", "--worker-lock-timeout", "1500ms"}, "whole seconds"},
		{[]string{"repro", "worker", "--worker-bogus", "1"}, "flag provided but not defined"},
	} {
		t.Run(strings.Join(tc.args[1:], " "), func(t *testing.T) {
			code, out, errOut := run(t, tc.args...)
			require.Equal(t, cli.ExitUsage, code, "stdout: %s", out)
			require.Contains(t, errOut, tc.want)
			require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
		})
	}
}

func TestReproHelpListsTheWorkerFlags(t *testing.T) {
	code, out, _ := run(t, "repro", "-h")
	require.Equal(t, cli.ExitOK, code)
	for _, f := range []string{"-worker-versions", "-worker-runtimes", "-worker-slots", "-worker-duration", "-worker-lock-timeout"} {
		require.Contains(t, out, f)
	}
	for _, s := range reproScenarios() {
		require.Contains(t, out, fmt.Sprintf("  %-15s %s\n", s.name(), s.summary()), "the help lists every repro with what it shows")
	}
	require.Equal(t, []string{"minimal", "organic", "worker-minimal", "worker", "runtime", "upgrade"}, reproKinds(), "what `repro all` runs, in order")
	require.Equal(t, repro.Kinds(), reproKinds(), "the lab's repros are the report's, in its order")
}
