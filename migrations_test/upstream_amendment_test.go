package migrations_test

// The amendment this project offers upstream (upstream/migrations), in
// upstream's format: the file is what upstream's runner can run and differs
// from the candidate (our port of it) in the lease alone; the regression
// script a maintainer runs with psql (upstream/tests) fails on the
// candidate, on reproduction A, passes with the amendment, and leaves the
// database as it found it.

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/harness/ops/catalog"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// regressionScript is the script the amendment ships for upstream's tests.
const regressionScript = "../upstream/tests/expired_lease_stale_caller.sql"

// amendmentDiff is the amendment's hand-curated diff, in upstream's style.
const amendmentDiff = "../upstream/migrations/0025_diff.md"

// The lease lines of the candidate's body, and the amendment's, as
// upstream's runner leaves them (comments cut, lines trimmed where a
// comment was).
const (
	candidateLease = "v_locked_until := v_now_ms + p_lock_timeout_ms;"
	amendedLease   = "v_locked_until := GREATEST(v_now_ms, floor(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT)\n+ p_lock_timeout_ms;"
)

func amendmentFile(t *testing.T) (string, string) {
	t.Helper()
	file, text, err := upstream.Amendment()
	require.NoError(t, err)
	return file, text
}

// The file is one DO block once upstream's runner has read it, nothing of
// it lost to the runner's quirks; it announces itself as 0025; no string
// literal holds "--", which the runner would cut.
func TestAmendmentIsOneDOBlockInUpstreamsFormat(t *testing.T) {
	t.Parallel()
	file, text := amendmentFile(t)
	require.Regexp(t, `^\d{4}_[a-z0-9_]+\.sql$`, file)
	v, err := upstream.VersionOf(file)
	require.NoError(t, err)
	candidate, err := upstream.VersionOf(upstream.CandidateFile)
	require.NoError(t, err)
	require.Greater(t, v, candidate, "the amendment runs after the candidate")
	require.Contains(t, text, fmt.Sprintf("\n-- Migration %04d: ", v), "its header names it")

	pre := upstream.Preprocess(text)
	stmts := upstream.SplitStatements(pre)
	require.Len(t, stmts, 1, "one statement after upstream's preprocessing")
	require.True(t, strings.HasPrefix(stmts[0], "DO $$"), stmts[0][:min(len(stmts[0]), 40)])
	require.True(t, strings.HasSuffix(stmts[0], "END $$"))
	require.Equal(t, pre, stmts[0]+";", "the runner's split loses nothing of the text")
	require.NotContains(t, stmts[0], "--", "no comment survives the runner")
	require.Contains(t, stmts[0], fmt.Sprintf("RAISE NOTICE 'Migration %04d: ", v))

	lits := dashesInLiterals(text)
	require.Empty(t, lits, "string literals holding \"--\" (upstream's runner cuts them)")
	require.Equal(t, []string{"a -- b"}, dashesInLiterals("x := 'a -- b'; -- it's a comment\ny := 'it''s';"), "the scan finds one")
}

// dashesInLiterals returns the single-quoted literals of text (SQL, comments
// skipped) that hold "--".
func dashesInLiterals(text string) []string {
	var out []string
	for i := 0; i < len(text); i++ {
		switch {
		case strings.HasPrefix(text[i:], "--"):
			for i < len(text) && text[i] != '\n' {
				i++
			}
		case text[i] == '\'':
			var lit strings.Builder
			for i++; i < len(text); i++ {
				if text[i] == '\'' {
					if i+1 < len(text) && text[i+1] == '\'' {
						lit.WriteByte('\'')
						i++
						continue
					}
					break
				}
				lit.WriteByte(text[i])
			}
			if strings.Contains(lit.String(), "--") {
				out = append(out, lit.String())
			}
		}
	}
	return out
}

// lineDiff is a minimal line diff of a and b (longest common subsequence):
// the lines only a has and the lines only b has, each in order, trimmed.
func lineDiff(a, b []string) (removed, added []string) {
	n, m := len(a), len(b)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			i, j = i+1, j+1
		case j < m && (i == n || lcs[i][j+1] >= lcs[i+1][j]):
			added = append(added, strings.TrimSpace(b[j]))
			j++
		default:
			removed = append(removed, strings.TrimSpace(a[i]))
			i++
		}
	}
	return removed, added
}

