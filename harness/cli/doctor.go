package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/duroxide-pg/migrations/harness/doctor"
)

// runDoctor checks a duroxide schema (package doctor). Exit codes, for
// monitoring: 0 ok, 1 warning, 2 critical (also when the database cannot be
// reached or read: an unknown state is treated as critical), 64 bad input.
func runDoctor(ctx context.Context, env *Env, args []string) error {
	fs := newFlags(env, "doctor")
	var t target
	t.register(fs)
	asJSON := fs.Bool("json", false, "print the report as JSON (for monitoring)")
	maxAttempts := fs.Int("max-attempts", 10, "report orchestrator messages fetched more than this many times")
	reset := fs.Bool("reset-attempts", false, "set attempt_count = 0 on every orchestrator message of the INSTANCE arguments (dry run unless --apply)")
	apply := fs.Bool("apply", false, "with --reset-attempts: really reset")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case *reset && len(pos) == 0:
		return usagef("--reset-attempts needs instance ids: `harness doctor --dsn DSN --reset-attempts INSTANCE... [--apply]`")
	case !*reset && len(pos) > 0:
		return usagef("unexpected argument %q: instance ids only go with --reset-attempts", pos[0])
	case *apply && !*reset:
		return usagef("--apply only goes with --reset-attempts")
	case *maxAttempts < 1:
		return usagef("--max-attempts must be at least 1, got %d", *maxAttempts)
	}
	if err := t.resolve(); err != nil {
		return err
	}
	db, err := t.connect(ctx)
	var unreachable unreachableError
	if errors.As(err, &unreachable) {
		if *asJSON {
			_ = json.NewEncoder(env.Stdout).Encode(map[string]string{"schema": t.schema, "status": doctor.Critical, "error": unreachable.Error()})
		}
		return exitError{code: ExitCritical, msg: "doctor: critical: " + unreachable.Error()}
	}
	if err != nil {
		return err
	}
	defer db.Close()

	if *reset {
		rows, missing, err := doctor.ResetAttempts(ctx, db, t.schema, pos, *apply)
		if err != nil {
			return failure{msg: "doctor: reset attempts: " + pgErrText(err)}
		}
		fns, _ := doctor.Functions(ctx, db, t.schema)
		if *asJSON {
			enc := json.NewEncoder(env.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(map[string]any{"applied": *apply, "instances": rows, "missing": missing})
		}
		tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "INSTANCE\tMESSAGES\tMAX ATTEMPTS (before)\n")
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%d\t%d\n", r.InstanceID, r.Messages, r.MaxAttemptCount)
		}
		_ = tw.Flush()
		if len(missing) > 0 {
			fmt.Fprintf(env.Stdout, "no orchestrator message for: %s\n", strings.Join(missing, ", "))
		}
		n := int64(0)
		for _, r := range rows {
			n += r.Messages
		}
		if *apply {
			fmt.Fprintf(env.Stdout, "reset attempt_count to 0 on %d message(s)\n", n)
		} else {
			fmt.Fprintf(env.Stdout, "dry run: would reset attempt_count to 0 on %d message(s); nothing changed; add --apply to do it\n", n)
		}
		if !doctor.AllFixed(fns) {
			fmt.Fprintln(env.Stdout, "note: not every function the pack fixes has its fix here: reset messages can be trapped again; run `harness doctor` for details")
		}
		return nil
	}

	rep, err := doctor.Check(ctx, db, doctor.Options{Schema: t.schema, VersionTable: t.cfg.VersionTable, MaxAttempts: *maxAttempts})
	if err != nil {
		msg := "doctor: cannot check schema " + t.schema + ": " + pgErrText(err)
		if *asJSON {
			enc := json.NewEncoder(env.Stdout)
			_ = enc.Encode(map[string]string{"schema": t.schema, "status": doctor.Critical, "error": msg})
		}
		return exitError{code: ExitCritical, msg: msg}
	}
	if *asJSON {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		rep.Render(env.Stdout)
	}
	switch rep.Status {
	case doctor.Critical:
		return exitError{code: ExitCritical, msg: "doctor: critical: " + worst(rep, doctor.Critical)}
	case doctor.Warning:
		return failure{msg: "doctor: warning: " + worst(rep, doctor.Warning)}
	}
	return nil
}

func worst(rep *doctor.Report, sev string) string {
	var msgs []string
	for _, f := range rep.Findings {
		if f.Severity == sev {
			msgs = append(msgs, f.Check)
		}
	}
	return strings.Join(msgs, ", ")
}
