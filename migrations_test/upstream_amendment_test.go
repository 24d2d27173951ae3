package migrations_test

// The offer to duroxide-pg's maintainers (upstream/ at the repository's
// root): the bounded lease for fetch_orchestration_item and
// fetch_work_items, each as an edit of the branch file (upstream/edit) and
// as a separate migration numbered after every branch file
// (upstream/migrations), with _diff.md files in upstream's style, and a
// regression script for psql (upstream/tests). Its files are what
// upstream's runner can run and show the change alone; the script, run as
// a role with only what the provider's role has, fails on the candidate
// and on the batched fetch as upstream has them, passes with the
// amendment in either form, catches an unbounded lease, skips what a
// schema lacks, makes its own schema when given none, and leaves the
// database as it found it.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/catalog"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// regressionScript is the script the offer ships for upstream's tests.
const regressionScript = "../upstream/tests/expired_lease_stale_caller.sql"

// boundRE reads the bound an amended text declares.
var boundRE = regexp.MustCompile(`c_max_clock_lead_ms CONSTANT BIGINT := (\d+);`)

// offerText reads a file of the offer, failing t when it cannot.
func offerText(t *testing.T, read func() (string, string, error)) (string, string) {
	t.Helper()
	file, text, err := read()
	require.NoError(t, err)
	return file, text
}

func editedText(t *testing.T, read func() (string, error)) string {
	t.Helper()
	text, err := read()
	require.NoError(t, err)
	return text
}

// If each colliding branch file (two claim 22, two 24) is renumbered past
// the released versions, the branch files end at 26: the separate
// migrations take the first numbers after that, 27 for the orchestration
// fetch and 28 for the batched one, each with its _diff.md.
func TestOfferNumbersItsSeparateMigrationsAfterEveryBranchFile(t *testing.T) {
	t.Parallel()
	occupied := map[int64]int{}
	for _, v := range migrations.UpstreamVersions() {
		occupied[v]++
	}
	branch := upstream.InFlight()
	require.Len(t, branch, 4, "upstream's branch files: %v", branch)
	for _, f := range branch {
		v, err := upstream.VersionOf(f)
		require.NoError(t, err)
		occupied[v]++
	}
	highest, collisions := int64(0), 0
	for v, n := range occupied {
		highest = max(highest, v)
		collisions += n - 1
	}
	highest += int64(collisions)
	require.Equal(t, int64(26), highest, "the branch files end at 26 once renumbered")

	orch, err := upstream.VersionOf(upstream.AmendmentFile)
	require.NoError(t, err)
	batched, err := upstream.VersionOf(upstream.BatchedAmendmentFile)
	require.NoError(t, err)
	require.Equal(t, highest+1, orch)
	require.Equal(t, orch+1, batched)
	for _, f := range []string{upstream.AmendmentFile, upstream.BatchedAmendmentFile} {
		require.Regexp(t, `^\d{4}_[a-z0-9_]+\.sql$`, f)
		_, err := upstream.OfferFile(fmt.Sprintf("migrations/%s_diff.md", f[:4]))
		require.NoError(t, err, "%s has its _diff.md", f)
	}
}

// functionLines is the CREATE FUNCTION statement of a migration text as
// upstream's runner runs it, one trimmed line each.
func functionLines(t *testing.T, text string) []string {
	t.Helper()
	pre := upstream.Preprocess(text)
	i := strings.Index(pre, "CREATE OR REPLACE FUNCTION")
	j := strings.LastIndex(pre, "$body$ LANGUAGE plpgsql;")
	require.True(t, i >= 0 && j > i)
	lines := strings.Split(pre[i:j], "\n")
	for k := range lines {
		lines[k] = strings.TrimSpace(lines[k])
	}
	return lines
}

// lineDiff is a minimal line diff of a and b (longest common subsequence):
// the lines only a has and the lines only b has, each in order.
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
			added = append(added, b[j])
			j++
		default:
			removed = append(removed, a[i])
			i++
		}
	}
	return removed, added
}

