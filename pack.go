package migrations

import (
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Migration is what one file of the pack is, read from the file itself:
// its goose version, and either the upstream duroxide-pg version it ports
// (the row its Up records in _duroxide_migrations) or the functions it
// fixes (its "-- Fixes:" header line). Nothing else in the project says
// which version is what.
type Migration struct {
	// Version is goose's version, the file's NNNN.
	Version int64
	// File is the file name, NNNN_name.sql.
	File string
	// Upstream is the upstream version the file ports (0 for a fix).
	Upstream int64
	// UpstreamName is upstream's file name recorded with Upstream.
	UpstreamName string
	// Fixes lists the functions a fix migration redefines (nil for a port).
	Fixes []string
	// Adds lists the objects a fix migration adds to upstream's catalog
	// (its "-- Adds:" header line: "table name", "index name", "function
	// name", "trigger name"), nil when it adds none.
	Adds []string
	// Leaves lists, by function, the upstream behaviours (Known.BehavesAs)
	// whose definitions a fix migration knows and leaves as they are (its
	// "-- Leaves: function as upstream B, B" header lines): installing its
	// fix over them would undo a change of upstream's that a later fix of
	// the pack keeps. Nil when it leaves none.
	Leaves map[string][]int64
	// LeaseBoundMs is the header's "-- Lease bound: N ms" line: the most,
	// in milliseconds, that the database clock may move the start of a
	// lease the fix's bodies write past the caller's clock carried forward
	// (lease start = now + least(greatest(db - now, 0), bound)). Every body
	// of its Up declares it as the constant c_lease_bound_ms, with this
	// value (Pack refuses a file where they differ). 0 when the file has no
	// such line.
	LeaseBoundMs int64
	// Costs lists the functions a fix migration makes slower on purpose,
	// though it does not redefine them (its "-- Costs:" header line; the
	// header says what they pay for), nil when there are none. The
	// benchmarks report these functions' uncontended cost against
	// upstream's as intended rather than as missed targets.
	Costs []string
	// Locks is the header's "-- Locks:" paragraph: the locks the Up takes
	// on existing tables, each as "MODE on table", and who waits for them
	// ("" when the file has none).
	Locks string
	// Duration is the header's "-- Duration:" paragraph: how long the Up
	// takes and what that grows with ("" when the file has none).
	Duration string
	// DownLocks is the header's "-- Down locks:" paragraph: the locks the
	// Down takes on the tables that exist before it runs (those the Up
	// created included), each as "MODE on table", and who waits for them
	// ("" when the file has none).
	DownLocks string
	// DownDuration is the header's "-- Down duration:" paragraph: how long
	// the Down takes and what that grows with ("" when the file has none).
	DownDuration string
	// Up and Down are the file's two sections, as goose runs them.
	Up, Down string
	// UpLocks are the LOCK TABLE statements of the Up at its top level, in
	// order: what a restore of one of its fixes takes again.
	UpLocks []string
	// NoTransaction is true when the file runs outside a transaction
	// (goose's "-- +goose NO TRANSACTION"): each statement commits on its
	// own, on one connection.
	NoTransaction bool
	// Definitions are the function bodies the file can install, in file
	// order (a fix may hold one per upstream behaviour it knows).
	Definitions []Definition
	// Known is the file's table of the function definitions it recognises
	// before it replaces them (its guard), empty when it has none.
	Known []Known
}

// Definition is one function body in a migration file.
type Definition struct {
	// Function is the function's name.
	Function string
	// Down is true for a body of the Down section.
	Down bool
	// Source is the body exactly as PostgreSQL stores it in pg_proc.prosrc:
	// the text between AS $fn$ and $fn$.
	Source string
	// Statement is the whole CREATE FUNCTION statement, as the file has
	// it, with its closing semicolon.
	Statement string
	// Behaviours are the upstream behaviours (Known.BehavesAs) the body is
	// the fix of, from a "-- Behaviour: upstream B, B" line right above
	// its CREATE: a fix with several bodies of one function names each
	// one's. Nil for a fix's only body of a function: it serves every
	// behaviour its guard knows for that function, but those it Leaves.
	Behaviours []int64
}

// Fingerprint is the md5 of the body, as the guards and
// harness/ops/fingerprint compute it for the pack's own texts (which never
// name their schema).
func (d Definition) Fingerprint() string {
	sum := md5.Sum([]byte(d.Source))
	return hex.EncodeToString(sum[:])
}

// OutsideTransaction reports whether the migration file text runs outside
// a transaction: goose's "-- +goose NO TRANSACTION" annotation, on a line
// of its own before the Up section.
func OutsideTransaction(text string) bool {
	header, _, _ := strings.Cut(text, "-- +goose Up")
	return strings.Contains(header, "\n-- +goose NO TRANSACTION\n")
}

// Known is one row of a guard's table of recognised definitions: a
// function's fingerprint, what that definition is, the upstream version
// whose behaviour it has, and whether it carries the pack's fix.
type Known struct {
	Function    string
	Fingerprint string
	Definition  string
	BehavesAs   int64
	Fixed       bool
	// Down is true for a row of the Down section's guard.
	Down bool
}

// IsPort reports whether m ports an upstream version.
func (m Migration) IsPort() bool { return m.Upstream > 0 }

var (
	fileNameRE = regexp.MustCompile(`^(\d{4})_[a-z0-9_]+\.sql$`)
	// The bookkeeping row a port's Up records for duroxide-pg's runner.
	upstreamRowRE = regexp.MustCompile(`INSERT INTO _duroxide_migrations \(version, name\)\s+VALUES \((\d+), '([^']+)'\)`)
	fixesRE       = regexp.MustCompile(`(?m)^-- Fixes: ([a-z_]+(?:, [a-z_]+)*)\s*$`)
	// The label of a header paragraph: "Locks: ", "Down locks: ".
	headerLabelRE = regexp.MustCompile(`^(?:[A-Z][a-z]+|Down [a-z]+): `)
	costsRE       = regexp.MustCompile(`(?m)^-- Costs: ([a-z_]+(?:, [a-z_]+)*)\s*$`)
	addsRE        = regexp.MustCompile(`(?m)^-- Adds: ((?:table|index|function|trigger) [a-z_]+(?:, (?:table|index|function|trigger) [a-z_]+)*)\s*$`)
	leavesRE      = regexp.MustCompile(`(?m)^-- Leaves: ([a-z_]+) as upstream (\d+(?:, \d+)*)\s*$`)
	leaseBoundRE  = regexp.MustCompile(`(?m)^-- Lease bound: (\d+) ms\s*$`)
	// The constant a body declares the lease bound with.
	leaseBoundConstRE = regexp.MustCompile(`\bc_lease_bound_ms CONSTANT bigint := (\d+);`)
	// A function body: CREATE [OR REPLACE] FUNCTION name(...) ... AS $fn$
	// body $fn$, and the "-- Behaviour:" line right above it, if any.
	definitionRE = regexp.MustCompile(`(?s)(?:-- Behaviour: upstream (\d+(?:, \d+)*)\n)?(CREATE (?:OR REPLACE )?FUNCTION ([a-z_]+)\(.*?AS \$fn\$(.*?)\$fn\$)`)
	upLockRE     = regexp.MustCompile(`(?m)^LOCK TABLE [a-z_]+ IN [A-Z ]+ MODE;$`)
	// A row of a guard's VALUES table of known definitions.
	knownRE = regexp.MustCompile(`\('([a-z_]+)', '([0-9a-f]{32})', '([^']+)', (\d+), (true|false)\)`)
)

var (
	packOnce sync.Once
	pack     []Migration
	packErr  error
)

// Pack reads every migration of the embedded pack, in version order. It
// fails when a .sql file is not named NNNN_name.sql, is neither a port nor
// a fix, or is both.
func Pack() ([]Migration, error) {
	packOnce.Do(func() { pack, packErr = read(FS) })
	return pack, packErr
}

// MustPack is Pack for callers that cannot go on without it (the embedded
// files are checked by the tests, so it panics only on a broken build).
func MustPack() []Migration {
	p, err := Pack()
	if err != nil {
		panic(err)
	}
	return p
}

func read(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("read the pack: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		m := fileNameRE.FindStringSubmatch(e.Name())
		if m == nil {
			// goose would run a file such as 28_x.sql or 0028_X.sql; the
			// pack cannot say what it is, so it refuses the whole pack.
			return nil, fmt.Errorf("the pack cannot classify %s: a migration is named NNNN_name.sql (four digits, lower case), and goose would run this file", e.Name())
		}
		raw, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", e.Name(), err)
		}
		mig, err := parse(e.Name(), m[1], string(raw))
		if err != nil {
			return nil, err
		}
		out = append(out, mig)
	}
	slices.SortFunc(out, func(a, b Migration) int { return int(a.Version - b.Version) })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("the pack has two files of version %d: %s and %s", out[i].Version, out[i-1].File, out[i].File)
		}
	}
	return out, nil
}