// What upstream's runner runs of the amendment differs from what it runs of
// the candidate (our port) in the lease's assignment and the closing notice
// alone; and 0025_diff.md's hunks are exactly that body change.
func TestAmendmentDiffersFromTheCandidateOnlyInTheLease(t *testing.T) {
	t.Parallel()
	_, text := amendmentFile(t)
	port := strings.Split(upstream.Preprocess(upstream.CandidatePort()), "\n")
	ours := strings.Split(upstream.Preprocess(text), "\n")
	removed, added := lineDiff(port, ours)
	require.Len(t, removed, 2, "removed: %q", removed)
	require.Len(t, added, 3, "added: %q", added)
	require.Equal(t, candidateLease, removed[0])
	require.Equal(t, amendedLease, strings.Join(added[:2], "\n"))
	require.True(t, strings.HasPrefix(removed[1], "RAISE NOTICE 'Migration 0024: "), removed[1])
	require.True(t, strings.HasPrefix(added[2], "RAISE NOTICE 'Migration 0025: "), added[2])

	// 0025_diff.md: its hunks' - and + lines are the body's change, nothing else.
	md, err := os.ReadFile(amendmentDiff)
	require.NoError(t, err)
	require.Contains(t, string(md), "Migration file: `0025_fix_lease_from_stale_caller_timestamp.sql`")
	require.Contains(t, string(md), "### `fetch_orchestration_item` — body modified (baseline: 0024)")
	var minus, plus []string
	inHunk := false
	sc := bufio.NewScanner(strings.NewReader(string(md)))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```diff"):
			inHunk = true
		case strings.HasPrefix(line, "```"):
			inHunk = false
		case inHunk && strings.HasPrefix(line, "-") && !strings.HasPrefix(line, "---"):
			minus = append(minus, strings.TrimSpace(line[1:]))
		case inHunk && strings.HasPrefix(line, "+") && !strings.HasPrefix(line, "+++"):
			plus = append(plus, strings.TrimSpace(line[1:]))
		}
	}
	require.Equal(t, removed[:1], minus, "0025_diff.md's removed lines")
	require.Equal(t, added[:2], plus, "0025_diff.md's added lines")
}

// scriptLine is one check line of the regression script's TAP output.
var scriptLine = regexp.MustCompile(`(?m)^(ok|not ok) (\d+) - (.*)$`)

// leaseLeft reads reproduction A's figure: the lease's remaining time by the
// database clock.
var leaseLeft = regexp.MustCompile(`^reproduction A: the lease is valid at return \((-?\d+) ms left by the database clock`)

type scriptRun struct {
	out    string
	err    error
	checks map[int]string // check number -> "ok ..." / "not ok ..." line
	leftMs int64
	took   time.Duration
}

func (r scriptRun) ok(n int) bool { return strings.HasPrefix(r.checks[n], "ok ") }

// runRegressionScript runs the script with psql against db, as a
// maintainer would.
func runRegressionScript(t *testing.T, db *testdb.Database) scriptRun {
	t.Helper()
	psql := psqlPath(t)
	args := []string{"-X", "-v", "schema=" + db.Schema}
	if conn := dblinkConn(t, db); conn != "" {
		args = append(args, "-v", "dblink_conn="+conn)
	}
	args = append(args, "-f", regressionScript, db.DSN)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, psql, args...).CombinedOutput()
	r := scriptRun{out: string(out), err: err, checks: map[int]string{}, took: time.Since(start)}
	for _, m := range scriptLine.FindAllStringSubmatch(r.out, -1) {
		n, _ := strconv.Atoi(m[2])
		require.NotContains(t, r.checks, n, "check %d printed twice:\n%s", n, r.out)
		r.checks[n] = m[0]
		if lm := leaseLeft.FindStringSubmatch(m[3]); lm != nil {
			r.leftMs, _ = strconv.ParseInt(lm[1], 10, 64)
		}
	}
	require.Len(t, r.checks, 7, "seven check lines:\n%s", r.out)
	require.Contains(t, r.out, "1..7\n")
	return r
}

