package migrations_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
)

func TestEveryFileIsAPortOrAFixAndVersionsAreContiguous(t *testing.T) {
	p, err := migrations.Pack()
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range p {
		if m.Version != int64(i+1) {
			t.Errorf("%s: goose version %d, want %d (no gaps in the pack)", m.File, m.Version, i+1)
		}
		if m.IsPort() == (len(m.Fixes) > 0) {
			t.Errorf("%s: upstream=%d fixes=%v: a file is either a port or a fix", m.File, m.Upstream, m.Fixes)
		}
	}
}

func TestPortsRecordIncreasingUpstreamVersionsUnderUpstreamsFileNames(t *testing.T) {
	var last int64
	for _, m := range migrations.MustPack() {
		if !m.IsPort() {
			continue
		}
		if m.Upstream <= last {
			t.Errorf("%s ports upstream %d after upstream %d", m.File, m.Upstream, last)
		}
		last = m.Upstream
		if !strings.HasPrefix(m.UpstreamName, fmt.Sprintf("%04d_", m.Upstream)) {
			t.Errorf("%s records (%d, %q): upstream's file names start with the version", m.File, m.Upstream, m.UpstreamName)
		}
	}
}

func TestEveryFixNamesFunctionsItDefinesAndGuards(t *testing.T) {
	for _, m := range migrations.Fixes() {
		for _, fn := range m.Fixes {
			var up, guard bool
			for _, d := range m.Definitions {
				up = up || (d.Function == fn && !d.Down)
			}
			for _, k := range m.Known {
				guard = guard || k.Function == fn
			}
			if !up {
				t.Errorf("%s says it fixes %s but its Up defines no %s", m.File, fn, fn)
			}
			if !guard {
				t.Errorf("%s fixes %s without a guard table of the definitions it replaces", m.File, fn)
			}
		}
		for _, d := range m.Definitions {
			if !slices.Contains(m.Fixes, d.Function) && !slices.Contains(m.Adds, "function "+d.Function) {
				t.Errorf("%s defines %s, which neither its Fixes nor its Adds header names", m.File, d.Function)
			}
		}
	}
}

func TestUpAndDownGuardsOfAFixKnowTheSameDefinitions(t *testing.T) {
	for _, m := range migrations.Fixes() {
		up, down := map[migrations.Known]bool{}, map[migrations.Known]bool{}
		for _, k := range m.Known {
			key := k
			key.Down = false
			if k.Down {
				down[key] = true
			} else {
				up[key] = true
			}
		}
		if len(down) == 0 {
			continue // a Down that installs one fixed text needs no table
		}
		for k := range up {
			if !down[k] {
				t.Errorf("%s: Up knows %s %s (%s), Down does not", m.File, k.Function, k.Fingerprint, k.Definition)
			}
		}
		for k := range down {
			if !up[k] {
				t.Errorf("%s: Down knows %s %s (%s), Up does not", m.File, k.Function, k.Fingerprint, k.Definition)
			}
		}
	}
}

// Every definition a fix migration's guard knows has, at the pack's
// latest, a fix that serves its behaviour or a fix that leaves it on
// purpose, and each fix serves what its Leaves line does not name: the
// restore step (harness/ops/restore) reads exactly this.
func TestEveryKnownBehaviourHasTheFixThatServesItOrIsLeftOnPurpose(t *testing.T) {
	latest := migrations.Latest()
	for _, m := range migrations.Fixes() {
		for fn, behaviours := range m.Leaves {
			require.Contains(t, m.Fixes, fn, "%s leaves %s, which it does not fix", m.File, fn)
			for _, b := range behaviours {
				require.True(t, slices.ContainsFunc(m.Known, func(k migrations.Known) bool { return k.Function == fn && k.BehavesAs == b && !k.Down }),
					"%s leaves %s as upstream %d, which its guard does not know", m.File, fn, b)
			}
		}
		for _, fn := range m.Fixes {
			for _, k := range migrations.KnownDefinitions(fn) {
				fix, body, ok := migrations.FixFor(fn, k.BehavesAs, latest)
				if !ok {
					t.Errorf("%s %s (%s, upstream %d behaviour): no fix of the pack serves it", fn, k.Fingerprint, k.Definition, k.BehavesAs)
					continue
				}
				require.Contains(t, fix.Fixes, fn)
				require.Equal(t, fn, body.Function)
				require.False(t, body.Down)
				require.True(t, strings.HasPrefix(body.Statement, "CREATE OR REPLACE FUNCTION "+fn+"(") && strings.HasSuffix(body.Statement, "$fn$;"),
					"%s: the statement of %s: %.60q", fix.File, fn, body.Statement)
				require.Contains(t, body.Statement, body.Source)
			}
		}
	}
}

