package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/harness/sim/bench"
)

func TestBenchUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--rounds", "2"},
		{"--duration", "1ms"},
		{"--scenarios", "nope"},
		{"--scenarios", ","},
		{"extra"},
		{"--bogus"},
	} {
		var out, errOut bytes.Buffer
		env := &Env{Stdout: &out, Stderr: &errOut}
		code := report(env, runBench(context.Background(), env, args))
		require.Equal(t, ExitUsage, code, "%v", args)
		require.Equal(t, 1, strings.Count(errOut.String(), "\n"), "one line for %v: %q", args, errOut.String())
	}
}

func TestBenchHelp(t *testing.T) {
	var out bytes.Buffer
	env := &Env{Stdout: &out, Stderr: &out}
	err := runBench(context.Background(), env, []string{"-h"})
	require.True(t, errors.Is(err, flag.ErrHelp))
	require.Contains(t, out.String(), "-rounds")
	bug, fix := bench.Versions()
	wbug, wfix := bench.WorkerVersions()
	require.Contains(t, out.String(), fmt.Sprintf("migrate (schema %d against %d), worker (schema %d against %d)", bug, fix, wbug, wfix),
		"the help names the versions compared, read from the pack")
	require.Contains(t, benchSummary, "bench")
}

func TestBenchProgressLine(t *testing.T) {
	var out bytes.Buffer
	p := newProgressBar(&out)
	p.update(bench.Progress{Step: 1, Steps: 4, Round: 1, Rounds: 3, Label: "backlog N=1 before", Elapsed: time.Second})
	p.update(bench.Progress{Step: 3, Steps: 4, Round: 1, Rounds: 3, Label: "backlog N=1 after", Elapsed: 4 * time.Second})
	p.done()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2, "not a terminal: one line per step")
	require.Contains(t, lines[0], "1/4 round 1/3 backlog N=1 before")
	require.Contains(t, lines[1], "[############............]")
	require.Contains(t, lines[1], "~4s left")
}
