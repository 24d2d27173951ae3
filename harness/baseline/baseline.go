// Package baseline adopts a database that duroxide-pg's own runner created
// (its bookkeeping table _duroxide_migrations, no goose version table) into
// the pack: it checks that the schema's catalog is the one the pack builds
// at the newest upstream version V recorded there, then records versions
// 1..V in goose's version table, so that goose applies only V+1 onwards.
package baseline

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3/database"

	"github.com/duroxide-pg/migrations/harness/catalog"
	"github.com/duroxide-pg/migrations/harness/migrate"
	migrations "github.com/duroxide-pg/migrations/sql"
)

// UpstreamVersions is the newest upstream duroxide-pg version the pack
// re-creates (0001..0019); later upstream versions are not the pack's.
const UpstreamVersions = 19

// Expected holds the pack's catalog at each upstream version,
// expected/vNNNN.json: copies of migrations_test/testdata/catalog (a test
// fails when they drift apart).
//
//go:embed expected/*.json
var Expected embed.FS

// ExpectedCatalog is the pack's catalog at upstream version v (1..19).
func ExpectedCatalog(v int64) (catalog.Snapshot, error) {
	raw, err := Expected.ReadFile(fmt.Sprintf("expected/v%04d.json", v))
	if err != nil {
		return nil, fmt.Errorf("no expected catalog for version %d: %w", v, err)
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
	// Force replaces the rows of an existing goose version table that
	// disagrees with _duroxide_migrations.
	Force bool
}

// Result says what Run found and did (or, with DryRun, would do).
type Result struct {
	Schema       string
	VersionTable string // schema-qualified, quoted
	// Upstream is the newest version in _duroxide_migrations.
	Upstream int64
	// Baseline is the version recorded in goose's table: Upstream, or 19
	// when Upstream is a later upstream version the pack does not have.
	Baseline int64
	// Goose is goose's newest applied version before the run (-1: no table).
	Goose int64
	// Changed is false when nothing was (or, dry run, would be) written.
	Changed bool
	DryRun  bool
	// Lines describe the checks and actions, for people.
	Lines []string
}

// Refusal is a database Run will not baseline; Error says why and what to
// do, Diff (when the catalog differs) lists the differences.
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
	if opts.Schema == "" {
		opts.Schema = migrate.DefaultSchema
	}
	if opts.VersionTable == "" {
		opts.VersionTable = migrate.VersionTable
	}
	qtable := pgx.Identifier{opts.Schema, opts.VersionTable}.Sanitize()
	res := &Result{Schema: opts.Schema, VersionTable: qtable, Goose: -1, DryRun: opts.DryRun}
	say := func(format string, args ...any) { res.Lines = append(res.Lines, fmt.Sprintf(format, args...)) }

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
	versions := make([]int64, 0, len(rows))
	for v := range rows {
		versions = append(versions, v)
	}
	slices.Sort(versions)
	res.Upstream = versions[len(versions)-1]
	for i, v := range versions {
		if v != int64(i+1) {
			return nil, refuse("%s._duroxide_migrations has versions %s, not 1..%d without gaps: repair it by hand before baselining",
				opts.Schema, joinVersions(versions), res.Upstream)
		}
	}
	names, err := packNames()
	if err != nil {
		return nil, err
	}
	for v := int64(1); v <= min(res.Upstream, UpstreamVersions); v++ {
		if rows[v] != names[v] {
			return nil, refuse("%s._duroxide_migrations version %d is %q, the pack's is %q: not duroxide-pg's migration history",
				opts.Schema, v, rows[v], names[v])
		}
	}
	res.Baseline = min(res.Upstream, UpstreamVersions)
	say("_duroxide_migrations: duroxide-pg applied versions 1..%d", res.Upstream)

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
		case !opts.Force:
			return nil, refuse("%s already exists and records versions %s, which disagree with _duroxide_migrations (1..%d): check how this database was migrated; --force replaces goose's rows with 1..%d",
				qtable, joinVersions(gooseVersions), res.Upstream, res.Baseline)
		default:
			replace = true
			say("--force: replacing the rows of %s (versions %s) with 1..%d", qtable, joinVersions(gooseVersions), res.Baseline)
			if res.Goose > res.Baseline {
				say("warning: goose recorded versions above %d; `harness migrate up` will apply them again", res.Baseline)
			}
		}
	}

	// 3. The catalog must be the pack's at Baseline.
	want, err := ExpectedCatalog(res.Baseline)
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
	diff := catalog.Diff(want, got)
	if res.Upstream > UpstreamVersions {
		// Later upstream versions may add objects; everything of 19 must
		// be there unchanged.
		diff = dropExtras(diff)
	}
	if diff != "" {
		what := fmt.Sprintf("the pack's catalog at version %d", res.Baseline)
		if res.Upstream > UpstreamVersions {
			what = fmt.Sprintf("every object of the pack's catalog at version %d (objects added by upstream's later versions are allowed)", res.Baseline)
		}
		return nil, &Refusal{
			Reason: fmt.Sprintf("schema %s does not match %s; nothing was changed. Differences (- missing, + extra, ~ differs; want = the pack, got = this database):",
				opts.Schema, what),
			Diff: diff,
		}
	}
	if res.Upstream > UpstreamVersions {
		say("catalog: every object of version %d is present and unchanged; versions %d..%d are upstream's later migrations, which the pack does not have: baselining at %d",
			UpstreamVersions, UpstreamVersions+1, res.Upstream, res.Baseline)
	} else {
		say("catalog: matches the pack at version %d", res.Baseline)
	}

	// 4. Record 1..Baseline.
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

var fileName = regexp.MustCompile(`^(\d{4})_.*\.sql$`)

// packNames maps each version of the pack to its file name.
func packNames() (map[int64]string, error) {
	entries, err := fs.ReadDir(migrations.FS, ".")
	if err != nil {
		return nil, err
	}
	out := map[int64]string{}
	for _, e := range entries {
		if m := fileName.FindStringSubmatch(e.Name()); m != nil {
			v, _ := strconv.ParseInt(m[1], 10, 64)
			out[v] = path.Base(e.Name())
		}
	}
	return out, nil
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

// dropExtras keeps the lines of a catalog diff that are not "+ extra".
func dropExtras(diff string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(diff, "\n") {
		if line != "" && !strings.HasPrefix(line, "+ extra") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
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