// hunkLines are the removed, added and context lines of a _diff.md's
// hunks, trimmed.
func hunkLines(t *testing.T, md string) (removed, added, context []string) {
	t.Helper()
	hunks, err := upstream.ParseHunks(md)
	require.NoError(t, err)
	for _, h := range hunks {
		r, a := lineDiff(h.Old, h.New)
		for _, l := range r {
			removed = append(removed, strings.TrimSpace(l))
		}
		for _, l := range a {
			added = append(added, strings.TrimSpace(l))
		}
		for _, l := range h.Old {
			if slices.Contains(h.New, l) {
				context = append(context, strings.TrimSpace(l))
			}
		}
	}
	return removed, added, context
}

// Each _diff.md is in upstream's style and shows the change alone: its
// hunks' removed and added lines are exactly what differs between the
// function of the branch file (our port) and the amended one; their
// context lines are statements the published facts give, not the port's;
// the edit of the branch file and the separate migration show the same
// hunks. The bound is one named constant, the same in every text.
func TestOfferDiffFilesShowTheChangeAlone(t *testing.T) {
	t.Parallel()
	batchedPort, err := upstream.InFlightPort(upstream.InFlightBatchedFetch)
	require.NoError(t, err)
	orchFile, orchText := offerText(t, upstream.Amendment)
	batchedFile, batchedText := offerText(t, upstream.BatchedAmendment)
	for _, c := range []struct {
		function, port, edited, separate                   string
		editMD, separateMD, editTitle, separateTitle, base string
		factRemoved                                        []string
	}{
		{
			function: "fetch_orchestration_item", port: upstream.CandidatePort(),
			edited: editedText(t, upstream.EditedCandidate), separate: orchText,
			editMD: upstream.CandidateEdit, separateMD: "migrations/" + orchFile[:4] + "_diff.md",
			editTitle: upstream.CandidateFile, separateTitle: orchFile, base: "0024",
			factRemoved: []string{"v_locked_until := v_now_ms + p_lock_timeout_ms;"},
		},
		{
			function: "fetch_work_items", port: batchedPort,
			edited: editedText(t, upstream.EditedBatched), separate: batchedText,
			editMD: upstream.BatchedEdit, separateMD: "migrations/" + batchedFile[:4] + "_diff.md",
			editTitle: upstream.InFlightBatchedFetch, separateTitle: batchedFile, base: "0022",
			factRemoved: []string{"p_now_ms + COALESCE(p_session_lock_timeout_ms, p_lock_timeout_ms)", "locked_until = p_now_ms + p_lock_timeout_ms"},
		},
	} {
		t.Run(c.function, func(t *testing.T) {
			removed, added := lineDiff(functionLines(t, c.port), functionLines(t, c.edited))
			require.NotEmpty(t, removed)
			require.Equal(t, functionLines(t, c.edited), functionLines(t, c.separate), "the separate migration's function is the edited one")

			var hunks [2][]string
			for i, f := range []struct{ md, title string }{{c.editMD, c.editTitle}, {c.separateMD, c.separateTitle}} {
				md, err := upstream.OfferFile(f.md)
				require.NoError(t, err)
				require.True(t, strings.HasPrefix(md, "Migration file: `"+f.title+"`"), "%s: upstream's title line", f.md)
				require.Contains(t, md, "\n## Table Changes\n\nNone.\n")
				require.Contains(t, md, "\n## New Indexes\n\nNone")
				require.Contains(t, md, "\n### `"+c.function+"` — body modified (baseline: "+c.base)
				r, a, ctx := hunkLines(t, md)
				require.Equal(t, removed, r, "%s: the removed lines are the change", f.md)
				require.Equal(t, added, a, "%s: the added lines are the change", f.md)
				for _, l := range ctx {
					require.Contains(t, []string{"v_call_start TIMESTAMPTZ := clock_timestamp();", "DECLARE"}, l, "%s: a context line the facts give", f.md)
				}
				for k, l := range r {
					require.Contains(t, l, c.factRemoved[k], "%s: a removed line is a statement the facts give", f.md)
				}
				hunks[i] = append(append(r, "|"), a...)
			}
			require.Equal(t, hunks[0], hunks[1], "the edit and the separate migration show one change")

			for name, text := range map[string]string{"edited": c.edited, "separate": c.separate} {
				m := boundRE.FindAllStringSubmatch(upstream.Preprocess(text), -1)
				require.Len(t, m, 1, "%s: one named bound", name)
				require.Equal(t, "30000", m[0][1], "%s: the bound is the pool's acquire timeout, 30 s", name)
				require.Equal(t, strings.Count(strings.Join(added, "\n"), "c_max_clock_lead_ms")-1, strings.Count(upstream.Preprocess(text), ", 0), c_max_clock_lead_ms)"),
					"%s: each changed lease is bounded", name)
			}
		})
	}
}