func TestFixForPicksTheNewestBodyOfTheBehaviour(t *testing.T) {
	fix, body, ok := migrations.FixFor("fetch_orchestration_item", 24, 33)
	require.True(t, ok)
	require.Equal(t, int64(29), fix.Version, "0029 takes the candidate's key: it serves the candidate")
	require.Equal(t, []string{"LOCK TABLE orchestrator_queue IN EXCLUSIVE MODE;"}, fix.UpLocks)
	require.Nil(t, body.Behaviours)
	bounded, _, ok := migrations.FixFor("fetch_orchestration_item", 24, migrations.Latest())
	require.True(t, ok)
	require.Equal(t, int64(34), bounded.Version, "0034 bounds the lease of every behaviour 0029 serves")
	require.Empty(t, bounded.UpLocks, "0034 keeps 0029's key, and takes no table lock")
	_, _, ok = migrations.FixFor("fetch_orchestration_item", 24, 28)
	require.False(t, ok, "0020 and 0027 leave the candidate")
	fix, _, ok = migrations.FixFor("fetch_orchestration_item", 19, 28)
	require.True(t, ok)
	require.Equal(t, int64(27), fix.Version)
	// 0021 holds one body per behaviour, each marked.
	_, b19, ok := migrations.FixFor("ack_orchestration_item", 19, 21)
	require.True(t, ok)
	_, b20, ok := migrations.FixFor("ack_orchestration_item", 20, 21)
	require.True(t, ok)
	require.Equal(t, []int64{19}, b19.Behaviours)
	require.Equal(t, []int64{20}, b20.Behaviours)
	require.NotEqual(t, b19.Source, b20.Source)
	_, _, ok = migrations.FixFor("ack_orchestration_item", 20, 20)
	require.False(t, ok, "below 0021 nothing fixes the ack")
}

func TestFingerprintIsTheMD5OfTheSource(t *testing.T) {
	if got := (migrations.Definition{Source: ""}).Fingerprint(); got != "d41d8cd98f00b204e9800998ecf8427e" {
		t.Fatalf("Fingerprint(\"\") = %s", got)
	}
}

func TestEveryIntendedCostNamesAFunctionTheFixLeavesAlone(t *testing.T) {
	names := map[string]bool{}
	for _, m := range migrations.MustPack() {
		for _, d := range m.Definitions {
			names[d.Function] = true
		}
	}
	for _, m := range migrations.Fixes() {
		for _, fn := range m.Costs {
			if !names[fn] {
				t.Errorf("%s: its Costs line names %s, which no migration defines", m.File, fn)
			}
			if slices.Contains(m.Fixes, fn) {
				t.Errorf("%s: its Costs line names %s, which it fixes (a fix's own change is said by its Fixes line)", m.File, fn)
			}
		}
	}
	heads, ok := migrations.ByVersion(27)
	if !ok || len(heads.Costs) == 0 {
		t.Fatal("0027 says which functions pay for its heads")
	}
	if m, ok := migrations.IntendedCost("ack_worker", 27); !ok || m.Version != 27 {
		t.Errorf("IntendedCost(ack_worker, 27) = %v, %v", m.Version, ok)
	}
	if _, ok := migrations.IntendedCost("ack_worker", 26); ok {
		t.Error("no fix up to 26 makes ack_worker slower")
	}
}

