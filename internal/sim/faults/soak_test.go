package faults_test

import (
	"context"
	"testing"
	"time"

	"github.com/duroxide-pg/migrations/internal/packfacts"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/sim/faults"
)

// A soak runs whole rounds of mixed faults until its duration is used up,
// tells of each round, and its summary adds the rounds up; at the pack's
// latest version no invariant breaks.
func TestSoakAddsUpItsRounds(t *testing.T) {
	t.Parallel()
	db := dbs.New(t, latest)
	var rounds []int
	leases := 0
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sum, err := faults.Soak(ctx, db.Source, faults.SoakOptions{Schema: db.Schema, Duration: 4 * time.Second,
		Round: time.Second, Seed: 7,
		OnRound: func(n int, res *faults.Result) {
			rounds = append(rounds, n)
			leases += res.Report.Leases
		}})
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(rounds), 2, "rounds of 1 s in 4 s (each also seeds and checks)")
	for i, n := range rounds {
		require.Equal(t, i+1, n, "rounds are told in order")
	}
	require.Equal(t, len(rounds), sum.Rounds)
	require.Len(t, sum.RoundConfigs, sum.Rounds)
	require.Equal(t, leases, sum.Fetches)
	require.Positive(t, sum.Checks)
	require.Zero(t, sum.Violations, sum.First)
}

// The oldest version a soak accepts is read from the pack: the side of
// the fetch fix the reports compare against.
func TestOldestVersionIsReadFromThePack(t *testing.T) {
	t.Parallel()
	bug, _, verr := packfacts.FetchFix()
	require.NoError(t, verr)
	oldest, err := faults.OldestVersion()
	require.NoError(t, err)
	require.Equal(t, bug, oldest)
	require.Equal(t, int64(bugVersion), oldest, "the scenarios' reported version")
}
