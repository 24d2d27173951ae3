package migrations_test

// Every shell command README.md, docs/OPERATIONS.md and docs/RUNTIME.md show runs here, from
// the checkout's root, as written: the documents' DSNs become a throwaway
// database's, `bin/harness` the harness built from this checkout, and
// nothing else changes. A block this file does not know fails the test, so
// a command added to the documents gets its run here.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/harness/ops/doctor"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// docBlock is one ```sh block of a document.
type docBlock struct {
	file  string
	line  int
	lines []string // as written, comments and blank lines included
}

var fenceRE = regexp.MustCompile("(?s)```sh\n(.*?)```")

func docBlocks(t *testing.T, file string) []docBlock {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", file))
	require.NoError(t, err)
	var out []docBlock
	text := string(raw)
	for _, m := range fenceRE.FindAllStringSubmatchIndex(text, -1) {
		body := text[m[2]:m[3]]
		out = append(out, docBlock{file: file, line: strings.Count(text[:m[0]], "\n") + 1, lines: strings.Split(strings.TrimRight(body, "\n"), "\n")})
	}
	return out
}

// docState is the database a block starts on.
type docState int

const (
	fresh        docState = iota // an empty database
	realUpstream                 // made by the real provider (upstream's runner)
	realAsApp                    // made by the real provider connected as role duroxide_app
	latest                       // the pack's latest
	trapped                      // the pack's latest, one message trapped (attempt_count 50) for docs-instance-1
	notRun                       // the block is not run here (reason given)
	// The runbooks' states (docs/RUNBOOKS.md): as duroxide-pg's runner
	// leaves a database, every object owned by role duroxide_app.
	upstream19AsApp // shaped like upstream 19
	upstream20AsApp // shaped like upstream 20
	upstream21AsApp // shaped like upstream 21
	candidateAsApp  // made by the real provider, then upstream's candidate fix (port)
	trappedAsApp    // trapped, every object owned by role duroxide_app
	// After an upgrade of duroxide-pg (upgrade_test.go): adopted at the
	// pack's latest, then upstream's candidate fix applied by its runner
	// over the pack's fetch.
	replaced      // as the test's own role
	replacedAsApp // every object owned by role duroxide_app
)

// docSpec says how a block runs: its start state, the exit status of the
// commands that do not exit 0 (by a substring of the command), and for
// notRun why.
type docSpec struct {
	state docState
	exits map[string]int
	why   string
	// interrupt: commands (by substring) that run until Ctrl-C: they get
	// SIGINT after two seconds and must then exit 0.
	interrupt []string
	// writes: files the block leaves in the scratch directory (the
	// documents' /var/lib/node_exporter), with a line each must hold.
	writes map[string]string
	// whole: the block is one command line (a crontab entry, a line
	// continued with a backslash), run as one script.
	whole bool
	// prints: a text the block's last command must print.
	prints string
	// setup: command lines, as a document writes them, that take the start
	// state to where the block begins (a rollback runbook starts after
	// its adoption); each must exit 0.
	setup []string
	// keepsRecorded: after the block, _duroxide_migrations records what
	// the start state recorded, no more and no less (a rollback keeps the
	// schema the application's release runs).
	keepsRecorded bool
	// allFixed: after the block, every function the pack fixes carries
	// its fix (doctor's verdict).
	allFixed bool
}

