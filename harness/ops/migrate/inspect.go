package migrate

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	migrations "github.com/duroxide-pg/migrations"
)

// Applied is what goose's table records of one version.
type Applied struct {
	Version   int64
	AppliedAt time.Time
}

// State is what a schema holds of the pack, read without changing
// anything (goose's own provider creates its table when it is missing,
// even to report a status).
type State struct {
	Schema       string
	SchemaExists bool
	TableExists  bool
	// Applied are the versions goose's table records as applied, in order.
	Applied []Applied
	// Tables are the schema's tables by name, with their size (Inspect
	// reads them; nil elsewhere).
	Tables map[string]TableSize
}

// TableSize is what a migration's duration grows with: the planner's
// estimate of a table's rows (pg_class.reltuples, -1 when the table was
// never analyzed or vacuumed) and its size on disk with its indexes.
type TableSize struct {
	Rows  int64
	Bytes int64
}

// Version is the newest applied version (0 for none).
func (s *State) Version() int64 {
	if len(s.Applied) == 0 {
		return 0
	}
	return s.Applied[len(s.Applied)-1].Version
}

// AppliedAt returns when version was applied, and whether it is.
func (s *State) AppliedAt(version int64) (time.Time, bool) {
	for _, a := range s.Applied {
		if a.Version == version {
			return a.AppliedAt, true
		}
	}
	return time.Time{}, false
}

// readState reads schema's goose table through db. It only reads: a
// missing schema or table is reported in State, not created.
func readState(ctx context.Context, db *sql.DB, schema, table string) (*State, error) {
	st := &State{Schema: schema}
	err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1),
		EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2)`,
		schema, table).Scan(&st.SchemaExists, &st.TableExists)
	if err != nil {
		return nil, fmt.Errorf("look for schema %s: %w", schema, err)
	}
	if !st.TableExists {
		return st, nil
	}
	// goose's reading: a version's newest row says whether it is applied.
	rows, err := db.QueryContext(ctx, `SELECT version_id, is_applied, tstamp FROM (
		SELECT DISTINCT ON (version_id) version_id, is_applied, tstamp FROM `+pgx.Identifier{schema, table}.Sanitize()+`
		WHERE version_id > 0 ORDER BY version_id, id DESC) v ORDER BY version_id`)
	if err != nil {
		return nil, fmt.Errorf("read %s.%s: %w", schema, table, err)
	}
	defer rows.Close()
	for rows.Next() {
		var a Applied
		var applied bool
		if err := rows.Scan(&a.Version, &applied, &a.AppliedAt); err != nil {
			return nil, err
		}
		if applied {
			st.Applied = append(st.Applied, a)
		}
	}
	return st, rows.Err()
}

// Inspect connects to the database of cfg and reads opts.Schema's State, checking nothing
// but what needs no write: a direct connection and, when the schema has
// duroxide-pg's objects, that it was adopted (ErrNeedsBaseline otherwise).
func Inspect(ctx context.Context, cfg *pgx.ConnConfig, opts Options) (*State, error) {
	opts.Schema, opts.VersionTable = Names(opts.Schema, opts.VersionTable)
	db, err := openDirect(ctx, cfg, opts.Schema, opts.Role)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	if _, err := CheckAdopted(ctx, db, opts.Schema, opts.VersionTable); err != nil {
		return nil, err
	}
	st, err := readState(ctx, db, opts.Schema, opts.VersionTable)
	if err != nil {
		return nil, err
	}
	if st.Tables, err = readTableSizes(ctx, db, opts.Schema); err != nil {
		return nil, err
	}
	return st, nil
}

// readTableSizes reads the size of every table of schema; it only reads.
func readTableSizes(ctx context.Context, db *sql.DB, schema string) (map[string]TableSize, error) {
	rows, err := db.QueryContext(ctx, `SELECT c.relname, c.reltuples::bigint, pg_total_relation_size(c.oid)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')`, schema)
	if err != nil {
		return nil, fmt.Errorf("read the table sizes of schema %s: %w", schema, err)
	}
	defer rows.Close()
	out := map[string]TableSize{}
	for rows.Next() {
		var name string
		var size TableSize
		if err := rows.Scan(&name, &size.Rows, &size.Bytes); err != nil {
			return nil, fmt.Errorf("read the table sizes of schema %s: %w", schema, err)
		}
		out[name] = size
	}
	return out, rows.Err()
}

// Source is one migration file of a pack.
type Source struct {
	Version int64
	Path    string
}

// Sources lists the migrations of fsys in version order, as goose names
// them: NNNN_name.sql. For the embedded pack (fsys nil) they are the ones
// migrations.Pack reads.
func Sources(fsys fs.FS) ([]Source, error) {
	if fsys == nil {
		pack, err := migrations.Pack()
		if err != nil {
			return nil, err
		}
		out := make([]Source, len(pack))
		for i, m := range pack {
			out[i] = Source{Version: m.Version, Path: m.File}
		}
		return out, nil
	}
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	var out []Source
	for _, n := range names {
		num, _, ok := strings.Cut(path.Base(n), "_")
		v, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration %s: no version number", n)
		}
		out = append(out, Source{Version: v, Path: n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// CurrentVersion is the newest version goose's table in schema records,
// read without writing (0 when the schema or table is missing).
func CurrentVersion(ctx context.Context, cfg *pgx.ConnConfig, schema string) (int64, error) {
	db := OpenDB(cfg, schema, "")
	defer db.Close()
	st, err := readState(ctx, db, schema, VersionTable)
	if err != nil {
		return 0, err
	}
	return st.Version(), nil
}