func parse(file, num, text string) (Migration, error) {
	v, _ := strconv.ParseInt(num, 10, 64)
	m := Migration{Version: v, File: file}
	_, rest, ok := strings.Cut(text, "-- +goose Up")
	if !ok {
		return m, fmt.Errorf("%s: no -- +goose Up section", file)
	}
	m.Up, m.Down, _ = strings.Cut(rest, "-- +goose Down")
	header, _, _ := strings.Cut(text, "-- +goose Up")
	m.NoTransaction = OutsideTransaction(text)
	rows := upstreamRowRE.FindAllStringSubmatch(m.Up, -1)
	if len(rows) > 1 {
		return m, fmt.Errorf("%s: its Up records %d upstream versions; a port records exactly one", file, len(rows))
	}
	if len(rows) == 1 {
		m.Upstream, _ = strconv.ParseInt(rows[0][1], 10, 64)
		m.UpstreamName = rows[0][2]
	}
	for i, section := range []string{m.Up, m.Down} {
		for _, d := range definitionRE.FindAllStringSubmatch(section, -1) {
			m.Definitions = append(m.Definitions, Definition{Function: d[3], Down: i == 1, Source: d[4],
				Statement: d[2] + ";", Behaviours: versionList(d[1])})
		}
		for _, k := range knownRE.FindAllStringSubmatch(section, -1) {
			behaves, _ := strconv.ParseInt(k[4], 10, 64)
			m.Known = append(m.Known, Known{Function: k[1], Fingerprint: k[2], Definition: k[3],
				BehavesAs: behaves, Fixed: k[5] == "true", Down: i == 1})
		}
	}
	if f := fixesRE.FindStringSubmatch(header); f != nil {
		m.Fixes = strings.Split(f[1], ", ")
	}
	if a := addsRE.FindStringSubmatch(header); a != nil {
		m.Adds = strings.Split(a[1], ", ")
	}
	if c := costsRE.FindStringSubmatch(header); c != nil {
		m.Costs = strings.Split(c[1], ", ")
	}
	for _, l := range leavesRE.FindAllStringSubmatch(header, -1) {
		if m.Leaves == nil {
			m.Leaves = map[string][]int64{}
		}
		m.Leaves[l[1]] = append(m.Leaves[l[1]], versionList(l[2])...)
	}
	if err := m.readLeaseBound(header); err != nil {
		return m, err
	}
	m.UpLocks = upLockRE.FindAllString(m.Up, -1)
	m.Locks = headerParagraph(header, "Locks")
	m.Duration = headerParagraph(header, "Duration")
	m.DownLocks = headerParagraph(header, "Down locks")
	m.DownDuration = headerParagraph(header, "Down duration")
	switch {
	case m.IsPort() && m.Costs != nil:
		return m, fmt.Errorf("%s: a port changes no cost of upstream's, yet it has a -- Costs: line", file)
	case m.IsPort() && m.Fixes != nil:
		return m, fmt.Errorf("%s: both ports upstream %d and fixes %v; one concern per migration", file, m.Upstream, m.Fixes)
	case m.IsPort() && m.Adds != nil:
		return m, fmt.Errorf("%s: a port adds nothing to upstream's catalog, yet it has an -- Adds: line", file)
	case m.IsPort() && m.Leaves != nil:
		return m, fmt.Errorf("%s: a port fixes nothing, yet it has a -- Leaves: line", file)
	case m.IsPort() && m.LeaseBoundMs != 0:
		return m, fmt.Errorf("%s: a port writes upstream's leases, yet it has a -- Lease bound: line", file)
	case !m.IsPort() && m.Fixes == nil:
		return m, fmt.Errorf("%s: neither records an upstream version in _duroxide_migrations nor names what it fixes (a '-- Fixes: function' header line)", file)
	}
	return m, nil
}

