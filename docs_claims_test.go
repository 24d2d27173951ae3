package migrations_test

// The documents' claims about the pack, held to the pack: each kind of
// claim a reader found contradicted by the code (transactions, the
// additions, dynamic SQL, ranges of fixes, rollback targets, the role a
// script takes, which release leaves which upstream state) has a check
// that reads the fact from sql/ or the code, and a test that plants the
// contradiction and sees the check fail.

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/sqlscript"
)

// docFile is a document's path and text.
type docFile struct{ path, text string }

// documents are README.md, sql/README.md and docs/*.md (not the
// CHANGELOG, which tells history).
func documents(t *testing.T) []docFile {
	t.Helper()
	paths, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	var out []docFile
	for _, p := range append([]string{"README.md", "sql/README.md"}, paths...) {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		out = append(out, docFile{p, string(b)})
	}
	return out
}

// sentences splits text into sentences (a dot, ! or ? followed by a space
// ends one; "0.1.28" does not), line breaks folded into spaces; each row
// of a table is one.
func sentences(text string) []string {
	var out, prose []string
	flush := func() {
		flat := strings.Join(strings.Fields(strings.Join(prose, "\n")), " ")
		out = append(out, regexp.MustCompile(`.+?(?:[.!?](?:\s|$)|$)`).FindAllString(flat, -1)...)
		prose = nil
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "|") {
			flush()
			out = append(out, line)
			continue
		}
		prose = append(prose, line)
	}
	flush()
	return out
}

// claimCheck is one kind of claim: it returns a line for each claim of
// doc that the pack contradicts.
type claimCheck struct {
	name  string
	check func(doc docFile) []string
	// planted is a text that makes check report (to prove it can).
	planted string
}

