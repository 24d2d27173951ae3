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

// The port keeps every detail the published facts state about upstream's
// branch file (../shared/spec/upstream-candidate-fix.md, "Details a
// faithful port keeps"), read from the text upstream's runner runs.
func TestCandidatePortKeepsTheBranchFilesDetails(t *testing.T) {
	// The text as the runner runs it, each line's indentation dropped.
	lines := strings.Split(Preprocess(CandidatePort()), "\n")
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	pre := strings.Join(lines, "\n")
	count := func(s string) int { return strings.Count(pre, s) }
	before := func(a, b string) {
		t.Helper()
		i, j := strings.Index(pre, a), strings.Index(pre, b)
		require.True(t, i >= 0 && j >= 0 && i < j, "%q comes before %q", a, b)
	}

	// DROP before CREATE OR REPLACE, in one format() of two arguments.
	require.Equal(t, 1, count("EXECUTE format($fmt$"))
	before("DROP FUNCTION IF EXISTS %1$I.fetch_orchestration_item(BIGINT, BIGINT, BIGINT, BIGINT);", "CREATE OR REPLACE FUNCTION %1$I.fetch_orchestration_item(")
	require.Equal(t, 1, count("$fmt$, v_schema_name, v_schema_name);"))
	require.Equal(t, 1, count("pg_try_advisory_xact_lock(hashtext(%2$L || '.' || v_instance_id))"), "the key's literal is the second argument")

	// The bound: a named constant, checked at the top of the loop.
	require.Equal(t, 1, count("c_max_iterations CONSTANT INTEGER := 50;"))
	before("LOOP\nv_iterations := v_iterations + 1;\nIF v_iterations > c_max_iterations THEN\nRETURN;\nEND IF;", "SELECT q.instance_id INTO v_instance_id")

	// The clock: a cast (which rounds), no floor; at the top of each
	// iteration and after the try-lock; the candidate reset there too.
	clock := "v_now_ms := p_now_ms + (EXTRACT(EPOCH FROM (clock_timestamp() - v_call_start)) * 1000)::BIGINT;"
	require.Equal(t, 2, count(clock))
	require.Equal(t, 1, count("v_call_start TIMESTAMPTZ := clock_timestamp();"))
	require.NotContains(t, pre, "floor(")
	before("END IF;\n"+clock+"\nv_instance_id := NULL;", "pg_try_advisory_xact_lock")
	before("pg_try_advisory_xact_lock", "CONTINUE;\nEND IF;\n"+clock)

	// Phases 1 and 3: two branches each on p_min_version_packed.
	require.Equal(t, 2, count("IF p_min_version_packed IS NOT NULL THEN"))
	require.Equal(t, 2, count("ORDER BY q.visible_at, q.id\nLIMIT 1;"))
	require.Equal(t, 2, count("FOR UPDATE OF q SKIP LOCKED;"))
	require.Equal(t, 2, count("LEFT JOIN %1$I.executions e"), "the version range's joins, in the two branches with a range")
	require.Equal(t, 2, count("AND NOT (q.instance_id = ANY(v_skipped))"), "phase 1 excludes skipped instances in both branches")

	// The claim: no alias, GET DIAGNOSTICS, skip on no row.
	require.Equal(t, 1, count("INSERT INTO %1$I.instance_locks (instance_id, lock_token, locked_until, locked_at)"))
	require.Equal(t, 1, count("WHERE %1$I.instance_locks.locked_until <= v_now_ms;\nGET DIAGNOSTICS v_rows = ROW_COUNT;"))
	require.Equal(t, 1, count("locked_until = v_locked_until,"))

	// Steps 3-6 and the snapshot inside the loop; RETURN QUERY; RETURN.
	before("GET DIAGNOSTICS v_rows = ROW_COUNT;", "UPDATE %1$I.orchestrator_queue q")
	require.Equal(t, 1, count("v_history, v_messages, v_lock_token, v_attempt_count, v_kv_snapshot;\nRETURN;\nEND LOOP;\nEND;\n$body$ LANGUAGE plpgsql;"))
	require.NotContains(t, pre, "EXIT;")
	require.Contains(t, pre, "RAISE NOTICE 'Migration 0024: ")
}
