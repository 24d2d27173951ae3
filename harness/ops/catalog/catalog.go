// Package catalog reads the structure of one schema (tables, columns,
// constraints, indexes, function signatures, sequences) in the exact JSON
// shape of the upstream reference snapshots, and diffs two such snapshots
// readably.
package catalog

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Querier is what catalog reads through: *sql.DB, *sql.Conn or *sql.Tx.
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// query is a Go port of upstream's catalog query: $1 is the schema name.
// It skips goose's version table and sequence, and the NOT NULL constraints
// that PostgreSQL 18 records in pg_constraint (columns already carry
// not_null), so that every server version gives upstream's shape.
const query = `
SELECT jsonb_build_object(
 'tables', (SELECT coalesce(jsonb_agg(t ORDER BY t->>'name'), '[]') FROM (
   SELECT jsonb_build_object('name', c.relname,
     'columns', (SELECT jsonb_agg(jsonb_build_object('name', a.attname, 'type', format_type(a.atttypid, a.atttypmod), 'not_null', a.attnotnull,
                    'default', replace(pg_get_expr(d.adbin, d.adrelid), quote_ident($1::text)||'.', '')) ORDER BY a.attnum)
                 FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid=a.attrelid AND d.adnum=a.attnum
                 WHERE a.attrelid=c.oid AND a.attnum>0 AND NOT a.attisdropped),
     'constraints', (SELECT coalesce(jsonb_agg(jsonb_build_object('name', co.conname, 'type', co.contype, 'def', replace(pg_get_constraintdef(co.oid), quote_ident($1::text)||'.', '')) ORDER BY co.conname), '[]')
                 FROM pg_constraint co WHERE co.conrelid=c.oid AND co.contype <> 'n'),
     'indexes', (SELECT coalesce(jsonb_agg(jsonb_build_object('name', i.relname, 'def', replace(pg_get_indexdef(i.oid), quote_ident(n.nspname)||'.', '')) ORDER BY i.relname), '[]')
                 FROM pg_index x JOIN pg_class i ON i.oid=x.indexrelid WHERE x.indrelid=c.oid)
   ) t
   FROM pg_class c JOIN pg_namespace n ON n.oid=c.relnamespace
   WHERE n.nspname = $1::text AND c.relkind='r' AND c.relname NOT IN ('goose_db_version')) s),
 'functions', (SELECT coalesce(jsonb_agg(f ORDER BY f->>'name', f->>'identity_args'), '[]') FROM (
   SELECT jsonb_build_object('name', p.proname, 'identity_args', pg_get_function_identity_arguments(p.oid),
     'args', pg_get_function_arguments(p.oid), 'result', pg_get_function_result(p.oid),
     'language', l.lanname, 'volatility', p.provolatile, 'security_definer', p.prosecdef, 'strict', p.proisstrict) f
   FROM pg_proc p JOIN pg_namespace n ON n.oid=p.pronamespace JOIN pg_language l ON l.oid=p.prolang
   WHERE n.nspname = $1::text) s),
 'sequences', (SELECT coalesce(jsonb_agg(c.relname ORDER BY c.relname), '[]') FROM pg_class c JOIN pg_namespace n ON n.oid=c.relnamespace WHERE n.nspname=$1::text AND c.relkind='S' AND c.relname NOT LIKE 'goose_db_version%')
)::text`

// bodiesQuery returns, for every function of schema $1, its identity and an
// md5 of its full definition (pg_get_functiondef), so that a Down can be
// proved to restore the previous bodies, not just the signatures.
const bodiesQuery = `
SELECT coalesce(jsonb_object_agg(p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
                                 md5(pg_get_functiondef(p.oid))), '{}')::text
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = $1::text`

// Snapshot is a schema's catalog in canonical JSON form (keys sorted, as
// produced by encoding/json from a generic value).
type Snapshot []byte

// Take reads the catalog of schema through q.
func Take(ctx context.Context, q Querier, schema string) (Snapshot, error) {
	var raw string
	if err := q.QueryRowContext(ctx, query, schema).Scan(&raw); err != nil {
		return nil, fmt.Errorf("read catalog of schema %s: %w", schema, err)
	}
	return Canonical([]byte(raw))
}

// Bodies reads name(args) -> md5(pg_get_functiondef) for schema.
func Bodies(ctx context.Context, q Querier, schema string) (map[string]string, error) {
	var raw string
	if err := q.QueryRowContext(ctx, bodiesQuery, schema).Scan(&raw); err != nil {
		return nil, fmt.Errorf("read function bodies of schema %s: %w", schema, err)
	}
	out := map[string]string{}
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		return nil, fmt.Errorf("decode function bodies: %w", err)
	}
	return out, nil
}

// Canonical re-encodes JSON with sorted keys and fixed indentation, so that
// equal catalogs are equal byte for byte.
func Canonical(raw []byte) (Snapshot, error) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("decode catalog JSON: %w", err)
	}
	out, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return nil, err
	}
	return Snapshot(out), nil
}