func claimChecks(t *testing.T) []claimCheck {
	pack := migrations.MustPack()
	var outside []string // files that run outside a transaction
	var adds []string    // files with an Adds line
	for _, m := range pack {
		if m.NoTransaction {
			outside = append(outside, m.File[:4])
		}
		if m.Adds != nil {
			adds = append(adds, m.File[:4])
		}
	}
	latestFix := migrations.Fixes()[len(migrations.Fixes())-1].File[:4]
	role := scriptRole(t)
	return []claimCheck{
		{name: "every migration in one transaction", planted: "5. **One transaction per file** (goose's default). Nothing non-transactional.",
			check: func(d docFile) []string {
				var out []string
				for _, s := range sentences(d.text) {
					if regexp.MustCompile(`(?i)nothing (is )?non-transactional|every migration runs in (one|a single) transaction`).MatchString(s) && len(outside) > 0 {
						out = append(out, fmt.Sprintf("%q: %v run outside a transaction", s, outside))
					}
				}
				return out
			}},
		{name: "the files with an Adds line", planted: "A fix that adds objects names each on a line `-- Adds: table t` (0027 is the only one): the catalog tests require them.",
			check: func(d docFile) []string {
				var out []string
				for _, s := range sentences(d.text) {
					if !strings.Contains(s, "-- Adds:") || !strings.Contains(s, "(") {
						continue
					}
					named := regexp.MustCompile(`\b00\d\d\b`).FindAllString(s, -1)
					slices.Sort(named)
					if !slices.Equal(slices.Compact(named), adds) {
						out = append(out, fmt.Sprintf("%q names %v; the files with an Adds line are %v", s, named, adds))
					}
				}
				return out
			}},
		{name: "no dynamic SQL", planted: "Every function is declared with SET search_path FROM CURRENT. No `format()`/dynamic SQL, no `SECURITY DEFINER`.",
			check: func(d docFile) []string {
				var out []string
				dynamic := false // anywhere in a file: EXECUTE of a statement
				inBody := false  // in a function body
				for _, m := range pack {
					if regexp.MustCompile(`(?m)^\s*EXECUTE\s+(\$|'|format)`).MatchString(m.Up + m.Down) {
						dynamic = true
					}
					for _, def := range m.Definitions {
						inBody = inBody || regexp.MustCompile(`\bEXECUTE\s+(\$|'|format)`).MatchString(def.Source)
					}
				}
				for _, s := range sentences(d.text) {
					if !regexp.MustCompile("(?i)no `?format\\(\\)`?/dynamic SQL").MatchString(s) {
						continue
					}
					qualified := strings.Contains(s, "in a function body")
					if (qualified && inBody) || (!qualified && dynamic) {
						out = append(out, fmt.Sprintf("%q: the pack's migrations run dynamic SQL (EXECUTE)", s))
					}
				}
				return out
			}},
		{name: "a range of the pack's fixes", planted: "In every row `migrate up` then applies 0025 to 0028, the fixes that need no upstream version after 19.",
			check: func(d docFile) []string {
				var out []string
				for _, s := range sentences(d.text) {
					if !regexp.MustCompile(`(?i)\bfix(es)?\b|applies`).MatchString(s) {
						continue
					}
					for _, r := range regexp.MustCompile(`\b(00\d\d) (?:to|–|-) (00\d\d)\b`).FindAllStringSubmatch(s, -1) {
						if r[2] > "0024" && r[2] != latestFix {
							out = append(out, fmt.Sprintf("%q: the fixes run to %s", s, latestFix))
						}
					}
				}
				return out
			}},
		{name: "a rollback to goose 21 for every release", planted: "```sh\nbin/harness migrate down --dsn \"$DSN\" --schema duroxide --to 21   # back to upstream 19's schema, fixes kept\n```",
			check: func(d docFile) []string {
				if d.path == "docs/RUNBOOKS.md" {
					return nil // its 1..19 runbook is that release's own
				}
				var out []string
				for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(d.text, -1) {
					for _, line := range strings.Split(block[1], "\n") {
						if strings.Contains(line, "--to 21") && !strings.Contains(line, "0.1.26") {
							out = append(out, fmt.Sprintf("%q: --to 21 drops kv_delta, which releases from 0.1.27 use; say which release it is for", strings.TrimSpace(line)))
						}
					}
				}
				return out
			}},
		{name: "the role the script takes", planted: "bin/harness sql up --role duroxide_app -o up.sql   # starts with SET LOCAL ROLE",
			check: func(d docFile) []string {
				var out []string
				for _, m := range regexp.MustCompile(`starts with (SET (?:LOCAL )?ROLE)`).FindAllStringSubmatch(d.text, -1) {
					if m[1] != role {
						out = append(out, fmt.Sprintf("%q: the script of `harness sql --role` has %q", m[0], role))
					}
				}
				return out
			}},
		{name: "the locks a runbook names", planted: "## Rollback\n\nRollback target: goose 24. Down path: 0032, SHARE on `instance_locks`, milliseconds.\n",
			check: runbookLocks},
		{name: "the lease bound", planted: "The database clock lengthens a lease by at most the lease bound (45 s).",
			check: func(d docFile) []string {
				var out []string
				for _, s := range sentences(d.text) {
					for _, m := range leaseBoundClaimRE.FindAllStringSubmatch(s, -1) {
						n, _ := strconv.ParseInt(strings.ReplaceAll(m[1], ",", ""), 10, 64)
						said := time.Duration(n) * time.Millisecond
						if m[2] == "s" {
							said = time.Duration(n) * time.Second
						}
						if said != migrations.LeaseBound() {
							out = append(out, fmt.Sprintf("%q says the lease bound is %s; sql/ says %s", s, said, migrations.LeaseBound()))
						}
					}
				}
				return out
			}},
		{name: "which release leaves which upstream state, in a table", planted: "| duroxide-pg release | `_duroxide_migrations` |\n|---|---|\n| 0.1.28 and later | 1..21 |",
			check: releaseClaims(t)},
		{name: "which release leaves which upstream state, in a sentence", planted: "Read and tried on duroxide-pg 0.1.33 (upstream 1..21 and 23).",
			check: releaseClaims(t)},
		{name: "which release leaves which upstream state, a span across rows", planted: "duroxide-pg 0.1.28 and later records upstream 1..21.",
			check: releaseClaims(t)},
	}
}

// leaseBoundClaimRE is a document's statement of the lease bound: "lease
// bound" and the first duration after it, within the same clause ("the
// lease bound (30 s)", "`-- Lease bound: 30000 ms`", "the lease bound,
// 30 s").
var leaseBoundClaimRE = regexp.MustCompile(`(?i)lease bound[^.;)\d]{0,40}?(\d[\d,]*) ?(ms|s)\b`)

