package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/duroxide-pg/migrations/harness/ops/baseline"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
)

// runBaseline adopts a database created by duroxide-pg's own runner: see
// package baseline.
func runBaseline(ctx context.Context, env *Env, args []string) error {
	fs := NewFlags(env, "baseline")
	var t target
	t.register(fs)
	dryRun := fs.Bool("dry-run", false, "check and print what would be done; change nothing")
	force := fs.Bool("force", false, "proceed past what baseline cannot vouch for (unknown function bodies, newer upstream rows, a disagreeing goose table) and list it")
	pos, err := Parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return Usagef("baseline takes no arguments, got %q (e.g. `harness baseline --dsn DSN --schema duroxide --dry-run`)", pos[0])
	}
	if err := t.resolve(env); err != nil {
		return err
	}
	db, err := t.connect(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	if !*dryRun {
		// baseline writes goose's table: it must belong to the owner of the
		// rest, as what migrate up creates later will.
		if err := migrate.CheckOwner(ctx, db, t.schema); err != nil {
			return Failure{Msg: "baseline refused: " + err.Error()}
		}
	}
	res, err := baseline.Run(ctx, db, baseline.Options{
		Schema:       t.schema,
		VersionTable: t.cfg.VersionTable,
		DryRun:       *dryRun,
		Force:        *force,
	})
	var refusal *baseline.Refusal
	if errors.As(err, &refusal) {
		fmt.Fprintln(env.Stdout, "baseline refused: "+refusal.Error())
		return Failure{Msg: "baseline refused: " + refusal.Reason}
	}
	if err != nil {
		return Failure{Msg: "baseline: " + pgErrText(err)}
	}
	fmt.Fprintf(env.Stdout, "schema %s:\n", res.Schema)
	for _, l := range res.Lines {
		fmt.Fprintln(env.Stdout, "  "+l)
	}
	if len(res.Unvouched) > 0 {
		fmt.Fprintln(env.Stdout, "--force: proceeded without vouching for:")
		for _, u := range res.Unvouched {
			fmt.Fprintln(env.Stdout, "  "+u)
		}
	}
	if len(res.Plan) > 0 {
		fmt.Fprintf(env.Stdout, "then `harness migrate up --schema %s` would:\n", res.Schema)
		for _, p := range res.Plan {
			fmt.Fprintln(env.Stdout, "  "+p)
		}
	}
	switch {
	case res.DryRun && res.Changed:
		fmt.Fprintf(env.Stdout, "run again without --dry-run to record goose versions 1..%d\n", res.Baseline)
	case res.Changed:
		fmt.Fprintf(env.Stdout, "baselined at goose version %d (upstream %d)\n", res.Baseline, res.State)
	}
	return nil
}