// packLeaseBound is the bound the pack's newest migration with a "--
// Lease bound: N ms" header line declares (0 when none does yet).
func packLeaseBound(t *testing.T) int64 {
	t.Helper()
	files, err := filepath.Glob("../sql/*.sql")
	require.NoError(t, err)
	sort.Strings(files)
	line := regexp.MustCompile(`(?m)^-- Lease bound: (\d+) ms\s*$`)
	var bound int64
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		if m := line.FindSubmatch(b); m != nil {
			bound, err = strconv.ParseInt(string(m[1]), 10, 64)
			require.NoError(t, err)
		}
	}
	return bound
}

// The bound offered upstream is the pack's own.
func TestOfferBoundIsThePacks(t *testing.T) {
	t.Parallel()
	pack := packLeaseBound(t)
	if pack == 0 {
		t.Skip("no pack migration declares its lease bound (a \"-- Lease bound: N ms\" header line) yet")
	}
	_, text := offerText(t, upstream.Amendment)
	m := boundRE.FindStringSubmatch(text)
	require.NotNil(t, m)
	require.Equal(t, strconv.FormatInt(pack, 10), m[1])
}

// tapRun is one run of the regression script.
type tapRun struct {
	out   string
	exit  int
	lines map[int]string // check number -> its line
}

var tapLine = regexp.MustCompile(`(?m)^(ok|not ok) (\d+) - (.*)$`)

// failed lists the check numbers of the "not ok" lines.
func (r tapRun) failed() []int {
	return r.numbers(func(l string) bool { return strings.HasPrefix(l, "not ok ") })
}

// skipped lists the check numbers of the "# SKIP" lines.
func (r tapRun) skipped() []int {
	return r.numbers(func(l string) bool { return strings.Contains(l, " # SKIP ") })
}

func (r tapRun) numbers(keep func(string) bool) []int {
	var out []int
	for n, l := range r.lines {
		if keep(l) {
			out = append(out, n)
		}
	}
	sort.Ints(out)
	return out
}

// figure reads the integer before suffix in check n's line.
func (r tapRun) figure(t *testing.T, n int, suffix string) int64 {
	t.Helper()
	m := regexp.MustCompile(`(-?\d+) ` + regexp.QuoteMeta(suffix)).FindStringSubmatch(r.lines[n])
	require.NotNil(t, m, "check %d has a figure before %q: %s", n, suffix, r.lines[n])
	v, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	return v
}

// runScript runs script with psql against dsn with the variables vars, as
// a maintainer would.
func runScript(t *testing.T, script, dsn string, vars ...string) tapRun {
	t.Helper()
	args := []string{"-X"}
	for _, v := range vars {
		args = append(args, "-v", v)
	}
	args = append(args, "-f", script, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, psqlPath(t), args...).CombinedOutput()
	r := tapRun{out: string(out), lines: map[int]string{}}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		r.exit = exit.ExitCode()
	default:
		require.NoError(t, err, "psql: %s", out)
	}
	for _, m := range tapLine.FindAllStringSubmatch(r.out, -1) {
		n, _ := strconv.Atoi(m[2])
		require.NotContains(t, r.lines, n, "check %d printed twice:\n%s", n, r.out)
		r.lines[n] = m[0]
	}
	require.True(t, strings.HasPrefix(r.out, "1..9\n"), "the plan line first:\n%s", r.out)
	require.Len(t, r.lines, 9, "nine check lines:\n%s", r.out)
	return r
}

