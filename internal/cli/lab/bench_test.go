package lab

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/callcost"
	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/migrateload"
	"github.com/duroxide-pg/migrations/internal/planshape"
	"github.com/duroxide-pg/migrations/internal/sim/bench"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

func TestBenchUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--rounds", "2"},
		{"--duration", "1ms"},
		{"--scenarios", "nope"},
		{"--scenarios", ","},
		{"extra"},
		{"--bogus"},
		{"--scale-blocked", "1k"},
		{"--scale-blocked", ""},
		{"--scale-blocked", "0"},
		{"--scale-completed", "-1"},
		{"--scale-calls", "3"},
		{"--scale-idle-dispatchers", "0"},
		{"--scale-idle-duration", "1ms"},
		{"--hot-lock-timeout", "-1s"},
		{"--scenarios", "migrate-load", "--migrate-load-rate", "0"},
		{"--scenarios", "migrate-load", "--migrate-load-per-instance", "0"},
		{"--scenarios", "migrate-load", "--migrate-load-messages", "1k"},
		{"--scenarios", "migrate-load", "--migrate-load-messages", "-1"},
	} {
		var out, errOut bytes.Buffer
		code := Run(context.Background(), append([]string{"bench"}, args...), &out, &errOut)
		require.Equal(t, cli.ExitUsage, code, "%v", args)
		require.Equal(t, 1, strings.Count(errOut.String(), "\n"), "one line for %v: %q", args, errOut.String())
	}
}