func TestDigestChangesWithAnyFileAndOnlyWithTheFiles(t *testing.T) {
	files := fstest.MapFS{
		"0001_a.sql": {Data: []byte("-- +goose Up\nSELECT 1;\n")},
		"0002_b.sql": {Data: []byte("-- +goose Up\nSELECT 2;\n")},
		"README.md":  {Data: []byte("not a migration")},
	}
	d, n, err := migrations.Digest(files)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Len(t, d, 64)

	same := maps.Clone(files)
	same["README.md"] = &fstest.MapFile{Data: []byte("another text")}
	got, _, err := migrations.Digest(same)
	require.NoError(t, err)
	require.Equal(t, d, got, "only the .sql files count")

	for name, change := range map[string]func(fstest.MapFS){
		"a byte of a file": func(f fstest.MapFS) { f["0002_b.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nSELECT 3;\n")} },
		"a file renamed":   func(f fstest.MapFS) { f["0002_c.sql"] = f["0002_b.sql"]; delete(f, "0002_b.sql") },
		"a file added":     func(f fstest.MapFS) { f["0003_c.sql"] = &fstest.MapFile{Data: nil} },
		"a file removed":   func(f fstest.MapFS) { delete(f, "0001_a.sql") },
	} {
		f := maps.Clone(files)
		change(f)
		got, _, err := migrations.Digest(f)
		require.NoError(t, err)
		require.NotEqual(t, d, got, name)
	}

	d, n, err = migrations.Digest(migrations.FS)
	require.NoError(t, err)
	require.Len(t, d, 64)
	require.EqualValues(t, migrations.Latest(), n, "the embedded pack: one file per version")
}

// squawk (make lint-sql) runs clean only because of the exceptions the
// files and .squawk.toml list: each one says why, so that a reviewer can
// judge it.
func TestEverySquawkExceptionSaysWhy(t *testing.T) {
	exceptions := 0
	for _, m := range migrations.MustPack() {
		text, err := fs.ReadFile(migrations.FS, m.File)
		require.NoError(t, err)
		for _, line := range strings.Split(string(text), "\n") {
			if !strings.Contains(line, "squawk-ignore") {
				continue
			}
			exceptions++
			_, reason, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "--"), " -- ")
			if !ok || len(strings.TrimSpace(reason)) < 20 {
				t.Errorf("%s: %q: a squawk exception needs its reason after \" -- \"", m.File, line)
			}
		}
	}
	require.NotZero(t, exceptions, "no file lists a squawk exception: is the pack read?")
	cfg, err := os.ReadFile(".squawk.toml")
	require.NoError(t, err)
	lines := strings.Split(string(cfg), "\n")
	for i, line := range lines {
		rule := strings.Trim(strings.TrimSpace(line), `",`)
		if !strings.HasPrefix(strings.TrimSpace(line), `"`) {
			continue
		}
		if i == 0 || !strings.HasPrefix(strings.TrimSpace(lines[i-1]), "#") {
			t.Errorf(".squawk.toml: excluded rule %s has no comment above it saying why", rule)
		}
	}
}

// lockModes are PostgreSQL's table lock modes, weakest first.
var lockModes = []string{"ACCESS SHARE", "ROW SHARE", "ROW EXCLUSIVE", "SHARE UPDATE EXCLUSIVE",
	"SHARE", "SHARE ROW EXCLUSIVE", "EXCLUSIVE", "ACCESS EXCLUSIVE"}