// docSpecs are keyed by the block's first line, as written.
var docSpecs = map[string]docSpec{
	// README.md, docs/ADOPTING.md
	"make repro   # show the bugs and the fixes (orchestration fetch, worker queue, the real runtime), on a throwaway PostgreSQL": {
		state: notRun, why: "make repro and make test are what CI runs (.ci/run): the whole suite cannot run itself"},
	"export HARNESS_DSN='postgres://postgres:harness@127.0.0.1:55432/postgres?sslmode=disable'": {
		state: notRun, why: "make test against docker compose's server, which needs a Docker engine; the dsn backend it selects is tested by pgtest's TestDSNBackend*"},
	"make up DSN='postgres://user@host:5432/app' SCHEMA=duroxide":                      {state: fresh},
	"go run ./harness/cmd/harness baseline --dsn \"$DSN\" --schema duroxide --dry-run": {state: realUpstream},
	"psql \"$DSN\" -c 'CREATE SCHEMA IF NOT EXISTS duroxide'":                          {state: fresh},
	// docs/BENCH.md, docs/MATRIX.md
	"make bench                                   # = harness-lab bench --report docs/bench": {
		state: notRun, why: "a full bench takes 8 minutes and rewrites docs/bench/; its scenarios run at small sizes in internal/sim/bench's tests"},
	"scripts/pg-matrix.sh                 # 14 15 16 17 18, full suite": {
		state: notRun, why: ".ci/run runs it (make matrix, MATRIX_TESTS=pack on 14, 16, 17, 18); the full matrix is five runs of the suite"},
	"PG_BIN=/var/cache/duroxide-pg-migrations/pg/16/current/bin go test ./...": {
		state: notRun, why: "the matrix's own step: scripts/pg-matrix.sh runs the suite and the repro with PG_BIN set this way"},
	// docs/OPERATIONS.md
	"pg_dump --schema=duroxide --format=custom --file=duroxide-before-fix.dump \"$DSN\"":                                      {state: realUpstream},
	"bin/harness doctor --dsn \"$DSN\" --schema duroxide":                                                                     {state: realUpstream, exits: map[string]int{"doctor": 1}}, // warnings: unfixed, no goose table
	"bin/harness baseline --dsn \"$DSN\" --schema duroxide --dry-run   # what it would do, and what migrate up would then do": {state: realUpstream},
	"bin/harness baseline   --dsn \"$ADMIN_DSN\" --schema duroxide --role duroxide_app":                                       {state: realAsApp},
	"bin/harness migrate plan --dsn \"$DSN\" --schema duroxide          # 0.1.26 and earlier: --to 21 (section 3)":            {state: fresh},
	"bin/harness sql up --dsn \"$DSN\" --schema duroxide -o duroxide-up.sql      # 0.1.26 and earlier: --to 21":               {state: fresh},
	"export GOOSE_DRIVER=postgres": {state: fresh},
	"bin/harness migrate up --dsn \"postgres://duroxide_owner@db-host:5432/app\" --schema duroxide   # direct: 5432": {state: fresh},
	"bin/harness doctor --dsn \"$DSN\" --schema duroxide            # expect OK, every fixed function \"fixed\"":     {state: latest, interrupt: []string{"--watch"}},
	"# cron, every minute; node_exporter --collector.textfile.directory=/var/lib/node_exporter": {state: latest, whole: true,
		writes: map[string]string{"duroxide.prom": "duroxide_doctor_status"}},
	"bin/harness doctor --dsn \"$DSN\" --schema duroxide --reset-attempts INSTANCE...          # dry run": {state: trapped},
	// docs/RUNTIME.md
	"make upstream": {state: fresh},
	"echo '{\"dsn\":\"postgres://...\",\"schema\":\"trial\",\"scenarios\":[{\"name\":\"fanout\",\"count\":500}]}' \\":    {state: fresh, whole: true, prints: `"status":"Completed"`},
	"bin/harness migrate plan --dsn \"$DSN\" --schema duroxide --to 24   # the down path: each Down, its locks and time": {state: latest},
	// docs/RUNBOOKS.md: each runbook on its state, as the application's
	// role owns it; each rollback after its runbook's adoption.
	"# runbook 1..19: duroxide-pg 0.1.26 and earlier; stop at goose 21":        {state: upstream19AsApp, exits: runbookExits(1)},
	"# rollback 1..19: to goose 19":                                            {state: upstream19AsApp, setup: runbookAdoption("--to 21"), keepsRecorded: true},
	"# runbook 1..20: duroxide-pg 0.1.27":                                      {state: upstream20AsApp, exits: runbookExits(0)},
	"# rollback 1..20: to goose 22":                                            {state: upstream20AsApp, setup: runbookAdoption(""), keepsRecorded: true},
	"# runbook 1..21: duroxide-pg 0.1.28 to 0.1.33":                            {state: upstream21AsApp, exits: runbookExits(0)},
	"# rollback 1..21: to goose 23":                                            {state: upstream21AsApp, setup: runbookAdoption(""), keepsRecorded: true},
	"# runbook 1..21 and 23: duroxide-pg 0.1.35 and releases with upstream 23": {state: realAsApp, exits: runbookExits(0)},
	"# rollback 1..21 and 23: to goose 24":                                     {state: realAsApp, setup: runbookAdoption(""), keepsRecorded: true},
	"# runbook candidate: a release with upstream's candidate fix":             {state: candidateAsApp, exits: runbookExits(0)},
	"# rollback candidate: to goose 29":                                        {state: candidateAsApp, setup: runbookAdoption(""), keepsRecorded: true},
	"# after an upgrade: duroxide-pg's runner replaced a fix":                  {state: replacedAsApp, exits: map[string]int{"# replaced: exit 1": 1}, keepsRecorded: true, allFixed: true},
	"# after the fixes: messages the bug trapped":                              {state: trappedAsApp, exits: map[string]int{"# trapped: exit 1": 1}, allFixed: true},
	// docs/OPERATIONS.md, the restore step with psql and the stock goose CLI.
	"psql -v ON_ERROR_STOP=1 -c 'SET search_path TO duroxide' -f sql/restore/0001_restore_fixes.sql \"$DSN\"": {state: replaced, keepsRecorded: true, allFixed: true},
}

