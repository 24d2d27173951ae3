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
// its work in one transaction.
func Run(ctx context.Context, db *sql.DB, opts Options) (*Result, error) {
	opts.Schema, opts.VersionTable = migrate.Names(opts.Schema, opts.VersionTable)
	qtable := pgx.Identifier{opts.Schema, opts.VersionTable}.Sanitize()
	res := &Result{Schema: opts.Schema, VersionTable: qtable, Goose: -1, DryRun: opts.DryRun}
	say := func(format string, args ...any) { res.Lines = append(res.Lines, fmt.Sprintf(format, args...)) }
	// vouch refuses what cannot be vouched for (listed in diff, if any), or
	// with --force lets it through and records it.
	vouch := func(reason, diff string) error {
		if !opts.Force {
			r := &Refusal{Reason: reason + "; nothing was changed (--force proceeds anyway)", Diff: diff}
			if diff != "" {
				r.Reason += ":"
			}
			return r
		}
		if diff != "" {
			reason += ":\n" + strings.TrimRight(diff, "\n")
		}
		res.Unvouched = append(res.Unvouched, reason)
		say("--force: %s", reason)
		return nil
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", migrate.LockID(opts.Schema)); err != nil {
		return nil, fmt.Errorf("take the migration lock of schema %s: %w", opts.Schema, err)
	}

	// 1. What duroxide-pg's runner recorded.
	var hasUpstream bool
	if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`,
		pgx.Identifier{opts.Schema, "_duroxide_migrations"}.Sanitize()).Scan(&hasUpstream); err != nil {
		return nil, fmt.Errorf("look for _duroxide_migrations: %w", err)
	}
	if !hasUpstream {
		return nil, refuse("schema %s has no _duroxide_migrations table: it was not created by duroxide-pg (wrong --schema?); for a new database run `harness migrate up` instead", opts.Schema)
	}
	rows, err := upstreamRows(ctx, tx, opts.Schema)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, refuse("%s._duroxide_migrations is empty: duroxide-pg applied nothing here; run `harness migrate up` instead", opts.Schema)
	}
	for v := range rows {
		res.Recorded = append(res.Recorded, v)
	}
	slices.Sort(res.Recorded)
	res.Upstream = res.Recorded[len(res.Recorded)-1]
	known := migrations.UpstreamVersions()
	var unknown []int64
	var unreleased []fingerprint.Unreleased
	for _, v := range res.Recorded {
		u, isUnreleased := fingerprint.UnreleasedAt(v)
		switch {
		case slices.Contains(known, v):
			res.State = v
		case isUnreleased && rows[v] == u.File:
			unreleased = append(unreleased, u)
			res.Unreleased = append(res.Unreleased, v)
		default:
			unknown = append(unknown, v)
		}
	}
	if res.State == 0 {
		return nil, refuse("%s._duroxide_migrations records versions %s, none of which the pack knows", opts.Schema, joinVersions(res.Recorded))
	}
	var missing []int64
	for _, v := range known {
		if v <= res.State && rows[v] == "" {
			missing = append(missing, v)
		}
	}
	if len(missing) > 0 {
		return nil, refuse("%s._duroxide_migrations records versions %s but not %s, which duroxide-pg applies in order: repair it by hand before baselining",
			opts.Schema, joinVersions(res.Recorded), joinVersions(missing))
	}
	for _, v := range known {
		if v > res.State {
			break
		}
		if port, _ := migrations.PortOf(v); rows[v] != port.UpstreamName {
			return nil, refuse("%s._duroxide_migrations version %d is %q, upstream's is %q: not duroxide-pg's migration history",
				opts.Schema, v, rows[v], port.UpstreamName)
		}
	}
	say("_duroxide_migrations: duroxide-pg applied upstream versions %s", describeVersions(res.Recorded, known))
	for _, u := range unreleased {
		fn := fingerprint.NameOf(u.Function)
		say("upstream %d (%s) is in no release, and the pack knows it: %s; its %s is checked below, and kept by the pack's fixes until %s replaces it with the pack's, which takes the same schema-scoped key",
			u.Version, u.File, u.Note, fn, lastFixOf(fn))
	}
	if len(unknown) > 0 {
		if err := vouch(fmt.Sprintf("_duroxide_migrations records upstream version(s) %s, which this pack does not know (a newer duroxide-pg?); checking the database as upstream %d",
			joinVersions(unknown), res.State), ""); err != nil {
			return nil, err
		}
	}
	res.Baseline = baselineFor(res.State)

	// 2. goose's table, if any.
	gooseVersions, err := gooseApplied(ctx, tx, opts.Schema, opts.VersionTable)
	if err != nil {
		return nil, err
	}
	replace := false
	if gooseVersions != nil {
		res.Goose = 0
		if len(gooseVersions) > 0 {
			res.Goose = gooseVersions[len(gooseVersions)-1]
		}
		switch {
		case contiguousFrom1(gooseVersions) && res.Goose >= res.Baseline:
			say("%s already records versions 1..%d: nothing to do", qtable, res.Goose)
			return res, nil
		case len(gooseVersions) == 0:
			say("%s exists but records no migration: filling it", qtable)
		default:
			if err := vouch(fmt.Sprintf("%s already exists and records versions %s, which disagree with _duroxide_migrations: check how this database was migrated; replacing goose's rows with 1..%d",
				qtable, joinVersions(gooseVersions), res.Baseline), ""); err != nil {
				return nil, err
			}
			replace = true
			if res.Goose > res.Baseline {
				say("warning: goose recorded versions above %d; `harness migrate up` will apply them again", res.Baseline)
			}
		}
	}

	// 3. The catalog must be upstream's at State.
	want, err := expectedCatalog(res.State)
	if err != nil {
		return nil, err
	}
	got, err := catalog.Take(ctx, tx, opts.Schema)
	if err != nil {
		return nil, err
	}
	if got, err = withoutTable(got, opts.VersionTable); err != nil {
		return nil, err
	}
	if diff := catalog.Diff(want, got); diff != "" {
		if err := vouch(fmt.Sprintf("schema %s does not match upstream's catalog at version %d. Differences (- missing, + extra, ~ differs; want = upstream, got = this database)",
			opts.Schema, res.State), diff); err != nil {
			return nil, err
		}
	} else {
		say("catalog: matches upstream's at version %d", res.State)
	}

	// 4. Every function body must be one the pack knows at State.
	funcs, err := fingerprint.Take(ctx, tx, opts.Schema)
	if err != nil {
		return nil, err
	}
	if diff := unknownBodies(funcs, res.State, unreleased); diff != "" {
		if err := vouch(fmt.Sprintf("schema %s has function bodies that are neither upstream's at version %d nor the pack's (edited by hand, or from a newer duroxide-pg; the pack's fixes refuse to replace a definition they do not know)",
			opts.Schema, res.State), diff); err != nil {
			return nil, err
		}
	} else {
		say("function bodies: all %d are upstream's or the pack's at version %d", len(funcs), res.State)
	}

	// 5. Record 1..Baseline, and say what `migrate up` will do.
	res.Plan = plan(res.Baseline, res.State, funcs)
	res.Changed = true
	verb := ""
	if opts.DryRun {
		verb = "would "
	}
	store, err := database.NewStore(database.DialectPostgres, qtable)
	if err != nil {
		return nil, err
	}
	if gooseVersions == nil {
		say("%screate %s (goose's layout) and record versions 1..%d", verb, qtable, res.Baseline)
		if !opts.DryRun {
			if err := store.CreateVersionTable(ctx, tx); err != nil {
				return nil, fmt.Errorf("create %s: %w", qtable, err)
			}
		}
	} else {
		say("%srecord versions 1..%d in %s", verb, res.Baseline, qtable)
	}
	if opts.DryRun {
		say("dry run: nothing was changed")
		return res, nil
	}
	if replace || gooseVersions != nil {
		if _, err := tx.ExecContext(ctx, "DELETE FROM "+qtable); err != nil {
			return nil, fmt.Errorf("clear %s: %w", qtable, err)
		}
	}
	for v := int64(0); v <= res.Baseline; v++ {
		if err := store.Insert(ctx, tx, database.InsertRequest{Version: v}); err != nil {
			return nil, fmt.Errorf("record version %d in %s: %w", v, qtable, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return res, nil
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