// The statements of an Up or a Down that lock an existing table, with the
// mode PostgreSQL takes for each (the table is the last group).
var lockingStatements = []struct {
	re   *regexp.Regexp
	mode string // "" : the statement's own (LOCK TABLE)
}{
	{regexp.MustCompile(`(?im)^\s*ALTER TABLE (?:IF EXISTS )?(?:ONLY )?(\w+)`), "ACCESS EXCLUSIVE"},
	{regexp.MustCompile(`(?im)^\s*DROP TABLE (?:IF EXISTS )?(\w+)`), "ACCESS EXCLUSIVE"},
	{regexp.MustCompile(`(?im)^\s*CREATE (?:UNIQUE )?INDEX (?:IF NOT EXISTS )?\w+\s+ON\s+(\w+)`), "SHARE"},
	{regexp.MustCompile(`(?im)^\s*CREATE (?:UNIQUE )?INDEX CONCURRENTLY (?:IF NOT EXISTS )?\w+\s+ON\s+(\w+)`), "SHARE UPDATE EXCLUSIVE"},
	{regexp.MustCompile(`(?im)^\s*CREATE (?:OR REPLACE )?TRIGGER \w+\s+(?:AFTER|BEFORE|INSTEAD OF)[^;]*?\sON\s+(\w+)`), "SHARE ROW EXCLUSIVE"},
	{regexp.MustCompile(`(?im)^\s*DROP TRIGGER (?:IF EXISTS )?\w+ ON (\w+)`), "ACCESS EXCLUSIVE"},
	{regexp.MustCompile(`(?im)^\s*TRUNCATE (?:TABLE )?(\w+)`), "ACCESS EXCLUSIVE"},
	{regexp.MustCompile(`(?im)^\s*(?:UPDATE (\w+) SET|DELETE FROM (\w+)|INSERT INTO (\w+))`), "ROW EXCLUSIVE"},
	{regexp.MustCompile(`(?im)^\s*LOCK TABLE (\w+) IN ([A-Z ]+?) MODE`), ""},
}

var (
	createdTableRE = regexp.MustCompile(`(?i)CREATE TABLE (?:IF NOT EXISTS )?(\w+)`)
	createdIndexRE = regexp.MustCompile(`(?i)CREATE (?:UNIQUE )?INDEX (?:CONCURRENTLY )?(?:IF NOT EXISTS )?(\w+)\s+ON\s+(\w+)`)
	dropIndexRE    = regexp.MustCompile(`(?im)^\s*DROP INDEX (CONCURRENTLY )?(?:IF EXISTS )?(\w+)`)
	// A function body, where statements run when the function is called,
	// not when the migration is.
	functionBodyRE = regexp.MustCompile(`(?s)CREATE (?:OR REPLACE )?FUNCTION .*?AS \$fn\$.*?\$fn\$`)
	sqlCommentRE   = regexp.MustCompile(`(?m)--.*$`)
)

// indexTables maps every index the pack creates to its table.
func indexTables(pack []migrations.Migration) map[string]string {
	out := map[string]string{}
	for _, m := range pack {
		for _, c := range createdIndexRE.FindAllStringSubmatch(m.Up+m.Down, -1) {
			out[c[1]] = c[2]
		}
	}
	return out
}

// sectionLocks works out, from the statements of one section of a
// migration (its Up or its Down: function bodies and comments aside), the
// strongest lock it takes on each table that existed before it ran (not
// one it creates itself, nor upstream's bookkeeping table), by table.
func sectionLocks(section string, indexTable map[string]string) map[string]string {
	sql := sqlCommentRE.ReplaceAllString(functionBodyRE.ReplaceAllString(section, ""), "")
	created := map[string]bool{"_duroxide_migrations": true}
	for _, c := range createdTableRE.FindAllStringSubmatch(sql, -1) {
		created[c[1]] = true
	}
	strongest := map[string]string{}
	take := func(table, mode string) {
		if table == "" || created[table] {
			return
		}
		if slices.Index(lockModes, mode) > slices.Index(lockModes, strongest[table]) {
			strongest[table] = mode
		}
	}
	for _, st := range lockingStatements {
		for _, g := range st.re.FindAllStringSubmatch(sql, -1) {
			if st.mode == "" {
				take(g[1], strings.ToUpper(g[2]))
				continue
			}
			// The table is the statement's one non-empty group.
			take(strings.Join(g[1:], ""), st.mode)
		}
	}
	for _, g := range dropIndexRE.FindAllStringSubmatch(sql, -1) {
		if g[1] != "" {
			take(indexTable[g[2]], "SHARE UPDATE EXCLUSIVE")
			continue
		}
		take(indexTable[g[2]], "ACCESS EXCLUSIVE")
	}
	return strongest
}