// runbookExits are a runbook's doctor exits: 1 before the fixes, after
// them the given code.
func runbookExits(after int) map[string]int {
	return map[string]int{"# before: exit 1": 1, "# after: exit": after}
}

// runbookAdoption is what every runbook does before its rollback:
// baseline, then migrate up (with its flag: --to 21 where the runbook
// stops there).
func runbookAdoption(to string) []string {
	return []string{
		`bin/harness baseline --dsn "$ADMIN_DSN" --schema duroxide --role duroxide_app`,
		strings.TrimSpace(`bin/harness migrate up --dsn "$ADMIN_DSN" --schema duroxide --role duroxide_app ` + to),
	}
}

func TestEveryDocumentedCommandRunsFromTheCheckoutRoot(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	bin := filepath.Join(t.TempDir(), "harness")
	build := exec.Command("go", "build", "-o", bin, "./harness/cmd/harness")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	var blocks []docBlock
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	files := []string{"README.md"}
	for _, d := range docs {
		files = append(files, filepath.ToSlash(strings.TrimPrefix(d, root+string(filepath.Separator))))
	}
	require.Contains(t, files, "docs/OPERATIONS.md")
	for _, f := range files {
		blocks = append(blocks, docBlocks(t, f)...)
	}
	require.NotEmpty(t, blocks)
	seen := map[string]bool{}
	for _, b := range blocks {
		first := b.lines[0]
		spec, ok := docSpecs[first]
		require.True(t, ok, "%s:%d: a block this test does not know; give it a docSpec: %q", b.file, b.line, first)
		seen[first] = true
		t.Run(fmt.Sprintf("%s:%d", b.file, b.line), func(t *testing.T) {
			if spec.state == notRun {
				t.Logf("not run here: %s", spec.why)
				require.NotEmpty(t, spec.why)
				return
			}
			runDocBlock(t, root, bin, b, spec)
		})
	}
	for first := range docSpecs {
		require.True(t, seen[first], "a docSpec for a block no document has any more: %q", first)
	}
}

// docDB makes the block's start state and returns its DSN (no query
// string: the documents append one) and its database.
func docDB(t *testing.T, state docState) (dsn string, db *testdb.Database) {
	t.Helper()
	ctx := context.Background()
	switch state {
	case latest, trapped, trappedAsApp:
		db = dbs.New(t, testdb.Latest)
	case upstream19AsApp, upstream20AsApp, upstream21AsApp:
		db = dbs.UpstreamShaped(t, map[docState]int64{upstream19AsApp: 19, upstream20AsApp: 20, upstream21AsApp: 21}[state])
		ownByApp(t, db)
	case candidateAsApp:
		db = dbs.UpstreamCandidate(t)
		ownByApp(t, db)
	case replaced:
		db = dbs.Upgraded(t, upstream.InFlightCandidate)
	case replacedAsApp:
		db = dbs.Upgraded(t, upstream.InFlightCandidate)
		ownByApp(t, db)
	default:
		db = dbs.New(t, 0)
	}
	switch state {
	case trapped, trappedAsApp:
		conn, err := pgx.Connect(ctx, db.DSN)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "INSERT INTO "+db.Qualify("orchestrator_queue")+" (instance_id, work_item, visible_at, created_at, attempt_count) VALUES ('docs-instance-1', '{}', now(), now(), 50)")
		require.NoError(t, err)
		if state == trappedAsApp {
			ownByApp(t, db)
		}
	case realUpstream:
		require.NoError(t, upstream.Require(t).Migrate(ctx, db.Source, "duroxide"))
	case realAsApp:
		p := upstream.Require(t)
		conn, err := pgx.Connect(ctx, db.DSN)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, `DO $$ BEGIN CREATE ROLE duroxide_app LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$`)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "GRANT CREATE ON DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" TO duroxide_app")
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "DROP SCHEMA IF EXISTS duroxide")
		require.NoError(t, err)
		asApp, err := pgx.ParseConfig(db.DSN)
		require.NoError(t, err)
		require.NoError(t, p.Migrate(ctx, testdb.MustSource(t, strings.Replace(db.DSN, "://"+asApp.User+"@", "://duroxide_app@", 1)), "duroxide"))
	}
	base, _, _ := strings.Cut(db.DSN, "?")
	return base, db
}