// readLeaseBound reads the header's "-- Lease bound:" line into
// LeaseBoundMs and holds the bodies of the Up to it: with the line, each
// body the Up installs declares c_lease_bound_ms with its value; without
// it, none declares the constant (a bound only the body says would be a
// second home, which doctor would not read).
func (m *Migration) readLeaseBound(header string) error {
	lines := leaseBoundRE.FindAllStringSubmatch(header, -1)
	if len(lines) > 1 {
		return fmt.Errorf("%s: %d -- Lease bound: lines; a file has at most one", m.File, len(lines))
	}
	if len(lines) == 1 {
		m.LeaseBoundMs, _ = strconv.ParseInt(lines[0][1], 10, 64)
		if m.LeaseBoundMs <= 0 {
			return fmt.Errorf("%s: its -- Lease bound: line says %s ms; a bound is a positive number of milliseconds", m.File, lines[0][1])
		}
	}
	for _, d := range m.Definitions {
		if d.Down {
			continue
		}
		c := leaseBoundConstRE.FindStringSubmatch(d.Source)
		switch {
		case c == nil && m.LeaseBoundMs != 0:
			return fmt.Errorf("%s: its header's lease bound is %d ms, and its body of %s declares no c_lease_bound_ms", m.File, m.LeaseBoundMs, d.Function)
		case c != nil && m.LeaseBoundMs == 0:
			return fmt.Errorf("%s: its body of %s declares c_lease_bound_ms (%s), and its header has no -- Lease bound: line", m.File, d.Function, c[1])
		case c != nil && c[1] != strconv.FormatInt(m.LeaseBoundMs, 10):
			return fmt.Errorf("%s: its body of %s declares c_lease_bound_ms := %s; its header's -- Lease bound: line says %d ms", m.File, d.Function, c[1], m.LeaseBoundMs)
		}
	}
	return nil
}

