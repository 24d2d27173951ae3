package repro

// The upgrade repro: what a duroxide-pg upgrade does to a database the
// pack fixed, and what one `harness migrate up` does about it. A schema
// the real provider made is adopted at the pack's latest (baseline,
// migrate up); then a duroxide-pg release carrying upstream's candidate fix
// connects, and its runner (which runs on every connect) applies the
// candidate's file over the pack's fetch (our port, applied as that runner
// applies a file); then one migrate up. At each step: doctor, and the
// seed's reproduction A (a fetch with p_now_ms 10 s stale and a 5 s lock
// timeout: the lease left at return by the database clock).

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/baseline"
	"github.com/duroxide-pg/migrations/harness/ops/doctor"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/harness/ops/restore"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// upgradeFunction is the function the upgrade repro's release redefines.
const upgradeFunction = "fetch_orchestration_item"

// UpgradeStep is the database at one step of the upgrade.
type UpgradeStep struct {
	Step string `json:"step"`
	// Doctor is doctor's status, Verdict and Definition its verdict on
	// the function the release redefines and what it found installed.
	Doctor     string `json:"doctor"`
	Verdict    string `json:"verdict"`
	Definition string `json:"definition"`
	// LeaseLeftMs is reproduction A's lease at return (database clock).
	LeaseLeftMs int64 `json:"lease_left_ms"`
	// Restored are the fixes migrate up put back (the last step).
	Restored []string `json:"restored,omitempty"`
}

// UpgradeResult is the upgrade repro's outcome.
type UpgradeResult struct {
	Addon  string        `json:"addon"`
	Schema string        `json:"schema"`
	File   string        `json:"file"`
	Steps  []UpgradeStep `json:"steps"`
}

// OK is the verdict: fixed before the upgrade (doctor OK, a live lease),
// broken after it (doctor warns that the runner replaced the fix, a dead
// lease), fixed after one migrate up (it restored the fix, doctor OK, a
// live lease).
func (r UpgradeResult) OK() bool {
	if len(r.Steps) != 3 {
		return false
	}
	before, after, up := r.Steps[0], r.Steps[1], r.Steps[2]
	return before.Doctor == doctor.OK && before.Verdict == doctor.Fixed && before.LeaseLeftMs > 0 &&
		after.Doctor == doctor.Warning && after.Verdict == doctor.Replaced && after.LeaseLeftMs <= 0 &&
		up.Doctor == doctor.OK && up.Verdict == doctor.Fixed && up.LeaseLeftMs > 0 && len(up.Restored) == 1 && up.Restored[0] == upgradeFunction
}

// UpgradeRepro runs the upgrade repro in schema upgrade of src's database.
func UpgradeRepro(ctx context.Context, src *dbconn.Source, p *upstream.Provider, progress func(string)) (UpgradeResult, error) {
	progress = quiet(progress)
	res := UpgradeResult{Addon: upstream.AddonPackage, Schema: "upgrade", File: upstream.InFlightCandidate}
	if p == nil {
		return res, fmt.Errorf("upgrade repro: needs the real duroxide-pg provider (%s)", upstream.AddonPackage)
	}
	db := stdlib.OpenDB(*src.Config())
	defer db.Close()
	fail := func(what string, err error) (UpgradeResult, error) {
		return res, fmt.Errorf("upgrade repro: %s: %w", what, err)
	}
	progress(fmt.Sprintf("upgrade repro: schema %s made by the real provider, adopted (baseline, migrate up)", res.Schema))
	if err := p.Migrate(ctx, src, res.Schema); err != nil {
		return fail("the real provider", err)
	}
	if _, err := baseline.Run(ctx, db, baseline.Options{Schema: res.Schema}); err != nil {
		return fail("baseline", err)
	}
	r, err := migrate.Open(ctx, src.Config(), migrate.Options{Schema: res.Schema})
	if err != nil {
		return fail("migrate", err)
	}
	defer r.Close()
	if _, err := r.Up(ctx); err != nil {
		return fail("migrate up", err)
	}
	step := func(name string) error {
		s, err := upgradeStep(ctx, db, src, res.Schema, name)
		res.Steps = append(res.Steps, s)
		return err
	}
	if err := step(fmt.Sprintf("adopted at the pack's latest (goose %d)", migrations.Latest())); err != nil {
		return fail("before the upgrade", err)
	}
	progress(fmt.Sprintf("upgrade repro: duroxide-pg's runner applies %s", res.File))
	if err := upstream.ApplyInFlight(ctx, src, res.Schema, res.File); err != nil {
		return fail("the upgrade", err)
	}
	if err := step("after duroxide-pg's runner applied " + res.File); err != nil {
		return fail("after the upgrade", err)
	}
	progress("upgrade repro: harness migrate up")
	if _, err := r.Up(ctx); err != nil {
		return fail("migrate up after the upgrade", err)
	}
	var restored []string
	for _, f := range r.Restored() {
		if f.Action == restore.Restore {
			restored = append(restored, f.Name)
		}
	}
	if err := step("after one harness migrate up"); err != nil {
		return fail("after migrate up", err)
	}
	res.Steps[len(res.Steps)-1].Restored = restored
	return res, nil
}