// upstreamRecorded are the versions db's _duroxide_migrations records.
func upstreamRecorded(t *testing.T, db *testdb.Database) []int64 {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT version FROM "+db.Qualify("_duroxide_migrations")+" ORDER BY version")
	require.NoError(t, err)
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return versions
}

// ownByApp gives db's schema and every object in it to role duroxide_app
// (made if missing, with CREATE on the database), as when duroxide-pg's
// runner, connected as the application, made them.
func ownByApp(t *testing.T, db *testdb.Database) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, stmt := range []string{
		`DO $$ BEGIN CREATE ROLE duroxide_app LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$`,
		"GRANT CREATE ON DATABASE " + pgx.Identifier{db.Name}.Sanitize() + " TO duroxide_app",
		"ALTER SCHEMA " + pgx.Identifier{db.Schema}.Sanitize() + " OWNER TO duroxide_app",
		// Tables take their indexes and owned sequences along.
		`DO $$
		DECLARE r record;
		BEGIN
			FOR r IN SELECT c.oid::regclass AS rel, c.relkind FROM pg_class c
			         WHERE c.relnamespace = '` + db.Schema + `'::regnamespace AND c.relkind IN ('r', 'p', 'S', 'v')
			           AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype IN ('a', 'i'))
			LOOP
				EXECUTE format('ALTER %s %s OWNER TO duroxide_app', CASE r.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW' ELSE 'TABLE' END, r.rel);
			END LOOP;
			FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_proc p WHERE p.pronamespace = '` + db.Schema + `'::regnamespace LOOP
				EXECUTE format('ALTER FUNCTION %s OWNER TO duroxide_app', r.fn);
			END LOOP;
		END $$`,
	} {
		_, err := conn.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
}

// docSubstitutions turn a document's line into the one the test runs.
func docLine(line, dsn, bin, scratch string) string {
	r := strings.NewReplacer(
		"go run ./harness/cmd/harness ", bin+" ",
		"bin/harness ", bin+" ",
		"postgres://user@host:5432/app", dsn,
		"postgres://duroxide_owner@db-host:5432/app", dsn,
		"postgres://...", dsn+"?sslmode=disable",
		"/var/lib/node_exporter/", scratch+"/",
		"INSTANCE...", "docs-instance-1",
	)
	return r.Replace(line)
}

// docOutputs are the files the documents' commands write into the
// checkout's root; the test refuses to run over an existing one and
// removes what it wrote.
var docOutputs = []string{"duroxide-before-fix.dump", "up.sql", "duroxide-up.sql", "duroxide-down.sql"}

