// Package baseline adopts a database that duroxide-pg's own runner created
// (its bookkeeping table _duroxide_migrations, no goose version table) into
// the pack. It reads which upstream versions the runner applied (1..21 and
// 23 for current releases: upstream keeps 22 for later), checks that the
// schema's catalog is upstream's at that state and that every function body
// is a definition it knows (upstream's own text at that version, the pack's
// equivalent, or a pack fix), then records in goose's version table the
// pack's versions that the database already has: the leading run of ports
// of upstream 1..19, or fewer. `migrate up` then applies the pack's fixes,
// and re-applies its ports of upstream's later versions over the objects the
// runner made (they are written to do so cleanly).
package baseline

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3/database"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/catalog"
	"github.com/duroxide-pg/migrations/harness/ops/fingerprint"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
)

// Expected holds upstream's catalog at each upstream version the pack
// ports, expected/vNNNN.json (NNNN = the upstream version): copies of
// migrations_test/testdata/catalog (a test fails when they drift apart).
//
//go:embed expected/*.json
var Expected embed.FS

// expectedCatalog is upstream's catalog at upstream version v.
func expectedCatalog(v int64) (catalog.Snapshot, error) {
	raw, err := Expected.ReadFile(fmt.Sprintf("expected/v%04d.json", v))
	if err != nil {
		return nil, fmt.Errorf("no expected catalog for upstream version %d: %w", v, err)
	}
	return catalog.Canonical(raw)
}

// Options say where and how to baseline.
type Options struct {
	// Schema holds the duroxide objects (migrate.DefaultSchema when empty).
	Schema string
	// VersionTable is goose's table inside Schema (migrate.VersionTable
	// when empty).
	VersionTable string
	// DryRun checks everything and changes nothing.
	DryRun bool
	// Force proceeds where Run cannot vouch for the database (a catalog or
	// a function body it does not know, upstream versions newer than the
	// pack, an existing goose table that disagrees), and says what it
	// could not vouch for.
	Force bool
}

// Result says what Run found and did (or, with DryRun, would do).
type Result struct {
	Schema       string
	VersionTable string // schema-qualified, quoted
	// Upstream is the newest version in _duroxide_migrations.
	Upstream int64
	// Recorded lists every version in _duroxide_migrations.
	Recorded []int64
	// State is the upstream version whose catalog and bodies were checked:
	// the newest recorded version the pack ports.
	State int64
	// Unreleased lists the recorded upstream versions that no release
	// carries but the pack knows (upstream's candidate fix, and it with the
	// amendment this project offers): each changes one function, whose
	// text the body check then also accepts.
	Unreleased []int64
	// Baseline is the goose version recorded: every pack migration up to it
	// is a port the database already has.
	Baseline int64
	// Goose is goose's newest applied version before the run (-1: no table).
	Goose int64
	// Changed is false when nothing was (or, dry run, would be) written.
	Changed bool
	DryRun  bool
	// Unvouched lists what --force let through.
	Unvouched []string
	// Plan says what `migrate up` then does, one line per pack migration.
	Plan []string
	// Lines describe the checks and actions, for people.
	Lines []string
}

// Refusal is a database Run will not baseline; Error says why and what to
// do, Diff lists the differences (catalog, function bodies).
type Refusal struct {
	Reason string
	Diff   string
}

func (r *Refusal) Error() string {
	if r.Diff == "" {
		return r.Reason
	}
	return r.Reason + "\n" + strings.TrimRight(r.Diff, "\n")
}

func refuse(format string, args ...any) error { return &Refusal{Reason: fmt.Sprintf(format, args...)} }