// providerRole is an empty database and a role that can log in and create
// schemas in it (the CREATE right on the database) and nothing more: what
// duroxide-pg's provider needs, since it creates its schema on connect.
type providerRole struct {
	*roleDB
	role string
}

func newProviderRole(t *testing.T) *providerRole {
	t.Helper()
	r := newRoleDB(t)
	require.NoError(t, r.exec(t, "postgres", fmt.Sprintf("GRANT CREATE ON DATABASE %s TO %s", r.name, r.owner)))
	var super bool
	conn, err := pgx.Connect(context.Background(), r.dsnAs(t, r.owner))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super))
	require.False(t, super, "the script runs as a role that is not a superuser")
	return &providerRole{roleDB: r, role: r.owner}
}

func (p *providerRole) dsn(t *testing.T) string { return p.dsnAs(t, p.role) }

// apply runs migration file (its text) into schema as upstream's runner
// does, connected as the role.
func (p *providerRole) apply(t *testing.T, schema, file, text string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, p.dsn(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, upstream.ApplyMigration(ctx, conn, schema, file, text), "%s into %s", file, schema)
}

// unbounded is an amended text with the bound taken out: the database
// clock lengthens the lease by whatever it leads (the offer's earlier
// rule, GREATEST(caller, database)).
func unbounded(t *testing.T, text string) string {
	t.Helper()
	re := regexp.MustCompile(`LEAST\((GREATEST\(\(EXTRACT\(EPOCH FROM clock_timestamp\(\)\) \* 1000\)::BIGINT - (?:v_now_ms|p_now_ms), 0\)), c_max_clock_lead_ms\)`)
	out := re.ReplaceAllString(text, "$1")
	require.NotEqual(t, text, out)
	return out
}

// A side is a schema the real provider made, as the role, then the
// migrations upstream's runner would apply on top.
type offerSide struct {
	name    string
	apply   []func(t *testing.T) (file, text string)
	failed  []int // the checks that fail
	skipped []int
}