// Without is s without the objects named (as a fix migration's "-- Adds:"
// line names them: "table name" with its columns, constraints and indexes,
// "index name" on any table, "function name" with every overload). Kinds
// the snapshot does not hold (triggers) are ignored.
func (s Snapshot) Without(objects []string) (Snapshot, error) {
	var c map[string]any
	dec := json.NewDecoder(bytes.NewReader(s))
	dec.UseNumber()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("decode catalog JSON: %w", err)
	}
	drop := map[string]map[string]bool{"table": {}, "index": {}, "function": {}}
	for _, o := range objects {
		kind, name, _ := strings.Cut(o, " ")
		if set, ok := drop[kind]; ok {
			set[name] = true
		}
	}
	named := func(v any) string {
		m, _ := v.(map[string]any)
		n, _ := m["name"].(string)
		return n
	}
	keep := func(list any, gone map[string]bool) []any {
		items, _ := list.([]any)
		out := []any{}
		for _, it := range items {
			if !gone[named(it)] {
				out = append(out, it)
			}
		}
		return out
	}
	tables := keep(c["tables"], drop["table"])
	for _, t := range tables {
		tm := t.(map[string]any)
		tm["indexes"] = keep(tm["indexes"], drop["index"])
	}
	c["tables"] = tables
	c["functions"] = keep(c["functions"], drop["function"])
	raw, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	return Canonical(raw)
}

// Empty reports whether the snapshot has no table, function or sequence.
func (s Snapshot) Empty() bool {
	var c struct {
		Tables, Functions, Sequences []json.RawMessage
	}
	return json.Unmarshal(s, &c) == nil && len(c.Tables)+len(c.Functions)+len(c.Sequences) == 0
}

// Diff describes how got differs from want, one line per difference,
// addressed by object ("table orchestrator_queue column visible_at"): a
// whole missing or extra object is one line, a changed attribute is one line
// with both values. It returns "" when they are equal.
func Diff(want, got Snapshot) string {
	w, errW := flatten(want)
	g, errG := flatten(got)
	if errW != nil || errG != nil {
		return fmt.Sprintf("cannot compare: want: %v, got: %v", errW, errG)
	}
	objects := map[string]bool{}
	for k := range w {
		objects[k] = true
	}
	for k := range g {
		objects[k] = true
	}
	var b strings.Builder
	for _, obj := range sortedKeys(objects) {
		wa, inW := w[obj]
		ga, inG := g[obj]
		switch {
		case !inG:
			fmt.Fprintf(&b, "- missing  %s%s\n", obj, summary(wa))
		case !inW:
			fmt.Fprintf(&b, "+ extra    %s%s\n", obj, summary(ga))
		default:
			attrs := map[string]bool{}
			for a := range wa {
				attrs[a] = true
			}
			for a := range ga {
				attrs[a] = true
			}
			for _, a := range sortedKeys(attrs) {
				if wa[a] != ga[a] {
					fmt.Fprintf(&b, "~ differs  %s %s: want %s, got %s\n", obj, a, orNone(wa[a]), orNone(ga[a]))
				}
			}
		}
	}
	return b.String()
}

func summary(attrs map[string]string) string {
	for _, k := range []string{"def", "result", "type"} {
		if v, ok := attrs[k]; ok {
			return " (" + k + " " + v + ")"
		}
	}
	return ""
}

func orNone(v string) string {
	if v == "" {
		return "(none)"
	}
	return v
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// flatten turns a snapshot into object -> attribute -> JSON value, naming
// tables, columns, constraints, indexes and functions by name rather than
// position (a column's position is one of its attributes).
func flatten(s Snapshot) (map[string]map[string]string, error) {
	var c struct {
		Tables []struct {
			Name        string                       `json:"name"`
			Columns     []map[string]json.RawMessage `json:"columns"`
			Constraints []map[string]json.RawMessage `json:"constraints"`
			Indexes     []map[string]json.RawMessage `json:"indexes"`
		} `json:"tables"`
		Functions []map[string]json.RawMessage `json:"functions"`
		Sequences []string                     `json:"sequences"`
	}
	if err := json.Unmarshal(s, &c); err != nil {
		return nil, err
	}
	out := map[string]map[string]string{}
	name := func(m map[string]json.RawMessage, key string) string {
		var n string
		_ = json.Unmarshal(m[key], &n)
		return n
	}
	put := func(obj string, m map[string]json.RawMessage, skip ...string) map[string]string {
		attrs := map[string]string{}
		for k, v := range m {
			if !slices.Contains(skip, k) {
				attrs[k] = string(v)
			}
		}
		out[obj] = attrs
		return attrs
	}
	for _, t := range c.Tables {
		base := "table " + t.Name
		out[base] = map[string]string{}
		for i, col := range t.Columns {
			put(base+" column "+name(col, "name"), col, "name")["position"] = fmt.Sprint(i + 1)
		}
		for _, con := range t.Constraints {
			put(base+" constraint "+name(con, "name"), con, "name")
		}
		for _, idx := range t.Indexes {
			put(base+" index "+name(idx, "name"), idx, "name")
		}
	}
	for _, f := range c.Functions {
		put("function "+name(f, "name")+"("+name(f, "identity_args")+")", f, "name", "identity_args")
	}
	for _, seq := range c.Sequences {
		out["sequence "+seq] = map[string]string{}
	}
	return out, nil
}