// Run baselines schema of db. It takes the pack's per-schema migration lock
// (the one `harness migrate` takes) so it never races a runner, and does all
// its work in one transaction, in named steps: readHistory (what
// duroxide-pg's runner recorded), readGoose and its decide (goose's table,
// if any), checkCatalog, checkBodies, then record. A step that finds what
// baseline cannot vouch for returns a doubt: a refusal, or with Force a
// line of Result.Unvouched.
func Run(ctx context.Context, db *sql.DB, opts Options) (*Result, error) {
	opts.Schema, opts.VersionTable = migrate.Names(opts.Schema, opts.VersionTable)
	qtable := pgx.Identifier{opts.Schema, opts.VersionTable}.Sanitize()

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", migrate.LockID(opts.Schema)); err != nil {
		return nil, fmt.Errorf("take the migration lock of schema %s: %w", opts.Schema, err)
	}

	var j journal
	hist, err := readHistory(ctx, tx, opts.Schema)
	if err != nil {
		return nil, err
	}
	j.say(hist.lines()...)
	if err := j.vouch(hist.doubt(), opts.Force); err != nil {
		return nil, err
	}
	base := baselineFor(hist.state)
	done := func(g gooseTable, plan []string, changed bool) *Result {
		return &Result{
			Schema: opts.Schema, VersionTable: qtable, DryRun: opts.DryRun,
			Upstream: hist.recorded[len(hist.recorded)-1], Recorded: hist.recorded,
			State: hist.state, Unreleased: hist.unreleasedVersions(), Baseline: base,
			Goose: g.newest(), Changed: changed, Unvouched: j.unvouched, Plan: plan, Lines: j.lines,
		}
	}

	goose, err := readGoose(ctx, tx, opts.Schema, opts.VersionTable)
	if err != nil {
		return nil, err
	}
	next := goose.decide(base, qtable)
	if err := j.vouch(next.doubt, opts.Force); err != nil {
		return nil, err
	}
	j.say(next.lines...)
	if next.nothingToDo {
		return done(goose, nil, false), nil
	}

	catalogDoubt, err := checkCatalog(ctx, tx, opts.Schema, opts.VersionTable, hist.state)
	if err != nil {
		return nil, err
	}
	if err := j.vouch(catalogDoubt, opts.Force); err != nil {
		return nil, err
	}
	if catalogDoubt == nil {
		j.say(fmt.Sprintf("catalog: matches upstream's at version %d", hist.state))
	}

	funcs, bodiesDoubt, err := checkBodies(ctx, tx, opts.Schema, hist.state, hist.unreleased)
	if err != nil {
		return nil, err
	}
	if err := j.vouch(bodiesDoubt, opts.Force); err != nil {
		return nil, err
	}
	if bodiesDoubt == nil {
		j.say(fmt.Sprintf("function bodies: all %d are upstream's or the pack's at version %d", len(funcs), hist.state))
	}

	plan := plan(base, hist.state, funcs)
	verb := ""
	if opts.DryRun {
		verb = "would "
	}
	if goose.versions == nil {
		j.say(fmt.Sprintf("%screate %s (goose's layout) and record versions 1..%d", verb, qtable, base))
	} else {
		j.say(fmt.Sprintf("%srecord versions 1..%d in %s", verb, base, qtable))
	}
	if opts.DryRun {
		j.say("dry run: nothing was changed")
		return done(goose, plan, true), nil
	}
	if err := record(ctx, tx, qtable, goose.versions == nil, base); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return done(goose, plan, true), nil
}

// doubt is what baseline cannot vouch for: Reason, and the differences
// (catalog, bodies) when there are some. Force lets it through.
type doubt struct {
	reason string
	diff   string
}

// journal is what Run tells people (Result.Lines) and what Force let
// through (Result.Unvouched), in the order the steps found them.
type journal struct {
	lines     []string
	unvouched []string
}

func (j *journal) say(lines ...string) { j.lines = append(j.lines, lines...) }