// runbookLocks checks each lock docs/RUNBOOKS.md names for a migration
// ("0032: ACCESS EXCLUSIVE on `instance_locks`") against that migration's
// header: its Down locks in a rollback (from "Rollback target" to the next
// heading), its Up's elsewhere.
func runbookLocks(d docFile) []string {
	if d.path != "docs/RUNBOOKS.md" && d.path != "docs/PLANTED.md" {
		return nil
	}
	// A runbook names a table in backticks; a header names it bare. The
	// alternation lists each longer mode first, so "SHARE UPDATE EXCLUSIVE
	// on t" never also reads as "EXCLUSIVE on t".
	const modes = `(ACCESS EXCLUSIVE|SHARE UPDATE EXCLUSIVE|SHARE ROW EXCLUSIVE|ROW EXCLUSIVE|ROW SHARE|EXCLUSIVE|SHARE)`
	docRE := regexp.MustCompile(`\b` + modes + " on `([a-z_]+)`")
	headerRE := regexp.MustCompile(`\b` + modes + ` on ([a-z_]+)\b`)
	says := func(header, want string) bool {
		for _, m := range headerRE.FindAllStringSubmatch(strings.Join(strings.Fields(header), " "), -1) {
			if m[1]+" on "+m[2] == want {
				return true
			}
		}
		return false
	}
	var out []string
	rollback := false
	var para []string
	judge := func() {
		text := strings.Join(strings.Fields(strings.Join(para, " ")), " ")
		para = nil
		for _, clause := range regexp.MustCompile(`; |\. `).Split(text, -1) {
			var named []migrations.Migration
			for _, n := range regexp.MustCompile(`\b00(\d\d)\b`).FindAllStringSubmatch(clause, -1) {
				v, _ := strconv.ParseInt(n[1], 10, 64)
				if m, ok := migrations.ByVersion(v); ok {
					named = append(named, m)
				}
			}
			if len(named) == 0 {
				continue
			}
			for _, lock := range docRE.FindAllStringSubmatch(clause, -1) {
				want := lock[1] + " on " + lock[2]
				found := slices.ContainsFunc(named, func(m migrations.Migration) bool {
					header := m.Locks
					if rollback {
						header = m.DownLocks
					}
					return says(header, want)
				})
				if !found {
					what := "Locks"
					if rollback {
						what = "Down locks"
					}
					out = append(out, fmt.Sprintf("%q: no %s paragraph of %v says %q", clause, what, fileNames(named), want))
				}
			}
		}
	}
	for _, line := range strings.Split(d.text, "\n") {
		switch {
		case strings.HasPrefix(line, "#"):
			judge()
			rollback = false
		case strings.HasPrefix(line, "Rollback target"):
			judge()
			rollback = true
		case strings.TrimSpace(line) == "" || strings.HasPrefix(line, "- "):
			judge()
		}
		para = append(para, line)
	}
	judge()
	return out
}

func fileNames(ms []migrations.Migration) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.File)
	}
	return out
}

// scriptRole is the statement the script of `harness sql --role` takes
// its role with.
func scriptRole(t *testing.T) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, sqlscript.Write(&b, sqlscript.Plan{Schema: "duroxide", VersionTable: "goose_db_version", To: 1, Role: "app",
		Migrations: migrations.MustPack()[:1]}))
	m := regexp.MustCompile(`(?m)^(SET (?:LOCAL )?ROLE) `).FindStringSubmatch(b.String())
	require.NotNil(t, m, "the script takes its role")
	return m[1]
}

// releaseSpan is the releases a mention covers, by their patch number
// (0.1.N): "0.1.27" [27, 27], "0.1.26 and earlier" [0, 26], "0.1.28 to
// 0.1.33" [28, 33], "0.1.35 and later" [35, max].
type releaseSpan struct{ lo, hi int }

var releaseRE = regexp.MustCompile(`\b0\.1\.(\d+)(\+| (?:and|or) (?:earlier|later)| to 0\.1\.(\d+))?`)

