package eventlog

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLogKeepsEveryEventOfConcurrentWriters(t *testing.T) {
	l := New[int]()
	require.Zero(t, l.Elapsed(), "not started")
	l.MarkStart()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				l.Add(w*100 + i)
			}
		}()
	}
	wg.Wait()
	l.MarkStop()
	require.Equal(t, 800, l.Len())
	seen := map[int]bool{}
	for _, e := range l.Events() {
		seen[e] = true
	}
	require.Len(t, seen, 800)
	elapsed := l.Elapsed()
	require.Equal(t, elapsed, l.Elapsed(), "a stopped run's length does not grow")
}

func TestPercentileIsTheNearestRank(t *testing.T) {
	v := []int64{10, 20, 30, 40, 50, 60, 70, 80, 90, 100}
	require.Equal(t, int64(10), Percentile(v, 0))
	require.Equal(t, int64(10), Percentile(v, 10))
	require.Equal(t, int64(50), Percentile(v, 50))
	require.Equal(t, int64(100), Percentile(v, 99))
	require.Equal(t, int64(100), Percentile(v, 100))
	require.Zero(t, Percentile(nil, 50))
}

func TestConservationNamesWhatWasLostOrDoubled(t *testing.T) {
	produced := map[string]int{"a": 1, "b": 1, "c": 1}
	require.NoError(t, Conservation("items", produced, map[string]int{"a": 1, "b": 1}, []string{"c"}))

	err := Conservation("items", map[string]int{"a": 1, "b": 1, "d": 2}, map[string]int{"a": 2, "x": 1}, []string{"d", "y"})
	require.ErrorContains(t, err, "items not conserved: ")
	for _, want := range []string{
		"a consumed 2 times, pending 0 times", // doubled
		"b consumed 0 times, pending 0 times", // lost
		"d produced 2 times",
		"x consumed but never produced",
		"y pending but never produced",
	} {
		require.ErrorContains(t, err, want)
	}
}

func TestTalliesCountEveryIDInOrder(t *testing.T) {
	got := Tallies(map[string]int{"b": 1, "a": 2}, map[string]int{"a": 1, "c": 1}, []string{"b", "d"})
	require.Equal(t, []Tally{
		{ID: "a", Produced: 2, Consumed: 1},
		{ID: "b", Produced: 1, Pending: 1},
		{ID: "c", Consumed: 1},
		{ID: "d", Pending: 1},
	}, got)
	require.False(t, got[0].Conserved(), "produced twice")
	require.True(t, got[1].Conserved(), "produced once, still pending")
	require.False(t, got[2].Conserved(), "never produced")
}