// LeaseBound is the most the database clock lengthens a lease the pack's
// latest fixes write beyond the caller's clock carried forward: the "--
// Lease bound:" line of the newest fix that has one (0 when none has).
// Its one home is sql/ (the line, and the constant c_lease_bound_ms of
// each body, held to it); harness doctor's critical clock skew is this
// bound.
func LeaseBound() time.Duration {
	fixes := Fixes()
	for i := len(fixes) - 1; i >= 0; i-- {
		if ms := fixes[i].LeaseBoundMs; ms != 0 {
			return time.Duration(ms) * time.Millisecond
		}
	}
	return 0
}

// Latest is the newest goose version of the pack.
func Latest() int64 {
	p := MustPack()
	return p[len(p)-1].Version
}

// PortOf returns the migration that ports upstream version u.
func PortOf(u int64) (Migration, bool) {
	for _, m := range MustPack() {
		if m.Upstream == u {
			return m, true
		}
	}
	return Migration{}, false
}

// ByVersion returns the migration of goose version v.
func ByVersion(v int64) (Migration, bool) {
	for _, m := range MustPack() {
		if m.Version == v {
			return m, true
		}
	}
	return Migration{}, false
}

// Fixes returns the fix migrations, in version order.
func Fixes() []Migration {
	var out []Migration
	for _, m := range MustPack() {
		if !m.IsPort() {
			out = append(out, m)
		}
	}
	return out
}

// FixOf returns the first fix migration of function name: the one that
// fixed its bug (a later fix of the same function builds on it).
func FixOf(name string) (Migration, bool) {
	for _, m := range Fixes() {
		if slices.Contains(m.Fixes, name) {
			return m, true
		}
	}
	return Migration{}, false
}