// upgradeStep reads doctor, then runs reproduction A on a new instance and
// takes that instance back out (its rows would be findings of the next
// step's doctor: an expired lease, a message).
func upgradeStep(ctx context.Context, db *sql.DB, src *dbconn.Source, schema, name string) (UpgradeStep, error) {
	s := UpgradeStep{Step: name}
	rep, err := doctor.Check(ctx, db, doctor.Options{Schema: schema})
	if err != nil {
		return s, err
	}
	s.Doctor = rep.Status
	for _, f := range rep.Functions {
		if f.Name == upgradeFunction {
			s.Verdict, s.Definition = f.Verdict, f.Definition
		}
	}
	conn, err := src.Connect(ctx)
	if err != nil {
		return s, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	a, err := Minimal(ctx, conn, schema, 0, MinimalConfig{})
	if err != nil {
		return s, err
	}
	if !a.Fetched {
		return s, fmt.Errorf("reproduction A fetched nothing")
	}
	s.LeaseLeftMs = a.RemainingMs
	for _, table := range []string{"instance_locks", "orchestrator_queue", "history", "executions", "instances"} {
		if _, err := conn.Exec(ctx, "DELETE FROM "+pgx.Identifier{schema, table}.Sanitize()+" WHERE instance_id = $1", a.Instance); err != nil {
			return s, fmt.Errorf("take reproduction A's instance out: %w", err)
		}
	}
	return s, nil
}

// PrintUpgrade writes what the upgrade repro is, its steps and its verdict.
func PrintUpgrade(w io.Writer, r UpgradeResult) error {
	fmt.Fprintf(w, "upgrade repro: a schema the real provider (%s) made, adopted at the pack's latest; then a duroxide-pg release carrying upstream's candidate fix connects and its runner applies %s over the pack's fetch; then one `harness migrate up`. Reproduction A at each step: a fetch with p_now_ms 10 s stale and a 5 s lock timeout, the lease left at return by the database clock\n\n",
		r.Addon, r.File)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "step\tdoctor\t%s\tlease left at return\n", upgradeFunction)
	for _, s := range r.Steps {
		line := fmt.Sprintf("%s\t%s\t%s: %s\t%+d ms", s.Step, strings.ToUpper(s.Doctor), s.Verdict, s.Definition, s.LeaseLeftMs)
		if len(s.Restored) > 0 {
			line += "\t(restored the fix of " + strings.Join(s.Restored, ", ") + ")"
		}
		fmt.Fprintln(tw, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	verdict := "the upgrade takes the fix away (the bug is back), and one migrate up brings it back"
	if !r.OK() {
		verdict = "NOT SHOWN: " + verdict + " (see the steps)"
	}
	_, err := fmt.Fprintf(w, "\nverdict: %s\n", verdict)
	return err
}

// upgradeMarkdown renders r as a Markdown section: the table in a code
// block.
func upgradeMarkdown(r UpgradeResult) string {
	var b strings.Builder
	b.WriteString("## A duroxide-pg upgrade, and one migrate up (upgrade repro)\n\n```\n")
	_ = PrintUpgrade(&b, r)
	b.WriteString("```\n")
	return b.String()
}