// spanOf reads a mention matched by releaseRE.
func spanOf(m []string) releaseSpan {
	n, _ := strconv.Atoi(m[1])
	switch {
	case strings.HasSuffix(m[2], "earlier"):
		return releaseSpan{0, n}
	case m[2] == "+" || strings.HasSuffix(m[2], "later"):
		return releaseSpan{n, math.MaxInt}
	case m[3] != "":
		hi, _ := strconv.Atoi(m[3])
		return releaseSpan{n, hi}
	}
	return releaseSpan{n, n}
}

// releaseClaims checks that docs/RELEASES.md is the one table of releases
// and upstream states, and that every other mention of a duroxide-pg
// release (or a span of them) with one upstream state agrees with it: the
// span lies in one row of the table, whose state it names.
func releaseClaims(t *testing.T) func(docFile) []string {
	raw, err := os.ReadFile("docs/RELEASES.md")
	require.NoError(t, err)
	stateRE := regexp.MustCompile(`\b1\.\.(19|20|21)(?: and 23|, 23)?\b`)
	type row struct {
		span  releaseSpan
		state string
	}
	var rows []row
	for _, line := range strings.Split(string(raw), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		rel := releaseRE.FindStringSubmatch(cells[1])
		st := stateRE.FindString(cells[2])
		if rel != nil && st != "" {
			rows = append(rows, row{spanOf(rel), normState(st)})
		}
	}
	require.GreaterOrEqual(t, len(rows), 4, "docs/RELEASES.md's table: %v", rows)
	return func(d docFile) []string {
		if d.path == "docs/RELEASES.md" {
			return nil
		}
		var out []string
		if strings.Contains(d.text, "| duroxide-pg release |") {
			out = append(out, "a table of releases: docs/RELEASES.md is the one, link to it")
		}
		var clauses []string
		for _, s := range sentences(d.text) {
			clauses = append(clauses, strings.Split(s, "; ")...)
		}
		for _, s := range clauses {
			if !strings.Contains(s, "duroxide-pg") && !strings.Contains(s, "release") {
				continue
			}
			rels := releaseRE.FindAllStringSubmatch(s, -1)
			sts := stateRE.FindAllString(s, -1)
			if len(rels) != 1 || len(sts) != 1 || strings.Contains(s, "duroxide-linux-x64-gnu@0.1.") || rels[0][2] == "+" {
				continue // not one release paired with one state ("0.1.27+": a threshold, not a state)
			}
			span := spanOf(rels[0])
			i := slices.IndexFunc(rows, func(r row) bool { return r.span.lo <= span.lo && span.hi <= r.span.hi })
			switch {
			case i < 0:
				out = append(out, fmt.Sprintf("%q: %q is not within one row of docs/RELEASES.md", s, rels[0][0]))
			case rows[i].state != normState(sts[0]):
				out = append(out, fmt.Sprintf("%q: docs/RELEASES.md says %s leaves %s", s, rels[0][0], rows[i].state))
			}
		}
		return out
	}
}

// normState folds "1..21, 23" into "1..21 and 23".
func normState(s string) string { return strings.Replace(s, ", 23", " and 23", 1) }

func TestTheDocumentsClaimsAreThePacks(t *testing.T) {
	for _, c := range claimChecks(t) {
		t.Run(c.name, func(t *testing.T) {
			for _, d := range documents(t) {
				for _, bad := range c.check(d) {
					t.Errorf("%s: %s", d.path, bad)
				}
			}
		})
	}
}

func TestEachClaimCheckFailsOnItsContradiction(t *testing.T) {
	for _, c := range claimChecks(t) {
		t.Run(c.name, func(t *testing.T) {
			require.NotEmpty(t, c.check(docFile{path: "docs/PLANTED.md", text: c.planted}), "the planted contradiction: %q", c.planted)
		})
	}
	require.Equal(t, "1..21 and 23", normState("1..21, 23"))
	check := releaseClaims(t)
	require.Empty(t, check(docFile{path: "docs/X.md", text: "Tried on duroxide-pg 0.1.33 (upstream 1..21)."}), "a release inside a row's span")
	require.Empty(t, check(docFile{path: "docs/X.md", text: "A database of duroxide-pg 0.1.26 or earlier records 1..19."}))
}