// dblinkConn is the competing session's connection string when the
// script's default (psql's own host, port, database and user) does not
// reach the server from the server's side: a password, a container.
func dblinkConn(t *testing.T, db *testdb.Database) string {
	t.Helper()
	switch dbs.Server().Backend() {
	case pgtest.Local:
		return "" // the script's default path
	case pgtest.Docker:
		cfg := dbs.Server().ConnConfig(db.Name)
		return fmt.Sprintf("host=localhost port=5432 dbname=%s user=%s password=%s", db.Name, cfg.User, cfg.Password)
	default:
		return db.DSN
	}
}

// requireDblink skips t when the server cannot give the script its
// competing session: no dblink among its extensions (the matrix's
// npm-packaged servers ship no contrib).
func requireDblink(t *testing.T, conn *sql.DB) {
	t.Helper()
	var available bool
	require.NoError(t, conn.QueryRow(`SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'dblink')`).Scan(&available))
	if !available {
		t.Skip("the server ships no dblink (contrib): the regression script's held-key case needs it for its competing session")
	}
}

// databaseState is what the script must leave as it found it: the schema's
// catalog and function bodies, every table's rows, every sequence's
// position, _duroxide_migrations, the database's extensions and advisory
// locks.
func databaseState(t *testing.T, conn *sql.DB, schema string) string {
	t.Helper()
	ctx := context.Background()
	cat, err := catalog.Take(ctx, conn, schema)
	require.NoError(t, err)
	bodies, err := catalog.Bodies(ctx, conn, schema)
	require.NoError(t, err)
	tables := map[string]string{}
	rows, err := conn.QueryContext(ctx, `SELECT c.relname, c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'S') ORDER BY 1`, schema)
	require.NoError(t, err)
	type rel struct{ name, kind string }
	var rels []rel
	for rows.Next() {
		var r rel
		require.NoError(t, rows.Scan(&r.name, &r.kind))
		rels = append(rels, r)
	}
	require.NoError(t, rows.Err())
	require.NoError(t, rows.Close())
	for _, r := range rels {
		q := fmt.Sprintf(`SELECT count(*)::text || ' rows, md5 ' || coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), '-') FROM %s.%s t`,
			quoteIdent(schema), quoteIdent(r.name))
		if r.kind == "S" {
			q = fmt.Sprintf(`SELECT last_value::text || ' ' || is_called::text FROM %s.%s`, quoteIdent(schema), quoteIdent(r.name))
		}
		var v string
		require.NoError(t, conn.QueryRowContext(ctx, q).Scan(&v))
		tables[r.name] = v
	}
	var migrationsRows, extensions string
	require.NoError(t, conn.QueryRowContext(ctx, `SELECT string_agg(version::text || ':' || name, ',' ORDER BY version) FROM `+quoteIdent(schema)+`._duroxide_migrations`).Scan(&migrationsRows))
	require.NoError(t, conn.QueryRowContext(ctx, `SELECT string_agg(extname, ',' ORDER BY extname) FROM pg_extension`).Scan(&extensions))
	b, err := json.MarshalIndent(map[string]any{
		"catalog": json.RawMessage(cat), "bodies": bodies, "rows": tables,
		"duroxide_migrations": migrationsRows, "extensions": extensions,
	}, "", " ")
	require.NoError(t, err)
	return string(b)
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// advisoryLocks counts the advisory locks held in db's database by sessions
// other than conn's, waiting a little for a competing session that has
// just been closed to go.
func advisoryLocks(t *testing.T, conn *sql.DB) int {
	t.Helper()
	var n int
	for range 50 {
		require.NoError(t, conn.QueryRow(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND pid <> pg_backend_pid()`).Scan(&n))
		if n == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return n
}

// seed commits rows the script must neither see in its way nor change: a
// visible message a day old (the fetch must still claim the script's own,
// older ones), a message due in an hour, a live lease; the first two move
// orchestrator_queue's sequence.
func seed(t *testing.T, conn *sql.DB, schema string) {
	t.Helper()
	q := quoteIdent(schema)
	_, err := conn.Exec(`INSERT INTO ` + q + `.orchestrator_queue (instance_id, work_item, visible_at, created_at) VALUES
		('seeded-visible', '{"StartOrchestration":{"instance":"seeded-visible","orchestration":"Seeded","version":"1.0.0","input":"null","execution_id":1}}', now() - interval '1 day', now()),
		('seeded-due-later', '{"StartOrchestration":{"instance":"seeded-due-later","orchestration":"Seeded","version":"1.0.0","input":"null","execution_id":1}}', now() + interval '1 hour', now())`)
	require.NoError(t, err)
	_, err = conn.Exec(`INSERT INTO ` + q + `.instance_locks (instance_id, lock_token, locked_until, locked_at)
		VALUES ('seeded-leased', 'lock_seeded', (extract(epoch FROM now()) * 1000)::bigint + 600000, (extract(epoch FROM now()) * 1000)::bigint)`)
	require.NoError(t, err)
}

// The regression script, run with psql as a maintainer runs it: on
// upstream's candidate (our port) it fails, on reproduction A's lease, and
// passes upstream's own held-key case; with the amendment every check
// passes. Either way the database is left exactly as it was.
func TestAmendmentRegressionScript(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		open    func(t *testing.T) *testdb.Database
		amended bool
	}{
		{upstream.CandidateLabel, func(t *testing.T) *testdb.Database { return dbs.UpstreamCandidate(t) }, false},
		{upstream.AmendmentLabel, func(t *testing.T) *testdb.Database { return dbs.UpstreamAmended(t) }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			psqlPath(t) // skips, saying why, when there is no client
			db := c.open(t)
			conn := sqlDB(t, db)
			requireDblink(t, conn)
			seed(t, conn, db.Schema)
			before := databaseState(t, conn, db.Schema)

			r := runRegressionScript(t, db)
			t.Logf("psql took %s; reproduction A's lease: %d ms left by the database clock\n%s", r.took.Round(time.Millisecond), r.leftMs, r.out)

			require.Equal(t, before, databaseState(t, conn, db.Schema), "the script left the database as it found it")
			require.Zero(t, advisoryLocks(t, conn), "no advisory lock outlives the script")
			for n := 4; n <= 7; n++ {
				require.True(t, r.ok(n), "upstream's own held-key case passes: %s", r.checks[n])
			}
			require.True(t, r.ok(1), r.checks[1])

			if !c.amended {
				var exit *exec.ExitError
				require.True(t, errors.As(r.err, &exit), "psql fails: %v\n%s", r.err, r.out)
				require.Equal(t, 3, exit.ExitCode(), "psql's exit status for a script error under ON_ERROR_STOP")
				require.True(t, strings.HasPrefix(r.checks[2], "not ok 2 - reproduction A: the lease is valid at return"), r.checks[2])
				require.Less(t, r.leftMs, int64(-4000), "the candidate's lease is about 5 s in the past")
				require.Contains(t, r.checks[3], "not ok 3 - reproduction A: an ack")
				require.Contains(t, r.checks[3], "Invalid lock token")
				require.Contains(t, r.out, "# 2 of 7 checks failed")
				return
			}
			require.NoError(t, r.err, r.out)
			for n := 1; n <= 7; n++ {
				require.True(t, r.ok(n), r.checks[n])
			}
			require.Greater(t, r.leftMs, int64(4000), "a full lease by the database clock")
			require.LessOrEqual(t, r.leftMs, int64(5000))
			require.Contains(t, r.out, "# all 7 checks passed")
		})
	}
}

// The script's figure parser reads the line the script prints.
func TestAmendmentScriptLineParsing(t *testing.T) {
	t.Parallel()
	line := "not ok 2 - reproduction A: the lease is valid at return (-5035 ms left by the database clock, want > 4000; p_now_ms 10000 ms behind, lock timeout 5000 ms)"
	m := scriptLine.FindStringSubmatch(line)
	require.NotNil(t, m)
	lm := leaseLeft.FindStringSubmatch(m[3])
	require.NotNil(t, lm)
	require.Equal(t, "-5035", lm[1])
	script, err := os.ReadFile(filepath.Clean(regressionScript))
	require.NoError(t, err)
	require.Contains(t, string(script), "'reproduction A: the lease is valid at return'", "the parser reads the name the script prints")
	require.Contains(t, string(script), "' ms left by the database clock, want > '")
}