// The regression script on schemas the provider made, run as the
// provider's role: on the released schema and on the candidate with the
// batched fetch it fails (reproduction A, both fetches), with psql's exit
// status 3; with the amendment, as separate migrations or as edits of the
// branch files, every check passes and psql exits 0; with the lease
// unbounded the bound's checks fail; where fetch_work_items is missing its
// checks are skipped. The database is left as it was.
func TestAmendmentRegressionScriptOnProviderSchemas(t *testing.T) {
	t.Parallel()
	psqlPath(t)
	provider := upstream.Require(t)
	p := newProviderRole(t)
	ctx := context.Background()
	src := p.srcAs(t, p.role)

	port := func(file string) func(*testing.T) (string, string) {
		return func(t *testing.T) (string, string) {
			text, err := upstream.InFlightPort(file)
			require.NoError(t, err)
			return file, text
		}
	}
	amend := func(read func() (string, string, error), loose bool) func(*testing.T) (string, string) {
		return func(t *testing.T) (string, string) {
			file, text := offerText(t, read)
			if loose {
				text = unbounded(t, text)
			}
			return file, text
		}
	}
	edit := func(file string, read func() (string, error)) func(*testing.T) (string, string) {
		return func(t *testing.T) (string, string) { return file, editedText(t, read) }
	}
	sides := []offerSide{
		{name: "released", failed: []int{2, 3}, skipped: []int{5, 6, 7, 8, 9}},
		{name: "candidate", apply: []func(*testing.T) (string, string){port(upstream.InFlightCandidate), port(upstream.InFlightBatchedFetch)},
			failed: []int{2, 3, 6, 7, 8}},
		{name: "amended", apply: []func(*testing.T) (string, string){port(upstream.InFlightCandidate), amend(upstream.Amendment, false),
			port(upstream.InFlightBatchedFetch), amend(upstream.BatchedAmendment, false)}},
		{name: "edited", apply: []func(*testing.T) (string, string){edit(upstream.CandidateFile, upstream.EditedCandidate),
			edit(upstream.InFlightBatchedFetch, upstream.EditedBatched)}},
		{name: "unbounded", apply: []func(*testing.T) (string, string){port(upstream.InFlightCandidate), amend(upstream.Amendment, true),
			port(upstream.InFlightBatchedFetch), amend(upstream.BatchedAmendment, true)},
			failed: []int{4, 9}},
	}
	for _, s := range sides {
		require.NoError(t, provider.Migrate(ctx, src, "offer_"+s.name), s.name)
		for _, a := range s.apply {
			file, text := a(t)
			p.apply(t, "offer_"+s.name, file, text)
		}
	}
	conn, err := sql.Open("pgx", p.dsn(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })

	for _, s := range sides {
		t.Run(s.name, func(t *testing.T) {
			schema := "offer_" + s.name
			seedOffer(t, conn, schema)
			before := databaseState(t, conn, schema)
			r := runScript(t, regressionScript, p.dsn(t), "schema="+schema)
			t.Logf("%s:\n%s", s.name, r.out)
			require.Equal(t, before, databaseState(t, conn, schema), "the script left the schema as it found it")

			require.Equal(t, s.failed, r.failed(), "the failing checks")
			require.Equal(t, s.skipped, r.skipped(), "the skipped checks")
			if len(s.failed) > 0 {
				require.Equal(t, 3, r.exit, "psql's exit status under ON_ERROR_STOP when a check fails")
				require.Contains(t, r.out, fmt.Sprintf("# %d of 9 checks failed", len(s.failed)))
			} else {
				require.Zero(t, r.exit, r.out)
				require.Contains(t, r.out, fmt.Sprintf("# all 9 checks passed, %d of them skipped", len(s.skipped)))
			}
			require.Contains(t, r.out, "schema "+schema+" (given)")

			orchLeft := r.figure(t, 2, "ms left by the database clock")
			if slices.Contains(s.failed, 2) {
				require.Less(t, orchLeft, int64(-4000), "a lease about 5 s in the past")
				require.Contains(t, r.lines[3], "Invalid lock token")
			} else {
				require.Greater(t, orchLeft, int64(4000))
				require.LessOrEqual(t, orchLeft, int64(5000))
			}
			ends := r.figure(t, 4, "ms after p_now_ms")
			switch {
			case slices.Contains(s.failed, 4):
				require.GreaterOrEqual(t, ends, int64(60000+5000), "unbounded: the whole lead of the database clock")
			case s.name == "amended" || s.name == "edited":
				require.GreaterOrEqual(t, ends, int64(30000+5000), "bounded: the lease ends at p_now_ms + bound + timeout")
			}
			if slices.Contains(s.skipped, 6) {
				require.Contains(t, r.lines[6], "has no fetch_work_items")
				return
			}
			workLeft := r.figure(t, 6, "ms left by the database clock")
			if slices.Contains(s.failed, 6) {
				require.Less(t, workLeft, int64(-4000))
				require.Contains(t, r.lines[7], "Worker queue item not found")
			} else {
				require.Greater(t, workLeft, int64(4000))
			}
		})
	}
	require.Zero(t, advisoryLocks(t, conn), "no advisory lock outlives the script")
}

