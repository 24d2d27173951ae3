package restore

import (
	"fmt"
	"strings"

	migrations "github.com/duroxide-pg/migrations"
)

// File is where the checkout keeps Script(migrations.Latest()), in goose
// format, for a DBA who runs psql or the stock goose CLI (`goose -dir
// sql/restore -no-versioning up` applies it again on every run, recording
// nothing). `harness sql restore -o FILE` writes it; a test holds the file
// to what the migrations make.
const File = "sql/restore/0001_restore_fixes.sql"

// Script is the restore for goose version upTo as one SQL statement (a DO
// block, atomic on its own, in psql's autocommit as in a transaction): it
// identifies every function the fixes up to upTo fix and refuses, with
// SQLSTATE 55000 naming each, before any change when one is missing,
// overloaded or a definition nobody knows; then, for each function whose
// definition the pack knows without the newest fix of its behaviour, it
// takes that fix's locks and installs its body, verbatim from the fix's
// file; a definition whose behaviour no fix serves yet is left as it is.
// Each step says what it did (RAISE NOTICE). It relies on search_path
// naming the duroxide schema, as every migration of the pack does.
func Script(upTo int64) string {
	fns, table := rows(upTo)
	var b strings.Builder
	fmt.Fprintf(&b, `-- The pack's restore step at goose version %d: the fixes duroxide-pg's runner
-- replaced, installed again. Generated from sql/ (the fix migrations' guards,
-- bodies and "-- Leaves:" / "-- Behaviour:" lines) by `+"`harness sql restore`"+`;
-- do not edit. `+"`harness migrate up`"+` runs it after goose's migrations; with psql
-- or the stock goose CLI, after the migrations, search_path naming the schema:
--   psql -v ON_ERROR_STOP=1 -c 'SET search_path TO duroxide' -f %s "$DSN"
--   GOOSE_DRIVER=postgres GOOSE_DBSTRING="$DSN?search_path=duroxide" goose -dir sql/restore -no-versioning up
-- One statement: it identifies every fixed function first and changes nothing
-- when one is unknown (SQLSTATE 55000), then installs each missing fix under the
-- locks of the migration that brought it. A second run finds every fix in force.
-- Functions: %s.

-- +goose Up
-- +goose StatementBegin
DO $restore$
DECLARE
    v_fn record;
    v_count bigint;
    v_raw text;
    v_normalized text;
    v_row record;
    v_unknown text[] := '{}';
    v_plan jsonb := '{}';
BEGIN
    -- Every function the pack fixes, identified before anything changes.
    FOR v_fn IN
        SELECT f.name, f.optional
        FROM (VALUES
`, upTo, File, functionList(fns))
	for i, f := range fns {
		fmt.Fprintf(&b, "            (%s, %t)%s\n", literal(f.name), f.optional, sep(i, len(fns)))
	}
	b.WriteString(`        ) AS f(name, optional)
    LOOP
        SELECT count(*), min(md5(p.prosrc)),
               min(md5(replace(replace(p.prosrc, n.nspname || '.', '@schema@.'), quote_literal(n.nspname), '''@schema@''')))
          INTO v_count, v_raw, v_normalized
          FROM pg_proc p
          JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = current_schema()
           AND p.proname = v_fn.name;
        IF v_count = 0 AND v_fn.optional THEN
            CONTINUE;  -- added by an upstream migration this schema has not had
        ELSIF v_count <> 1 THEN
            v_unknown := v_unknown || format('%s: %s definitions', v_fn.name, v_count);
            CONTINUE;
        END IF;

        -- (function, fingerprint, definition, action)
        SELECT k.definition, k.action INTO v_row
        FROM (VALUES
`)
	for i, r := range table {
		fmt.Fprintf(&b, "            (%s, %s, %s, %s)%s\n", literal(r.function), literal(r.fingerprint), literal(r.definition), literal(actionOf(r)), sep(i, len(table)))
	}
	b.WriteString(`        ) AS k(function_name, fingerprint, definition, action)
        WHERE k.function_name = v_fn.name
          AND k.fingerprint IN (v_raw, v_normalized)
        LIMIT 1;
        IF NOT FOUND THEN
            v_unknown := v_unknown || format('%s: a definition nobody knows (fingerprint %s)', v_fn.name, v_normalized);
        ELSE
            v_plan := v_plan || jsonb_build_object(v_fn.name, jsonb_build_object('action', v_row.action, 'definition', v_row.definition));
        END IF;
    END LOOP;
    IF cardinality(v_unknown) > 0 THEN
        RAISE EXCEPTION 'restore: %; nothing was changed', array_to_string(v_unknown, '; ')
            USING ERRCODE = '55000',
                  HINT = 'The pack installs its fixes only over definitions it knows. ` + "`harness doctor`" + ` shows what is installed; compare it with upstream''s and the pack''s texts.';
    END IF;
`)
	// One install branch per body the table installs, in table order.
	seen := map[string]bool{}
	for _, r := range table {
		if r.action != Restore || seen[r.key()] {
			continue
		}
		seen[r.key()] = true
		fmt.Fprintf(&b, "\n    IF v_plan #>> '{%s,action}' = %s THEN\n", r.function, literal(actionOf(r)))
		for _, l := range r.fix.UpLocks {
			fmt.Fprintf(&b, "        %s\n", l)
		}
		fmt.Fprintf(&b, "-- The body %s installs (fingerprint %s).\n%s\n", r.fix.File, r.body.Fingerprint(), r.body.Statement)
		fmt.Fprintf(&b, "        RAISE NOTICE 'restore: %s was %%; installed the fix of %s', v_plan #>> '{%s,definition}';\n    END IF;\n",
			r.function, r.fix.File, r.function)
	}
	b.WriteString(`
    -- What upstream changed in a way no fix of the pack serves yet.
    FOR v_row IN SELECT e.key, e.value ->> 'definition' AS definition FROM jsonb_each(v_plan) e WHERE e.value ->> 'action' = 'left' LOOP
        RAISE NOTICE 'restore: % is %, which upstream changed in a way this pack has no fix for yet: left as it is', v_row.key, v_row.definition;
    END LOOP;
`)
	b.WriteString(`END;
$restore$;
-- +goose StatementEnd
`)
	return b.String()
}

// actionOf is a row's action as the statement names it.
func actionOf(r row) string {
	if r.action == Restore {
		return "install " + r.key()
	}
	return r.action
}

func functionList(fns []fixed) string {
	names := make([]string, len(fns))
	for i, f := range fns {
		names[i] = f.name
		if f.optional {
			names[i] += " (when upstream added it)"
		}
	}
	return strings.Join(names, ", ")
}

func sep(i, n int) string {
	if i < n-1 {
		return ","
	}
	return ""
}

// literal is s as an SQL string literal.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Latest is Script for the pack's latest version: the text of File.
func Latest() string { return Script(migrations.Latest()) }