// locksParagraphMisses is what a Locks paragraph (label, for the message)
// fails to say of the locks a section takes: one complaint per table whose
// strongest lock it does not name as "MODE on table", or one when the
// section locks no existing table and the paragraph does not say so.
func locksParagraphMisses(label, paragraph string, locks map[string]string) []string {
	if len(locks) == 0 {
		if !strings.Contains(paragraph, "no table lock") && !strings.Contains(paragraph, "no lock on an existing table") {
			return []string{fmt.Sprintf("it locks no existing table, and its %s paragraph should say so (\"no table lock\"): %q", label, paragraph)}
		}
		return nil
	}
	var out []string
	for _, table := range slices.Sorted(maps.Keys(locks)) {
		if want := locks[table] + " on " + table; !strings.Contains(paragraph, want) {
			out = append(out, fmt.Sprintf("it takes %s; the %s paragraph does not say %q: %q", want, label, want, paragraph))
		}
	}
	return out
}

// hasStatements reports whether a section runs anything (comments and
// blank lines aside).
func hasStatements(section string) bool {
	return strings.TrimSpace(sqlCommentRE.ReplaceAllString(section, "")) != ""
}

// An operator schedules a migration, and its rollback, by what it locks and
// how long it takes: every file's header says both for its Up, and for its
// Down when it has one. Its Locks paragraph names, as "MODE on table", the
// strongest lock the Up's statements take on each table that existed
// before it (worked out here from the statements), or says it takes none;
// its Down locks paragraph does the same for the Down's statements (a
// table the Up created exists before the Down: its DROP TABLE counts).
func TestEveryMigrationSaysWhatItLocksAndHowLongItTakes(t *testing.T) {
	pack := migrations.MustPack()
	indexTable := indexTables(pack)
	for _, m := range pack {
		if m.Locks == "" || m.Duration == "" {
			t.Errorf("%s: the header needs a -- Locks: and a -- Duration: paragraph (locks %q, duration %q)", m.File, m.Locks, m.Duration)
		} else {
			for _, miss := range locksParagraphMisses("Locks", m.Locks, sectionLocks(m.Up, indexTable)) {
				t.Errorf("%s: its Up: %s", m.File, miss)
			}
		}
		if !hasStatements(m.Down) {
			if m.DownLocks != "" || m.DownDuration != "" {
				t.Errorf("%s: no Down, yet a Down locks or Down duration paragraph", m.File)
			}
			continue
		}
		if m.DownLocks == "" || m.DownDuration == "" {
			t.Errorf("%s: the header needs a -- Down locks: and a -- Down duration: paragraph (down locks %q, down duration %q)", m.File, m.DownLocks, m.DownDuration)
			continue
		}
		for _, miss := range locksParagraphMisses("Down locks", m.DownLocks, sectionLocks(m.Down, indexTable)) {
			t.Errorf("%s: its Down: %s", m.File, miss)
		}
	}
}