// pgDumpPath finds pg_dump beside psql: PG_BIN, PATH, then Debian's
// versioned directories; t is skipped, with the reason, when there is none.
func pgDumpPath(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("PG_BIN"); dir != "" {
		if p := filepath.Join(dir, "pg_dump"); fileExists(p) {
			return p
		}
	}
	if p, err := exec.LookPath("pg_dump"); err == nil {
		return p
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_dump")
	if len(found) > 0 {
		slices.Sort(found)
		return found[len(found)-1]
	}
	t.Skip("no pg_dump (PG_BIN, PATH, /usr/lib/postgresql/*/bin): the stand-in for upstream's released migrations cannot be made")
	return ""
}

// releasedStandIn is one migration file standing in for upstream's
// released 1..21 and 23, whose texts this repository does not hold: the
// schema the real provider made in schema src, dumped (no owner, no
// grants, no _duroxide_migrations) and renamed to schema to (upstream's
// texts name their schema).
func releasedStandIn(t *testing.T, dsn, src, to string) string {
	t.Helper()
	var out, stderr bytes.Buffer
	cmd := exec.Command(pgDumpPath(t), "--schema-only", "--no-owner", "--no-privileges",
		"--schema", src, "--exclude-table", src+"._duroxide_migrations", dsn)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		if strings.Contains(stderr.String(), "server version mismatch") {
			t.Skipf("pg_dump is older than the server: %s", strings.TrimSpace(stderr.String()))
		}
		require.NoError(t, err, stderr.String())
	}
	var b strings.Builder
	b.WriteString("-- upstream 1..21 and 23 as the real provider made them (pg_dump), standing in for their files\n")
	for _, line := range strings.Split(out.String(), "\n") {
		switch {
		case strings.HasPrefix(line, "SET ") && !strings.Contains(line, "check_function_bodies"),
			strings.HasPrefix(line, "SELECT pg_catalog.set_config"),
			strings.HasPrefix(line, "CREATE SCHEMA "),
			strings.HasPrefix(line, `\restrict `), strings.HasPrefix(line, `\unrestrict `):
			continue
		}
		b.WriteString(strings.ReplaceAll(line, src+".", to+"."))
		b.WriteByte('\n')
	}
	return b.String()
}