func TestBenchHelp(t *testing.T) {
	var out bytes.Buffer
	env := &cli.Env{Program: "harness-lab", Stdout: &out, Stderr: &out}
	err := runBench(context.Background(), env, []string{"-h"})
	require.True(t, errors.Is(err, flag.ErrHelp))
	require.Contains(t, out.String(), "-rounds")
	bug, fix, verr := bench.Versions()
	require.NoError(t, verr)
	wbug, wfix, verr := bench.WorkerVersions()
	require.NoError(t, verr)
	require.Contains(t, out.String(), fmt.Sprintf("migrate (schema %d against %d), worker (schema %d against %d)", bug, fix, wbug, wfix),
		"the help names the versions compared, read from the pack")
	require.Contains(t, benchSummary(), "bench")
	before, after, verr := bench.ScaleVersions()
	require.NoError(t, verr)
	require.Contains(t, out.String(), fmt.Sprintf("scale (schema %d against %d)", before, after),
		"the scale scenario names its versions too: before the first fetch fix and the pack's latest")
	for _, flag := range []string{"-scale-blocked", "-scale-completed", "-scale-calls", "-scale-idle-dispatchers", "-scale-idle-duration", "-hot-lock-timeout"} {
		require.Contains(t, out.String(), flag)
	}
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

func TestBenchScaleAtTinySizesPrintsTheScaleTableAndTargets(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := run(t, "bench", "--scenarios", "scale", "--scale-blocked", "10,100", "--scale-completed", "0,20",
		"--scale-calls", "7", "--scale-idle-dispatchers", "2", "--scale-idle-duration", "200ms", "--report", dir)
	require.Equal(t, cli.ExitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	before, after, verr := bench.ScaleVersions()
	require.NoError(t, verr)
	for _, want := range []string{fmt.Sprintf("before (schema %d, before the first fetch fix) and after (schema %d, the pack's latest)", before, after),
		"spread K=100", "fan_in K=10", "idle N=2 K=100", "completed C=20", "one-row fetch, steady", "server CPU per second",
		"scale spread: one-row fetch at K=100 within 2x of K=10 (after)", "scale: fetch and cycle cost flat from 0 to 20 completed instances (after)"} {
		require.Contains(t, stdout, want)
	}
	require.NotContains(t, stdout, "backlog N=8", "only the scale scenario's targets when only it ran")
	for _, f := range []string{bench.ReportFile, bench.ScaleFile, bench.JSONFile} {
		require.FileExists(t, filepath.Join(dir, f))
	}
}

// `bench --scenarios migrate-load` at two tiny sizes: the table on stdout,
// a row per start state, size and queue, the targets, and the report
// files; bench.Run's own report is not written when only this scenario
// runs.
func TestBenchMigrateLoadAtATinySize(t *testing.T) {
	upstream.Require(t)
	dir := t.TempDir()
	code, stdout, stderr := run(t, "bench", "--scenarios", "migrate-load", "--migrate-load-messages", "200,2000",
		"--migrate-load-per-instance", "10", "--migrate-load-rate", "50", "--report", dir)
	require.Equal(t, cli.ExitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	starts, err := migrateload.Starts(func(context.Context, *dbconn.Source, string) error { return nil })
	require.NoError(t, err)
	for _, s := range starts {
		for _, size := range []string{"200 (20), 200", "2000 (200), 2000"} {
			for _, q := range migrateload.Queues {
				require.Regexp(t, fmt.Sprintf(`\| %s, to %d \| %s \| 50/s each \| [0-9.]+ s \| %s \|`, regexp.QuoteMeta(s.Name), migrations.Latest(), regexp.QuoteMeta(size), q), stdout)
			}
		}
		for _, q := range migrateload.Queues {
			require.Contains(t, stdout, fmt.Sprintf("| %s | %s | longest wait from 200 to 2000 |", s.Name, q), "the targets compare the sizes")
		}
	}
	require.FileExists(t, filepath.Join(dir, migrateload.ReportFile))
	require.FileExists(t, filepath.Join(dir, migrateload.JSONFile))
	require.NoFileExists(t, filepath.Join(dir, bench.ReportFile), "only migrate-load ran")
}

// bench --scenarios plans at a tiny size: every cell on both sides, the
// targets judged on the pack's latest, the report files.
func TestBenchPlansAtATinySize(t *testing.T) {
	upstream.Require(t)
	dir := t.TempDir()
	code, stdout, stderr := run(t, "bench", "--scenarios", "plans", "--plans-rows", "500", "--report", dir)
	require.Equal(t, cli.ExitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	latest := fmt.Sprintf("pack %04d", migrations.Latest())
	for _, c := range planshape.Cells(orch.RuntimeFilter()) {
		require.Contains(t, stdout, fmt.Sprintf("| %s (500) | upstream 1..21 and 23 |", c.Name))
		require.Contains(t, stdout, fmt.Sprintf("| %s (500) | %s |", c.Name, latest))
	}
	md, err := os.ReadFile(filepath.Join(dir, planshape.ReportFile))
	require.NoError(t, err)
	require.Contains(t, string(md), "## Targets")
	require.Contains(t, string(md), latest+", fetch_work_item, items scheduled for later: rows read from the 6th call on")
	require.FileExists(t, filepath.Join(dir, planshape.JSONFile))
	require.NoFileExists(t, filepath.Join(dir, bench.ReportFile), "only plans ran")

	code, _, stderr = run(t, "bench", "--scenarios", "plans", "--plans-rows", "0")
	require.Equal(t, cli.ExitUsage, code)
	require.Contains(t, stderr, "--plans-rows 0")
}

func TestBenchCallsAtATinySize(t *testing.T) {
	upstream.Require(t)
	dir := t.TempDir()
	code, stdout, stderr := run(t, "bench", "--scenarios", "calls", "--calls-count", "20", "--report", dir)
	require.Equal(t, cli.ExitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	latest := fmt.Sprintf("pack %04d", migrations.Latest())
	for _, c := range callcost.Cells(0, 0) {
		for _, side := range []string{"upstream 1..21 and 23", latest, latest + ", no SET search_path", latest + ", no head upkeep"} {
			require.Contains(t, stdout, fmt.Sprintf("| %s | %s |", c.Name, side))
		}
	}
	md, err := os.ReadFile(filepath.Join(dir, callcost.ReportFile))
	require.NoError(t, err)
	require.Contains(t, string(md), "## What the latest adds, and where")
	// The server timed every call: each function the latest's enqueue runs
	// (its trigger and the heads' helper) has a time of its own.
	require.Regexp(t, `\| enqueue_orchestrator_work, a new instance \| `+latest+` \| [0-9.]+ \|.*orchestrator_queue_heads_after_insert [0-9.]+`, string(md))
	require.FileExists(t, filepath.Join(dir, callcost.JSONFile))
	require.NoFileExists(t, filepath.Join(dir, bench.ReportFile), "only calls ran")

	code, _, stderr = run(t, "bench", "--scenarios", "calls", "--calls-count", "0")
	require.Equal(t, cli.ExitUsage, code)
	require.Contains(t, stderr, "--calls-count 0")
}

// The bench command's help names every scenario from the registries
// (package bench's and the lab's own), not from a list of its own: a new
// scenario shows up without an edit here.
func TestBenchHelpNamesEveryScenarioFromTheRegistries(t *testing.T) {
	var out bytes.Buffer
	env := &cli.Env{Program: "harness-lab", Stdout: &out, Stderr: &out}
	require.True(t, errors.Is(runBench(context.Background(), env, []string{"-h"}), flag.ErrHelp))
	for _, d := range bench.Described() {
		require.Contains(t, benchSummary(), d.Name)
		require.Contains(t, out.String(), d.Name)
		if d.Summary != "" {
			require.Contains(t, out.String(), fmt.Sprintf("%s (%s)", d.Name, d.Summary))
		}
	}
	for _, s := range benchScenarios() {
		require.Contains(t, benchSummary(), s.name())
		require.Contains(t, out.String(), fmt.Sprintf("%s (%s; not run unless named)", s.name(), s.summary()))
		if r, ok := s.(ownReport); ok {
			require.Contains(t, out.String(), fmt.Sprintf("%s: %s", s.name(), strings.Join(r.reportFiles(), " and ")))
		}
	}
	require.Len(t, benchNames(), len(bench.Described())+len(benchScenarios()))
}