// The check above fails on a Down locks paragraph that misses a lock its
// Down takes, or claims none where it takes one: planted on a file whose
// Down drops an index and one whose Down drops triggers and a table.
func TestADownLocksParagraphThatMissesALockFails(t *testing.T) {
	pack := migrations.MustPack()
	indexTable := indexTables(pack)
	checked := 0
	for _, m := range pack {
		locks := sectionLocks(m.Down, indexTable)
		if len(locks) == 0 || m.DownLocks == "" {
			continue
		}
		checked++
		require.Empty(t, locksParagraphMisses("Down locks", m.DownLocks, locks), "%s as written", m.File)
		for table, mode := range locks {
			planted := strings.ReplaceAll(m.DownLocks, mode+" on "+table, "a lock on "+table)
			require.NotEmpty(t, locksParagraphMisses("Down locks", planted, locks), "%s: %s on %s left out", m.File, mode, table)
		}
		require.NotEmpty(t, locksParagraphMisses("Down locks", "no table lock: it only replaces functions", locks), "%s: a Down said to lock nothing", m.File)
	}
	require.GreaterOrEqual(t, checked, 5, "Downs that lock tables: 0001, 0003, 0022, 0027, 0032 at least")
	heads, ok := migrations.ByVersion(27)
	require.True(t, ok)
	require.Equal(t, "ACCESS EXCLUSIVE", sectionLocks(heads.Down, indexTable)["orchestrator_queue"], "0027's Down drops the queue's triggers")
	require.Equal(t, "ACCESS EXCLUSIVE", sectionLocks(heads.Down, indexTable)["orchestrator_queue_heads"], "0027's Down drops the heads, which its Up made")
	renewal, ok := migrations.ByVersion(32)
	require.True(t, ok)
	require.Equal(t, map[string]string{"instance_locks": "ACCESS EXCLUSIVE"}, sectionLocks(renewal.Down, indexTable), "0032's Down drops its index")
}