// Given no schema, the script makes its own from the migration files of a
// checkout laid out as upstream's (migrations/, tests/), applied in the
// order of its list with psql alone, as the provider's role: it fails with
// the candidate and the batched fetch as they are, passes with the
// separate migrations added to the list, and leaves no schema behind.
func TestAmendmentRegressionScriptMakesItsOwnSchema(t *testing.T) {
	t.Parallel()
	psqlPath(t)
	provider := upstream.Require(t)
	p := newProviderRole(t)
	ctx := context.Background()
	const source, self = "released_source", "expired_lease_self_made"
	require.NoError(t, provider.Migrate(ctx, p.srcAs(t, p.role), source))
	standIn := releasedStandIn(t, p.dsn(t), source, self)

	checkout := t.TempDir()
	write := func(path, text string) {
		full := filepath.Join(checkout, filepath.FromSlash(path))
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(text), 0o644))
	}
	script, err := os.ReadFile(regressionScript)
	require.NoError(t, err)
	write("tests/expired_lease_stale_caller.sql", string(script))
	write("migrations/0000_released_stand_in.sql", standIn)
	for _, f := range []string{upstream.InFlightBatchedFetch, upstream.InFlightCandidate} {
		text, err := upstream.InFlightPort(f)
		require.NoError(t, err)
		write("migrations/"+f, text)
	}
	orchFile, orchText := offerText(t, upstream.Amendment)
	batchedFile, batchedText := offerText(t, upstream.BatchedAmendment)
	write("migrations/"+orchFile, orchText)
	write("migrations/"+batchedFile, batchedText)

	conn, err := sql.Open("pgx", p.dsn(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	schemas := func() string {
		var s string
		require.NoError(t, conn.QueryRow(`SELECT string_agg(nspname, ',' ORDER BY nspname) FROM pg_namespace`).Scan(&s))
		return s
	}
	before := schemas()
	list := "0000_released_stand_in.sql " + upstream.InFlightBatchedFetch + " " + upstream.InFlightCandidate
	scriptPath := filepath.Join(checkout, "tests", "expired_lease_stale_caller.sql")

	r := runScript(t, scriptPath, p.dsn(t), "self_made_schema="+self, "migrations="+list)
	t.Logf("the candidate:\n%s", r.out)
	require.Equal(t, []int{2, 3, 6, 7, 8}, r.failed())
	require.Equal(t, 3, r.exit)
	require.Contains(t, r.out, "schema "+self+" (made by this script), newest recorded migration 24 ("+upstream.InFlightCandidate+")")
	require.Equal(t, before, schemas(), "no schema is left behind")

	r = runScript(t, scriptPath, p.dsn(t), "self_made_schema="+self, "migrations="+list+" "+orchFile+" "+batchedFile)
	t.Logf("the candidate and the amendment:\n%s", r.out)
	require.Empty(t, r.failed(), r.out)
	require.Empty(t, r.skipped(), r.out)
	require.Zero(t, r.exit, r.out)
	require.Contains(t, r.out, "newest recorded migration 28 ("+batchedFile+")")
	require.Equal(t, before, schemas(), "no schema is left behind")
}

// databaseState is what the script must leave as it found it: the schema's
// catalog and function bodies, every table's rows, every sequence's
// position, _duroxide_migrations and the database's extensions.
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

// advisoryLocks counts the advisory locks held in conn's database by
// other sessions.
func advisoryLocks(t *testing.T, conn *sql.DB) int {
	t.Helper()
	var n int
	require.NoError(t, conn.QueryRow(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND pid <> pg_backend_pid()`).Scan(&n))
	return n
}

// seedOffer commits rows the script must neither see in its way nor
// change: a visible message and a visible worker item a day old (the
// fetches must still take the script's own, older or tagged ones), a
// message due in an hour, a live lease; the first ones move the queues'
// sequences.
func seedOffer(t *testing.T, conn *sql.DB, schema string) {
	t.Helper()
	q := quoteIdent(schema)
	_, err := conn.Exec(`INSERT INTO ` + q + `.orchestrator_queue (instance_id, work_item, visible_at, created_at) VALUES
		('seeded-visible', '{"StartOrchestration":{"instance":"seeded-visible","orchestration":"Seeded","version":"1.0.0","input":"null","execution_id":1}}', now() - interval '1 day', now()),
		('seeded-due-later', '{"StartOrchestration":{"instance":"seeded-due-later","orchestration":"Seeded","version":"1.0.0","input":"null","execution_id":1}}', now() + interval '1 hour', now())`)
	require.NoError(t, err)
	_, err = conn.Exec(`INSERT INTO ` + q + `.worker_queue (work_item, visible_at, created_at) VALUES ('{}', now() - interval '1 day', now())`)
	require.NoError(t, err)
	_, err = conn.Exec(`INSERT INTO ` + q + `.instance_locks (instance_id, lock_token, locked_until, locked_at)
		VALUES ('seeded-leased', 'lock_seeded', (extract(epoch FROM now()) * 1000)::bigint + 600000, (extract(epoch FROM now()) * 1000)::bigint)`)
	require.NoError(t, err)
}

// The figures the tests read are the ones the script prints.
func TestAmendmentScriptFiguresParse(t *testing.T) {
	t.Parallel()
	r := tapRun{lines: map[int]string{
		2: "not ok 2 - fetch_orchestration_item, reproduction A: the lease is valid at return (-5003 ms left by the database clock, want > 4000; p_now_ms 10000 ms stale, lock timeout 5000 ms)",
		4: "ok 4 - fetch_orchestration_item, the bound: a lease ends no later than p_now_ms + bound + lock timeout (it ends 35000 ms after p_now_ms, want <= bound 30000)",
		5: "ok 5 - fetch_work_items, reproduction A: it claims the one visible item # SKIP schema s has no fetch_work_items",
	}}
	require.Equal(t, int64(-5003), r.figure(t, 2, "ms left by the database clock"))
	require.Equal(t, int64(35000), r.figure(t, 4, "ms after p_now_ms"))
	require.Equal(t, []int{2}, r.failed())
	require.Equal(t, []int{5}, r.skipped())
	script, err := os.ReadFile(regressionScript)
	require.NoError(t, err)
	for _, s := range []string{"' ms left by the database clock, want > '", "'it ends ' || (v_until - v_now_ms) || ' ms after p_now_ms", "'ok %s - %s # SKIP %s'", "\\echo 1..9"} {
		require.Contains(t, string(script), s, "the script prints what the tests read")
	}
}