// IntendedCost returns the fix migration, up to goose version v, whose
// "-- Costs:" line names function name: the function is slower than
// upstream's on purpose, for what that fix's header says.
func IntendedCost(name string, v int64) (Migration, bool) {
	for _, m := range Fixes() {
		if m.Version <= v && slices.Contains(m.Costs, name) {
			return m, true
		}
	}
	return Migration{}, false
}

// UpstreamVersions lists every upstream version the pack ports, ascending.
func UpstreamVersions() []int64 {
	var out []int64
	for _, m := range MustPack() {
		if m.IsPort() {
			out = append(out, m.Upstream)
		}
	}
	slices.Sort(out)
	return out
}

// versionList parses "19, 20" (nil for "").
func versionList(s string) []int64 {
	if s == "" {
		return nil
	}
	var out []int64
	for _, f := range strings.Split(s, ", ") {
		v, _ := strconv.ParseInt(f, 10, 64)
		out = append(out, v)
	}
	return out
}

// KnownDefinitions lists every definition of function name that the Up
// guard of a fix migration recognises, one per fingerprint (the newest
// migration's row where two disagree), in the order first met: what the
// pack knows a database may hold for a function it fixes.
func KnownDefinitions(name string) []Known {
	var out []Known
	at := map[string]int{}
	for _, m := range Fixes() {
		for _, k := range m.Known {
			if k.Function != name || k.Down {
				continue
			}
			if i, ok := at[k.Fingerprint]; ok {
				out[i] = k
				continue
			}
			at[k.Fingerprint] = len(out)
			out = append(out, k)
		}
	}
	return out
}

// FixFor returns the newest fix migration of goose version upTo or below
// that installs a fix of function name for upstream behaviour behavesAs,
// and the definition it installs: a body of name in its Up whose
// Behaviours name behavesAs, or its only body of name when its guard knows
// a definition of that behaviour and it does not leave it. ok is false
// when no fix up to upTo has one (upstream changed the function in a way
// the pack has no fix for yet).
func FixFor(name string, behavesAs, upTo int64) (fix Migration, def Definition, ok bool) {
	fixes := Fixes()
	for i := len(fixes) - 1; i >= 0; i-- {
		m := fixes[i]
		if m.Version > upTo || !slices.Contains(m.Fixes, name) {
			continue
		}
		if d, ok := m.bodyFor(name, behavesAs); ok {
			return m, d, true
		}
	}
	return Migration{}, Definition{}, false
}

// bodyFor is the body of function name that m's Up installs for behaviour
// behavesAs (see FixFor).
func (m Migration) bodyFor(name string, behavesAs int64) (Definition, bool) {
	var bodies []Definition
	for _, d := range m.Definitions {
		if !d.Down && d.Function == name {
			bodies = append(bodies, d)
		}
	}
	for _, d := range bodies {
		if slices.Contains(d.Behaviours, behavesAs) {
			return d, true
		}
	}
	if len(bodies) != 1 || bodies[0].Behaviours != nil || slices.Contains(m.Leaves[name], behavesAs) {
		return Definition{}, false
	}
	for _, k := range m.Known {
		if !k.Down && k.Function == name && k.BehavesAs == behavesAs {
			return bodies[0], true
		}
	}
	return Definition{}, false
}

// headerParagraph is the text of the header's "-- <label>:" paragraph, its
// lines joined by single spaces: the label's line and the comment lines
// after it, up to an empty comment line, another "-- Word:" line or the
// end of the comment block. "" when the header has no such line.
func headerParagraph(header, label string) string {
	var words []string
	in := false
	for _, line := range strings.Split(header, "\n") {
		text, isComment := strings.CutPrefix(line, "-- ")
		switch {
		case !in && isComment && strings.HasPrefix(text, label+": "):
			in = true
			words = append(words, strings.Fields(strings.TrimPrefix(text, label+": "))...)
		case in && isComment && strings.TrimSpace(text) != "" && !headerLabelRE.MatchString(text):
			words = append(words, strings.Fields(text)...)
		case in:
			return strings.Join(words, " ")
		}
	}
	return strings.Join(words, " ")
}