// The documents count the objects the pack adds to upstream's catalog ("six
// functions, four triggers"); every such count is the one the fixes' Adds
// lines give, so that a fix adding or removing one must correct them.
func TestDocumentsCountTheObjectsThePackAdds(t *testing.T) {
	added := map[string]int{}
	for _, m := range migrations.Fixes() {
		for _, a := range m.Adds {
			kind, _, _ := strings.Cut(a, " ")
			added[kind]++
		}
	}
	words := map[string]int{"a": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
		"eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}
	kinds := map[string]string{"tables": "table", "table": "table", "indexes": "index", "index": "index",
		"functions": "function", "function": "function", "triggers": "trigger", "trigger": "trigger"}
	countRE := regexp.MustCompile(`(?i)\b(a|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|\d+) (tables?|indexes|index|functions?|triggers?)[;,)]`)
	docs, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	counted := 0
	for _, file := range append(docs, "README.md", "sql/README.md") {
		text, err := os.ReadFile(file)
		require.NoError(t, err)
		// Only a list of the pack's additions counts them: the objects named
		// in one parenthesis or sentence with the heads or 0027.
		for _, sentence := range regexp.MustCompile(`[^.(]*\([^)]*\)|[^.]+\.`).FindAllString(string(text), -1) {
			if !strings.Contains(sentence, "0027") && !strings.Contains(sentence, "heads") && !strings.Contains(sentence, "catalog") {
				continue
			}
			for _, c := range countRE.FindAllStringSubmatch(sentence, -1) {
				n, ok := words[strings.ToLower(c[1])]
				if !ok {
					n, _ = strconv.Atoi(c[1])
				}
				kind := kinds[strings.ToLower(c[2])]
				counted++
				if n != added[kind] {
					t.Errorf("%s: %q counts %d %s(s); the fixes' Adds lines add %d", file, strings.TrimSpace(c[0]), n, kind, added[kind])
				}
			}
		}
	}
	require.NotZero(t, counted, "no document counts the pack's additions: is the pattern still right?")

	// A fix's own header counts what that fix adds (0027: "one table, two
	// indexes and six functions ... plus four triggers"), in any sentence
	// that speaks of upstream's catalog.
	headerRE := regexp.MustCompile(`(?i)\b(a|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|\d+) (tables?|indexes|index|functions?|triggers?)\b`)
	for _, m := range migrations.Fixes() {
		own := map[string]int{}
		for _, a := range m.Adds {
			kind, _, _ := strings.Cut(a, " ")
			own[kind]++
		}
		raw, err := os.ReadFile(filepath.Join("sql", m.File))
		require.NoError(t, err)
		header, _, _ := strings.Cut(string(raw), "-- +goose Up")
		text := strings.Join(strings.Fields(strings.ReplaceAll(header, "\n--", " ")), " ")
		for _, sentence := range regexp.MustCompile(`[^.]+\.`).FindAllString(text, -1) {
			if !strings.Contains(sentence, "catalog") {
				continue
			}
			for _, c := range headerRE.FindAllStringSubmatch(sentence, -1) {
				n, ok := words[strings.ToLower(c[1])]
				if !ok {
					n, _ = strconv.Atoi(c[1])
				}
				kind := kinds[strings.ToLower(c[2])]
				if n != own[kind] {
					t.Errorf("%s: its header's %q counts %d %s(s); its Adds line adds %d", m.File, strings.TrimSpace(c[0]), n, kind, own[kind])
				}
			}
		}
	}
}

// A file that builds or drops an index concurrently runs outside a
// transaction (PostgreSQL refuses it inside one), and says so in its
// header, where Migration.NoTransaction (and `harness sql`) read it; no
// other file does.
func TestConcurrentIndexWorkRunsOutsideATransaction(t *testing.T) {
	concurrently := regexp.MustCompile(`(?m)^\s*(CREATE|DROP) INDEX CONCURRENTLY`)
	annotated := 0
	for _, m := range migrations.MustPack() {
		raw, err := fs.ReadFile(migrations.FS, m.File)
		require.NoError(t, err)
		concurrent := concurrently.MatchString(m.Up) || concurrently.MatchString(m.Down)
		require.Equal(t, concurrent, m.NoTransaction, "%s: builds or drops an index concurrently: %v; NO TRANSACTION in its header: %v", m.File, concurrent, m.NoTransaction)
		require.Equal(t, strings.Count(string(raw), "-- +goose NO TRANSACTION"), map[bool]int{true: 1}[m.NoTransaction],
			"%s: the annotation appears once, in the header, or not at all", m.File)
		if m.NoTransaction {
			annotated++
		}
	}
	require.Positive(t, annotated, "0027 builds its index concurrently")
}

func TestOutsideTransactionReadsTheHeaderOnly(t *testing.T) {
	require.True(t, migrations.OutsideTransaction("-- 0027_x.sql\n-- +goose NO TRANSACTION\n\n-- +goose Up\nSELECT 1;\n"))
	require.False(t, migrations.OutsideTransaction("-- 0020_x.sql\n\n-- +goose Up\nSELECT 1;\n"))
	// The words in the Up (a comment quoting them) do not count.
	require.False(t, migrations.OutsideTransaction("-- 0020_x.sql\n-- +goose Up\n-- not\n-- +goose NO TRANSACTION\nSELECT 1;\n"))
}

// TestTheRootPackageExportsWhatProgramsCall: every exported name of the
// root package is called by a program of the module (a non-test file
// outside the root), so that `go doc .` lists what another program would
// embed, not the tests' helpers (those live in internal/packfacts and the
// tests).
func TestTheRootPackageExportsWhatProgramsCall(t *testing.T) {
	fset := token.NewFileSet()
	var exported []string
	reached := map[string]bool{}
	roots, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range roots {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for name, obj := range f.Scope.Objects {
			if ast.IsExported(name) && obj.Kind != ast.Con {
				exported = append(exported, name)
			}
		}
		// A type an exported struct's exported field has (Migration's
		// Definitions are []Definition) is reached through that struct.
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || !ast.IsExported(ts.Name.Name) {
				return true
			}
			if st, ok := ts.Type.(*ast.StructType); ok {
				for _, field := range st.Fields.List {
					if len(field.Names) > 0 && ast.IsExported(field.Names[0].Name) {
						ast.Inspect(field.Type, func(n ast.Node) bool {
							if id, ok := n.(*ast.Ident); ok {
								reached[id.Name] = true
							}
							return true
						})
					}
				}
			}
			return true
		})
	}
	if len(exported) < 5 {
		t.Fatalf("read %d exported names from the root package: %v", len(exported), exported)
	}
	var programs strings.Builder
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || filepath.Dir(path) == "." || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		programs.Write(raw)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range exported {
		if !reached[name] && !regexp.MustCompile(`\bmigrations\.`+name+`\b`).MatchString(programs.String()) {
			t.Errorf("the root package exports %s, which no program of the module calls: move it to the tests (or internal/packfacts)", name)
		}
	}
}
