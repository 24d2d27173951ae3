// Package restore keeps the pack's fixes in force after duroxide-pg's own
// runner replaced one. That runner runs on every connect of the
// application and applies every upstream migration the database does not
// record yet; a release whose migration redefines a function the pack
// fixes puts upstream's text back, and goose's table, which says the fix
// was applied, does not change. The restore looks at the live definitions,
// not at the history (Flyway's repeatable migrations and sqitch's verify
// scripts are the anchors): for every function a fix migration of the
// pack fixes it identifies the installed definition by fingerprint and
// installs the pack's newest fix for that definition's behaviour, under
// the locks the migration that brought that fix takes, in one transaction.
//
// What it knows is read from sql/ and nowhere else: the definitions each
// fix migration's guard recognises (migrations.KnownDefinitions), and which
// fix serves which upstream behaviour (migrations.FixFor, the files'
// "-- Leaves:" and "-- Behaviour:" lines). Script renders that knowledge as
// one self-deciding SQL statement, the same for `harness migrate up`,
// `harness sql up` and a DBA's psql or stock goose (sql/restore/); Plan
// says, for one schema, what that statement will do.
package restore

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/fingerprint"
)

// What the restore does with one function, by what is installed.
const (
	// InForce: the pack's newest fix (up to the goose version) is installed.
	InForce = "in force"
	// Restore: a definition the pack knows, without that fix: the restore
	// installs it.
	Restore = "restore"
	// Left: a definition the pack knows whose behaviour no fix of the pack
	// serves yet (upstream changed the function in a way the pack has no
	// fix for): left as it is, reported.
	Left = "left"
	// Absent: a function that only an unreleased upstream migration adds,
	// not in this schema: nothing to do.
	Absent = "absent"
	// Unknown: a definition nobody knows, or no single definition (missing,
	// or overloads): the restore refuses and changes nothing.
	Unknown = "unknown"
)