// vouch refuses d (nil: nothing to vouch for), or with force lets it
// through and records it.
func (j *journal) vouch(d *doubt, force bool) error {
	if d == nil {
		return nil
	}
	if !force {
		r := &Refusal{Reason: d.reason + "; nothing was changed (--force proceeds anyway)", Diff: d.diff}
		if d.diff != "" {
			r.Reason += ":"
		}
		return r
	}
	reason := d.reason
	if d.diff != "" {
		reason += ":\n" + strings.TrimRight(d.diff, "\n")
	}
	j.unvouched = append(j.unvouched, reason)
	j.say("--force: " + reason)
	return nil
}

// history is what duroxide-pg's runner recorded in _duroxide_migrations.
type history struct {
	schema string
	// recorded lists every version, ascending.
	recorded []int64
	// state is the newest recorded version the pack ports: the upstream
	// state the catalog and bodies are checked against.
	state int64
	// unreleased are the recorded versions no release carries but the pack
	// knows (upstream's candidate fix, and it amended).
	unreleased []fingerprint.Unreleased
	// unknown are the recorded versions the pack does not know.
	unknown []int64
}

// readHistory is step 1: it reads _duroxide_migrations and refuses a
// history that is not duroxide-pg's (no table, no rows, a gap, a name that
// is not upstream's).
func readHistory(ctx context.Context, tx *sql.Tx, schema string) (history, error) {
	h := history{schema: schema}
	var hasUpstream bool
	if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`,
		pgx.Identifier{schema, "_duroxide_migrations"}.Sanitize()).Scan(&hasUpstream); err != nil {
		return h, fmt.Errorf("look for _duroxide_migrations: %w", err)
	}
	if !hasUpstream {
		return h, refuse("schema %s has no _duroxide_migrations table: it was not created by duroxide-pg (wrong --schema?); for a new database run `harness migrate up` instead", schema)
	}
	rows, err := upstreamRows(ctx, tx, schema)
	if err != nil {
		return h, err
	}
	if len(rows) == 0 {
		return h, refuse("%s._duroxide_migrations is empty: duroxide-pg applied nothing here; run `harness migrate up` instead", schema)
	}
	return h, h.read(rows)
}

// read fills h from the rows of _duroxide_migrations (version: name).
func (h *history) read(rows map[int64]string) error {
	for v := range rows {
		h.recorded = append(h.recorded, v)
	}
	slices.Sort(h.recorded)
	known := migrations.UpstreamVersions()
	for _, v := range h.recorded {
		u, isUnreleased := fingerprint.UnreleasedFile(v, rows[v])
		switch {
		case slices.Contains(known, v):
			h.state = v
		case isUnreleased:
			h.unreleased = append(h.unreleased, u)
		default:
			h.unknown = append(h.unknown, v)
		}
	}
	if h.state == 0 {
		return refuse("%s._duroxide_migrations records versions %s, none of which the pack knows", h.schema, joinVersions(h.recorded))
	}
	var missing []int64
	for _, v := range known {
		if v <= h.state && rows[v] == "" {
			missing = append(missing, v)
		}
	}
	if len(missing) > 0 {
		return refuse("%s._duroxide_migrations records versions %s but not %s, which duroxide-pg applies in order: repair it by hand before baselining",
			h.schema, joinVersions(h.recorded), joinVersions(missing))
	}
	for _, v := range known {
		if v > h.state {
			break
		}
		if port, _ := migrations.PortOf(v); rows[v] != port.UpstreamName {
			return refuse("%s._duroxide_migrations version %d is %q, upstream's is %q: not duroxide-pg's migration history",
				h.schema, v, rows[v], port.UpstreamName)
		}
	}
	return nil
}

// lines describe the history, for people.
func (h history) lines() []string {
	out := []string{"_duroxide_migrations: duroxide-pg applied upstream versions " + describeVersions(h.recorded, migrations.UpstreamVersions())}
	for _, u := range h.unreleased {
		fn := fingerprint.NameOf(u.Function)
		out = append(out, fmt.Sprintf("upstream %d (%s) is in no release, and the pack knows it: %s; its %s is checked below, and `migrate up` installs the pack's fix of it (%s), which keeps upstream's change",
			u.Version, u.File, u.Note, fn, lastFixOf(fn)))
	}
	return out
}

// doubt is the versions the pack does not know (a newer duroxide-pg?), or
// nil.
func (h history) doubt() *doubt {
	if len(h.unknown) == 0 {
		return nil
	}
	return &doubt{reason: fmt.Sprintf("_duroxide_migrations records upstream version(s) %s, which this pack does not know (a newer duroxide-pg?); checking the database as upstream %d",
		joinVersions(h.unknown), h.state)}
}

func (h history) unreleasedVersions() []int64 {
	var out []int64
	for _, u := range h.unreleased {
		out = append(out, u.Version)
	}
	return out
}

// gooseTable is goose's version table as step 2 finds it: the applied
// versions above 0, ascending, or nil when there is no table.
type gooseTable struct{ versions []int64 }

// readGoose is step 2: goose's table of schema, if any.
func readGoose(ctx context.Context, tx *sql.Tx, schema, table string) (gooseTable, error) {
	vs, err := gooseApplied(ctx, tx, schema, table)
	return gooseTable{versions: vs}, err
}

// newest is goose's newest applied version (0: an empty table, -1: none).
func (g gooseTable) newest() int64 {
	switch {
	case g.versions == nil:
		return -1
	case len(g.versions) == 0:
		return 0
	}
	return g.versions[len(g.versions)-1]
}

// gooseStep is what to do about goose's table.
type gooseStep struct {
	// nothingToDo: the table already records 1..base or more.
	nothingToDo bool
	lines       []string
	// doubt: the table records versions that disagree with the runner's
	// history; recording replaces them.
	doubt *doubt
}

// decide says what recording versions 1..base does to the table.
func (g gooseTable) decide(base int64, qtable string) gooseStep {
	switch {
	case g.versions == nil:
		return gooseStep{}
	case contiguousFrom1(g.versions) && g.newest() >= base:
		return gooseStep{nothingToDo: true, lines: []string{fmt.Sprintf("%s already records versions 1..%d: nothing to do", qtable, g.newest())}}
	case len(g.versions) == 0:
		return gooseStep{lines: []string{qtable + " exists but records no migration: filling it"}}
	}
	step := gooseStep{doubt: &doubt{reason: fmt.Sprintf("%s already exists and records versions %s, which disagree with _duroxide_migrations: check how this database was migrated; replacing goose's rows with 1..%d",
		qtable, joinVersions(g.versions), base)}}
	if g.newest() > base {
		step.lines = append(step.lines, fmt.Sprintf("warning: goose recorded versions above %d; `harness migrate up` will apply them again", base))
	}
	return step
}

// checkCatalog is step 3: schema's catalog must be upstream's at state
// (goose's table left out). It returns the differences as a doubt, or nil.
func checkCatalog(ctx context.Context, tx *sql.Tx, schema, versionTable string, state int64) (*doubt, error) {
	want, err := expectedCatalog(state)
	if err != nil {
		return nil, err
	}
	got, err := catalog.Take(ctx, tx, schema)
	if err != nil {
		return nil, err
	}
	if got, err = withoutTable(got, versionTable); err != nil {
		return nil, err
	}
	diff := catalog.Diff(want, got)
	if diff == "" {
		return nil, nil
	}
	return &doubt{reason: fmt.Sprintf("schema %s does not match upstream's catalog at version %d. Differences (- missing, + extra, ~ differs; want = upstream, got = this database)",
		schema, state), diff: diff}, nil
}

// checkBodies is step 4: every function body must be one the pack knows at
// state, or a text of an unreleased upstream version the history records.
// It returns the schema's functions, and the unknown bodies as a doubt.
func checkBodies(ctx context.Context, tx *sql.Tx, schema string, state int64, unreleased []fingerprint.Unreleased) (map[string]fingerprint.Function, *doubt, error) {
	funcs, err := fingerprint.Take(ctx, tx, schema)
	if err != nil {
		return nil, nil, err
	}
	diff := unknownBodies(funcs, state, unreleased)
	if diff == "" {
		return funcs, nil, nil
	}
	return funcs, &doubt{reason: fmt.Sprintf("schema %s has function bodies that are neither upstream's at version %d nor the pack's (edited by hand, or from a newer duroxide-pg; the pack's fixes refuse to replace a definition they do not know)",
		schema, state), diff: diff}, nil
}

// record is step 5: goose's table (created when create) records exactly
// versions 0..base.
func record(ctx context.Context, tx *sql.Tx, qtable string, create bool, base int64) error {
	store, err := database.NewStore(database.DialectPostgres, qtable)
	if err != nil {
		return err
	}
	if create {
		if err := store.CreateVersionTable(ctx, tx); err != nil {
			return fmt.Errorf("create %s: %w", qtable, err)
		}
	} else if _, err := tx.ExecContext(ctx, "DELETE FROM "+qtable); err != nil {
		return fmt.Errorf("clear %s: %w", qtable, err)
	}
	for v := int64(0); v <= base; v++ {
		if err := store.Insert(ctx, tx, database.InsertRequest{Version: v}); err != nil {
			return fmt.Errorf("record version %d in %s: %w", v, qtable, err)
		}
	}
	return nil
}

// lastFixOf is the file of the newest fix migration of function name.
func lastFixOf(name string) string {
	last := ""
	for _, m := range migrations.Fixes() {
		if slices.Contains(m.Fixes, name) {
			last = m.File
		}
	}
	return last
}

// baselineFor is the goose version a database at upstream state has: the
// newest pack version such that every pack migration up to it is a port of
// an upstream version the database has. The pack's fixes come right after
// its port of 19, so from 19 on that is 19: the fixes are then applied, and
// the ports of later versions re-applied over the runner's objects.
func baselineFor(state int64) int64 {
	var b int64
	for _, m := range migrations.MustPack() {
		if !m.IsPort() || m.Upstream > state {
			break
		}
		b = m.Version
	}
	return b
}

// unknownBodies lists, one line each, the functions whose body is not a
// definition the pack knows at upstream state, or one of the texts of an
// unreleased upstream migration the database records.
func unknownBodies(funcs map[string]fingerprint.Function, state int64, unreleased []fingerprint.Unreleased) string {
	var b strings.Builder
	ids := make([]string, 0, len(funcs))
	for id := range funcs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		f := funcs[id]
		if fingerprint.Allowed(f, state) || slices.ContainsFunc(unreleased, func(u fingerprint.Unreleased) bool { return u.Holds(f) }) {
			continue
		}
		what := "a definition nobody knows"
		if d, ok := fingerprint.Identify(f); ok {
			what = d.Label + ", not a definition of version " + strconv.FormatInt(state, 10)
		}
		fmt.Fprintf(&b, "~ body     function %s: fingerprint %s is %s\n", id, f.Normalized, what)
	}
	return b.String()
}

// plan describes what `migrate up` does after baselining at from, on a
// database at upstream state.
func plan(from, state int64, funcs map[string]fingerprint.Function) []string {
	var out []string
	changed := false // a port before this fix applies a newer upstream version
	for _, m := range migrations.MustPack() {
		if m.Version <= from {
			continue
		}
		switch {
		case !m.IsPort() && changed:
			out = append(out, fmt.Sprintf("%s: fixes %s, as the ports before it leave it", m.File, strings.Join(m.Fixes, ", ")))
		case !m.IsPort():
			var installed []string
			for _, name := range m.Fixes {
				for _, f := range funcs {
					if f.Name != name {
						continue
					}
					d, ok := fingerprint.Identify(f)
					if !ok {
						d.Label = "unknown: the migration will refuse it"
					}
					installed = append(installed, fmt.Sprintf("%s (now %s)", name, d.Label))
				}
			}
			out = append(out, fmt.Sprintf("%s: fixes %s", m.File, strings.Join(installed, ", ")))
		case m.Upstream <= state:
			out = append(out, fmt.Sprintf("%s: re-applies upstream %d over the objects duroxide-pg's runner made (their rows are kept)", m.File, m.Upstream))
		default:
			changed = true
			out = append(out, fmt.Sprintf("%s: applies upstream %d", m.File, m.Upstream))
		}
	}
	return out
}

// describeVersions prints recorded versions, naming the gaps that are
// upstream's normal state (versions the pack knows upstream never used).
func describeVersions(recorded, known []int64) string {
	s := joinVersions(recorded)
	var gaps []int64
	top := recorded[len(recorded)-1]
	for v := int64(1); v < top; v++ {
		if !slices.Contains(recorded, v) && !slices.Contains(known, v) {
			gaps = append(gaps, v)
		}
	}
	if len(gaps) > 0 {
		s += fmt.Sprintf(" (no %s: upstream has not released it, as expected)", joinVersions(gaps))
	}
	return s
}

func upstreamRows(ctx context.Context, tx *sql.Tx, schema string) (map[int64]string, error) {
	q := "SELECT version, name FROM " + pgx.Identifier{schema, "_duroxide_migrations"}.Sanitize()
	rs, err := tx.QueryContext(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("read _duroxide_migrations: %w", err)
	}
	defer rs.Close()
	out := map[int64]string{}
	for rs.Next() {
		var v int64
		var n string
		if err := rs.Scan(&v, &n); err != nil {
			return nil, err
		}
		out[v] = n
	}
	return out, rs.Err()
}

// gooseApplied returns goose's applied versions above 0, ascending, or nil
// when the table does not exist.
func gooseApplied(ctx context.Context, tx *sql.Tx, schema, table string) ([]int64, error) {
	var exists bool
	if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = $2)`,
		schema, table).Scan(&exists); err != nil {
		return nil, fmt.Errorf("look for goose's table: %w", err)
	}
	if !exists {
		return nil, nil
	}
	q := "SELECT DISTINCT version_id FROM " + pgx.Identifier{schema, table}.Sanitize() + " WHERE is_applied AND version_id > 0 ORDER BY 1"
	rs, err := tx.QueryContext(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("read goose's table %s.%s: %w", schema, table, err)
	}
	defer rs.Close()
	out := []int64{}
	for rs.Next() {
		var v int64
		if err := rs.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rs.Err()
}

