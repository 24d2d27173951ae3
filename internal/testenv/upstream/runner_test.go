package upstream

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The lock key of upstream's runner, on the examples its facts give.
func TestRunnerLockKeyIsUpstreamsFNV1a(t *testing.T) {
	require.Equal(t, int64(3191286213066983517), runnerLockKey("public"))
	require.Equal(t, int64(202983607311223640), runnerLockKey("tenant_a"))
}

func TestPreprocessCutsCommentsOutsideStringsAndDropsEmptyLines(t *testing.T) {
	in := "\n-- header\nDO $$\n    x := 1; -- trailing\n\n    y := 'a -- b'; -- kept whole: odd quotes before the first --\n    z := 'it''s'; -- even\nEND $$;\n\n"
	require.Equal(t, "DO $$\nx := 1;\n    y := 'a -- b'; -- kept whole: odd quotes before the first --\nz := 'it''s';\nEND $$;", Preprocess(in))
}

func TestSplitStatementsKeepsDollarQuotesWholeAndLosesBareWords(t *testing.T) {
	got := SplitStatements("DO $$ BEGIN EXECUTE format($fmt$ CREATE f() AS $body$ a; b; $body$ $fmt$); END $$;\nSELECT $1, 2;")
	require.Equal(t, []string{"DO $$ BEGIN EXECUTE format($fmt$ CREATE f() AS $body$ a; b; $body$ $fmt$); END $$", "SELECT $, 2"}, got)
}

func TestVersionOfReadsTheNumberBeforeTheFirstUnderscore(t *testing.T) {
	v, err := VersionOf("migrations/0024_fix_expired_orchestration_lock_lease.sql")
	require.NoError(t, err)
	require.Equal(t, int64(24), v)
	_, err = VersionOf("x_y.sql")
	require.ErrorContains(t, err, "invalid migration version x")
}

// The candidate port is one DO block, as upstream's runner needs it, and
// keeps no comment once the runner has read it.
func TestCandidatePortIsOneStatementInUpstreamsFormat(t *testing.T) {
	stmts := SplitStatements(Preprocess(CandidatePort()))
	require.Len(t, stmts, 1)
	require.True(t, strings.HasPrefix(stmts[0], "DO $$"), stmts[0][:40])
	require.NotContains(t, stmts[0], "--")
	require.Contains(t, stmts[0], "RAISE NOTICE 'Migration 0024:")
	v, err := VersionOf(CandidateFile)
	require.NoError(t, err)
	require.Equal(t, int64(24), v)
}