// Function is one function the pack fixes, as the restore sees it in a
// schema.
type Function struct {
	Name string `json:"name"`
	// Action is InForce, Restore, Left, Absent or Unknown.
	Action string `json:"action"`
	// Definition names what is installed ("upstream candidate 0024,
	// port"), Fingerprint its fingerprint (schema name normalised),
	// BehavesAs the upstream behaviour it has; empty for Absent, and for
	// Unknown but the fingerprint.
	Definition  string `json:"definition,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	BehavesAs   int64  `json:"behaves_as,omitempty"`
	// Fix is the file of the fix migration whose body is in force or will
	// be installed; Locks the LOCK TABLE statements the restore takes
	// with it (that migration's).
	Fix   string   `json:"fix,omitempty"`
	Locks []string `json:"locks,omitempty"`
	// Problem says, for Unknown, what is wrong ("no definition", "2
	// definitions", "a definition nobody knows").
	Problem string `json:"problem,omitempty"`
}

// fixed is a function the fixes up to a goose version fix.
type fixed struct {
	name string
	// optional: only an unreleased upstream migration adds it (no port of
	// the pack defines it, no fix of the pack adds it): its absence is
	// normal.
	optional bool
}

// row is one definition the restore recognises, and what it does with it.
type row struct {
	function, fingerprint, definition string
	behavesAs                         int64
	action                            string
	fix                               migrations.Migration
	body                              migrations.Definition
}

// key names the body a restore row installs: its fix's version and the
// body's fingerprint (one fix can hold a body per behaviour).
func (r row) key() string { return fmt.Sprintf("%04d %s", r.fix.Version, r.body.Fingerprint()) }

// functions lists the functions the fix migrations up to goose version
// upTo fix, in the order of those migrations.
func functions(upTo int64) []fixed {
	ported := map[string]bool{}
	for _, m := range migrations.MustPack() {
		for _, d := range m.Definitions {
			if m.IsPort() {
				ported[d.Function] = true
			}
		}
	}
	added := map[string]bool{}
	var out []fixed
	for _, m := range migrations.Fixes() {
		if m.Version > upTo {
			break
		}
		for _, a := range m.Adds {
			if kind, name, _ := strings.Cut(a, " "); kind == "function" {
				added[name] = true
			}
		}
		for _, name := range m.Fixes {
			if !slices.ContainsFunc(out, func(f fixed) bool { return f.name == name }) {
				out = append(out, fixed{name: name})
			}
		}
	}
	for i := range out {
		out[i].optional = !ported[out[i].name] && !added[out[i].name]
	}
	return out
}

// rows is the restore's table for goose version upTo: every definition a
// fix migration's guard knows of each function the fixes up to upTo fix,
// with its action: InForce when it is the body the newest fix up to upTo
// installs for its behaviour, Restore (with that body) when it is another,
// Left when no fix up to upTo serves its behaviour.
func rows(upTo int64) ([]fixed, []row) {
	fns := functions(upTo)
	var out []row
	for _, f := range fns {
		for _, k := range migrations.KnownDefinitions(f.name) {
			r := row{function: f.name, fingerprint: k.Fingerprint, definition: k.Definition, behavesAs: k.BehavesAs, action: Left}
			if fix, body, ok := migrations.FixFor(f.name, k.BehavesAs, upTo); ok {
				r.fix, r.body, r.action = fix, body, Restore
				if body.Fingerprint() == k.Fingerprint {
					r.action = InForce
				}
			}
			out = append(out, r)
		}
	}
	return fns, out
}

// Plan says what the restore for goose version upTo would do in schema:
// for every function the fixes up to upTo fix, the installed definition
// and the action. q reads the catalog (fingerprint.Take).
func Plan(ctx context.Context, q fingerprint.Querier, schema string, upTo int64) ([]Function, error) {
	installed, err := fingerprint.Take(ctx, q, schema)
	if err != nil {
		return nil, err
	}
	fns, table := rows(upTo)
	var out []Function
	for _, f := range fns {
		var found []fingerprint.Function
		for _, fn := range installed {
			if fn.Name == f.name {
				found = append(found, fn)
			}
		}
		fc := Function{Name: f.name}
		switch {
		case len(found) == 0 && f.optional:
			fc.Action = Absent
		case len(found) == 0:
			fc.Action, fc.Problem = Unknown, "no definition"
		case len(found) > 1:
			fc.Action, fc.Problem = Unknown, fmt.Sprintf("%d definitions (overloads)", len(found))
		default:
			fc.Fingerprint = found[0].Normalized
			fc.Action, fc.Problem = Unknown, "a definition nobody knows"
			for _, r := range table {
				if r.function == f.name && found[0].Matches(r.fingerprint) {
					fc.Action, fc.Problem = r.action, ""
					fc.Definition, fc.BehavesAs = r.definition, r.behavesAs
					if r.action != Left {
						fc.Fix, fc.Locks = r.fix.File, r.fix.UpLocks
					}
					break
				}
			}
		}
		out = append(out, fc)
	}
	return out, nil
}

// Refusal is the error of a plan with an Unknown function: what the
// restore (and the statement of Script) refuses, naming each one.
func Refusal(plan []Function) error {
	var bad []string
	for _, f := range plan {
		if f.Action == Unknown {
			what := f.Problem
			if f.Fingerprint != "" {
				what += " (fingerprint " + f.Fingerprint + ")"
			}
			bad = append(bad, f.Name+": "+what)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("restore: %s; nothing was changed: the pack installs its fixes only over definitions it knows (`harness doctor` shows what is installed)",
		strings.Join(bad, "; "))
}

// Pending reports whether plan has a function to restore.
func Pending(plan []Function) bool {
	return slices.ContainsFunc(plan, func(f Function) bool { return f.Action == Restore })
}

// Apply runs the restore for goose version upTo on schema over db, whose
// connections' search_path names schema: in one transaction, under the
// pack's migration lock (the advisory key lockID, which goose's runner of
// the schema holds while it migrates), it reads the plan, refuses
// (Refusal, nothing changed) a function it cannot identify, and runs
// Script(upTo) when a fix is to be restored. It returns the plan it found:
// the functions whose Action is Restore are those it restored.
func Apply(ctx context.Context, db *sql.DB, schema string, upTo, lockID int64) ([]Function, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", lockID); err != nil {
		return nil, fmt.Errorf("restore: take the pack's migration lock: %w", err)
	}
	plan, err := Plan(ctx, tx, schema, upTo)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if err := Refusal(plan); err != nil {
		return plan, err
	}
	if !Pending(plan) {
		return plan, tx.Commit()
	}
	if _, err := tx.ExecContext(ctx, Script(upTo)); err != nil {
		return plan, fmt.Errorf("restore the fixes of schema %s: %w", schema, err)
	}
	if err := tx.Commit(); err != nil {
		return plan, fmt.Errorf("restore the fixes of schema %s: %w", schema, err)
	}
	return plan, nil
}