func contiguousFrom1(vs []int64) bool {
	for i, v := range vs {
		if v != int64(i+1) {
			return false
		}
	}
	return len(vs) > 0
}

func joinVersions(vs []int64) string {
	if len(vs) == 0 {
		return "none"
	}
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.FormatInt(v, 10)
	}
	if len(s) > 12 {
		s = append(s[:5], append([]string{"…"}, s[len(s)-5:]...)...)
	}
	return strings.Join(s, ",")
}

// withoutTable removes goose's version table (and its identity sequence)
// from a snapshot: catalog.Take skips only the default name.
func withoutTable(s catalog.Snapshot, table string) (catalog.Snapshot, error) {
	if table == migrate.VersionTable {
		return s, nil
	}
	var c map[string]any
	if err := json.Unmarshal(s, &c); err != nil {
		return nil, err
	}
	if ts, ok := c["tables"].([]any); ok {
		c["tables"] = slices.DeleteFunc(ts, func(t any) bool {
			m, _ := t.(map[string]any)
			return m["name"] == table
		})
	}
	if ss, ok := c["sequences"].([]any); ok {
		c["sequences"] = slices.DeleteFunc(ss, func(x any) bool {
			n, _ := x.(string)
			return strings.HasPrefix(n, table+"_")
		})
	}
	raw, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	return catalog.Canonical(raw)
}

// IsRefusal reports whether err is a Refusal.
func IsRefusal(err error) bool {
	var r *Refusal
	return errors.As(err, &r)
}
