package migrateload

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/packfacts"
)

func TestValidateRefusesWhatCannotBeMeasured(t *testing.T) {
	ok := Full()
	ok.To = 31
	require.NoError(t, ok.Validate())
	for name, mutate := range map[string]func(*Load){
		"no target":           func(l *Load) { l.To = 0 },
		"no instances":        func(l *Load) { l.Instances = 0 },
		"negative work items": func(l *Load) { l.WorkItems = -1 },
		"no rate":             func(l *Load) { l.Rate = 0 },
		"no lead":             func(l *Load) { l.Lead = 0 },
	} {
		l := ok
		mutate(&l)
		require.Error(t, l.Validate(), name)
	}
}

func TestRunRefusesALoadWithoutAStart(t *testing.T) {
	l := Full()
	l.To = 31
	_, err := Run(context.Background(), nil, "s", l)
	require.ErrorContains(t, err, "no start state")
}

func TestQuantileIsTheNearestRank(t *testing.T) {
	sorted := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	require.Equal(t, 5.0, quantile(sorted, 0.5))
	require.Equal(t, 10.0, quantile(sorted, 0.99))
	require.Equal(t, 1.0, quantile(sorted, 0))
	require.Equal(t, 7.0, quantile([]float64{7}, 0.99))
}

func TestStartsAreReadFromThePack(t *testing.T) {
	made := func(context.Context, *dbconn.Source, string) error { return nil }
	with, err := Starts(made)
	require.NoError(t, err)
	without, err := Starts(nil)
	require.NoError(t, err)
	require.Len(t, with, len(without)+1, "the runner's states only when it can make them; upstream 1..21 either way")
	require.Contains(t, with[0].Name, "upstream 1..21 (duroxide-pg's runner")
	require.Contains(t, with[1].Name, "upstream 1..21 and 23")
	require.Contains(t, without[0].Name, "upstream 1..21 (the pack's ports")
	require.Contains(t, without[1].Name, fmt.Sprintf("goose %d", packfacts.LastContiguousPort()))
	require.True(t, strings.HasPrefix(without[2].Name, "the pack at "), without[2].Name)
}

func TestSizedSpreadsTheBacklogOverInstances(t *testing.T) {
	l := Sized(100_000, 10, 50)
	require.Equal(t, Load{Messages: 100_000, WorkItems: 100_000, Instances: 10_000, Rate: 50, Lead: 2 * time.Second}, l)
	require.Equal(t, 1, Sized(0, 10, 50).Instances, "an empty backlog still names an instance for the writers")
	require.Equal(t, FullSizes[len(FullSizes)-1], Full().Messages)
	require.Equal(t, Full().Messages, Full().WorkItems, "both queues hold the same backlog")
}

func reportAt(start string, n int, orchMs, workMs float64) *Report {
	return &Report{Start: start, To: 33, Messages: n, WorkItems: n, Instances: n / 10, Rate: 50, MigrateMs: 1500, Writers: []Writer{
		{Queue: "orchestrator_queue", Function: "enqueue_orchestrator_work", Writes: 100, MaxMs: orchMs, DuringMaxMs: orchMs, P99Ms: 12, P50Ms: 1},
		{Queue: "worker_queue", Function: "enqueue_worker_work", Writes: 99, Failed: 1, MaxMs: workMs, DuringMaxMs: workMs, P99Ms: 3, P50Ms: 0.5},
	}}
}

func TestTableHasARowPerStateSizeAndQueue(t *testing.T) {
	out := Table([]*Report{reportAt("a", 10, 1800, 4)})
	require.Contains(t, out, "| a, to 33 | 10 (1), 10 | 50/s each | 1.50 s | orchestrator_queue | 100 (0) | 1800 ms | 1800 ms | 12.0 ms | 1.0 ms |")
	require.Contains(t, out, "| a, to 33 | 10 (1), 10 | 50/s each | 1.50 s | worker_queue | 99 (1) | 4 ms | 4 ms | 3.0 ms | 0.5 ms |")
	rep := reportAt("a", 10, 1, 2)
	require.Equal(t, 2.0, rep.Writer("worker_queue").MaxMs)
	require.Nil(t, rep.Writer("nope"))
}

func TestTargetsJudgeTheLargestBacklogAndTheGrowth(t *testing.T) {
	ts := Targets([]*Report{reportAt("a", 1_000_000, 1200, 30), reportAt("a", 100_000, 400, 25), reportAt("b", 100_000, 5, 5)})
	got := map[string]bool{}
	for _, tg := range ts {
		got[tg.Start+" "+tg.Queue+" "+tg.What] = tg.Met
	}
	require.Equal(t, map[string]bool{
		"a orchestrator_queue longest wait at 1000000":             false, // 1.2 s
		"a orchestrator_queue longest wait from 100000 to 1000000": false, // 3x and +800 ms
		"a worker_queue longest wait at 1000000":                   true,
		"a worker_queue longest wait from 100000 to 1000000":       true, // +5 ms: noise
		"b orchestrator_queue longest wait at 100000":              true,
		"b worker_queue longest wait at 100000":                    true,
	}, got)
	require.Contains(t, TargetTable(ts), "| a | orchestrator_queue | longest wait at 1000000 | <= 1000 ms | 1200 ms | missed |")
}