func runDocBlock(t *testing.T, root, bin string, b docBlock, spec docSpec) {
	dsn, db := docDB(t, spec.state)
	var recorded []int64
	if spec.keepsRecorded {
		recorded = upstreamRecorded(t, db)
		require.NotEmpty(t, recorded, "the start state records upstream versions")
		defer func() {
			require.Equal(t, recorded, upstreamRecorded(t, db), "%s:%d leaves _duroxide_migrations as the start state had it", b.file, b.line)
		}()
	}
	for _, f := range docOutputs {
		path := filepath.Join(root, f)
		_, err := os.Stat(path)
		require.True(t, os.IsNotExist(err), "%s exists in the checkout; the test will not overwrite it", path)
		t.Cleanup(func() { _ = os.Remove(path) })
	}
	scratch := t.TempDir()
	env := append(os.Environ(), "DSN="+dsn, "ADMIN_DSN="+dsn, "DUROXIDE_PG_DSN="+dsn, "PGSSLMODE=disable", "HARNESS_DSN=")
	lines := b.lines
	if spec.whole {
		var joined []string
		for _, l := range lines {
			if !strings.HasPrefix(strings.TrimSpace(l), "#") {
				joined = append(joined, l)
			}
		}
		lines = []string{strings.Join(joined, "\n")}
	}
	for _, l := range spec.setup {
		code, output := runDocCommand(t, root, env, docLine(l, dsn, bin, scratch), false)
		require.Equal(t, 0, code, "%s:%d: setup %s\n%s", b.file, b.line, l, output)
	}
	var exports []string
	var last string
	for i, raw := range lines {
		line := strings.TrimSpace(raw)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if line == "# or" {
			continue
		}
		cmdline := docLine(line, dsn, bin, scratch)
		if strings.HasPrefix(line, "pg_dump ") {
			if why := pgDumpTooOld(t, dsn); why != "" {
				t.Logf("%s:%d: not run here: %s", b.file, b.line+1+i, why)
				continue
			}
		}
		if strings.HasPrefix(line, "export ") {
			exports = append(exports, cmdline)
			continue
		}
		want := 0
		for sub, code := range spec.exits {
			if strings.Contains(line, sub) {
				want = code
			}
		}
		interrupt := false
		for _, sub := range spec.interrupt {
			interrupt = interrupt || strings.Contains(line, sub)
		}
		script := strings.Join(append(append([]string{}, exports...), cmdline), "\n")
		code, output := runDocCommand(t, root, env, script, interrupt)
		t.Logf("%s:%d: %s -> exit %d\n%s", b.file, b.line+1+i, line, code, output)
		require.Equal(t, want, code, "%s:%d: %s\n%s", b.file, b.line+1+i, line, output)
		last = output
	}
	require.Contains(t, last, spec.prints, "%s:%d prints what the document says", b.file, b.line)
	if spec.allFixed {
		fs, err := doctor.Functions(context.Background(), sqlDB(t, db), db.Schema)
		require.NoError(t, err)
		require.True(t, doctor.AllFixed(fs), "%s:%d leaves every fix in force: %+v", b.file, b.line, fs)
	}
	for name, want := range spec.writes {
		got, err := os.ReadFile(filepath.Join(scratch, name))
		require.NoError(t, err, "%s:%d leaves %s", b.file, b.line, name)
		require.Contains(t, string(got), want)
	}
}

// runDocCommand runs script with bash in root; with interrupt it sends
// SIGINT after two seconds (Ctrl-C).
func runDocCommand(t *testing.T, root string, env []string, script string, interrupt bool) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = root
	cmd.Env = env
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if interrupt {
		// bash forwards nothing: run the one command in its own group and
		// signal the group, as a terminal's Ctrl-C does.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		require.NoError(t, cmd.Start())
		time.Sleep(2 * time.Second)
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		err := cmd.Wait()
		return exitCode(err), out.String()
	}
	err := cmd.Run()
	return exitCode(err), out.String()
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}

// pgDumpTooOld says why the pg_dump on PATH cannot dump the test's server
// (it refuses a server of a newer major: the matrix's servers come without
// client tools), "" when it can.
func pgDumpTooOld(t *testing.T, dsn string) string {
	t.Helper()
	out, err := exec.Command("pg_dump", "--version").Output()
	require.NoError(t, err, "pg_dump --version")
	m := regexp.MustCompile(`\) (\d+)`).FindStringSubmatch(string(out))
	require.NotNil(t, m, "pg_dump --version: %s", out)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn+"?sslmode=disable")
	require.NoError(t, err)
	defer conn.Close(ctx)
	var server int
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int / 10000").Scan(&server))
	if client, _ := strconv.Atoi(m[1]); client < server {
		return fmt.Sprintf("pg_dump %d refuses a server of major %d (use the server's own pg_dump)", client, server)
	}
	return ""
}
