package migrateload

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/packfacts"
)

func TestValidateRefusesWhatCannotBeMeasured(t *testing.T) {
	ok := Full()
	ok.To = 31
	require.NoError(t, ok.Validate())
	for name, mutate := range map[string]func(*Load){
		"no target":    func(l *Load) { l.To = 0 },
		"no instances": func(l *Load) { l.Instances = 0 },
		"no rate":      func(l *Load) { l.Rate = 0 },
		"no lead":      func(l *Load) { l.Lead = 0 },
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
	require.Len(t, with, len(without)+1, "the runner's state only when it can be made")
	require.Contains(t, without[0].Name, fmt.Sprintf("goose %d", packfacts.LastContiguousPort()))
	require.True(t, strings.HasPrefix(without[1].Name, "the pack at "), without[1].Name)
}

func TestTableHasARowPerReport(t *testing.T) {
	out := Table([]*Report{{Start: "a", To: 31, Messages: 10, Instances: 2, Rate: 50, MigrateMs: 1500, Writes: 100, MaxMs: 1800, DuringMaxMs: 1800, P99Ms: 12, P50Ms: 1}})
	require.Contains(t, out, "| a, to 31 | 10 (2) | 50/s | 1.50 s | 100 (0) | 1800 ms | 1800 ms | 12.0 ms | 1.0 ms |")
}
