package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/duroxide-pg/migrations/harness/ops/doctor"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
)

// runDoctor checks a duroxide schema (package doctor). Exit codes, for
// monitoring: 0 ok, 1 warning, 2 critical (also when the database cannot be
// reached or read: an unknown state is treated as critical), 64 bad input.
func runDoctor(ctx context.Context, env *Env, args []string) error {
	err := doctorCommand(ctx, env, args)
	var u usageError
	if errors.As(err, &u) {
		if schema, ok := prometheusAsked(args); ok {
			// A monitoring job must not go silent on its own bad input: the
			// metrics say critical, the exit status says bad input.
			_ = (&doctor.Report{Schema: schema, Status: doctor.Critical}).WritePrometheus(env.Stdout)
		}
	}
	return err
}

// prometheusAsked reports whether args ask for --format prometheus,
// read word by word (they may not parse), and the schema they name
// (migrate.DefaultSchema when none).
func prometheusAsked(args []string) (schema string, ok bool) {
	schema = migrate.DefaultSchema
	for i, a := range args {
		name, value, inline := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") {
			continue
		}
		if !inline && i+1 < len(args) {
			value = args[i+1]
		}
		switch name {
		case "format":
			ok = ok || value == "prometheus"
		case "schema":
			schema = value
		}
	}
	return schema, ok
}

func doctorCommand(ctx context.Context, env *Env, args []string) error {
	fs := NewFlags(env, "doctor")
	var t target
	t.register(fs)
	format := fs.String("format", "text", "output: text, json, or prometheus (the text exposition format, for node_exporter's textfile collector)")
	asJSONFlag := fs.Bool("json", false, "the same as --format json")
	maxAttempts := fs.Int("max-attempts", 10, "report orchestrator messages fetched more than this many times")
	reset := fs.Bool("reset-attempts", false, "set attempt_count = 0 on every orchestrator message and worker item of the INSTANCE arguments (dry run unless --apply)")
	apply := fs.Bool("apply", false, "with --reset-attempts: really reset")
	listLimit := fs.Int("list-limit", doctor.DefaultListLimit, "list at most this many instances per finding (trapped messages, expired leases, orphan locks), the worst first; 0: every one")
	watch := fs.Duration("watch", 0, "check again every INTERVAL (e.g. 5s) until Ctrl-C, on one line that updates in place")
	pos, err := Parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case *reset && len(pos) == 0:
		return Usagef("--reset-attempts needs instance ids: `harness doctor --dsn DSN --reset-attempts INSTANCE... [--apply]`")
	case !*reset && len(pos) > 0:
		return Usagef("unexpected argument %q: instance ids only go with --reset-attempts", pos[0])
	case *apply && !*reset:
		return Usagef("--apply only goes with --reset-attempts")
	case *listLimit < 0:
		return Usagef("--list-limit must be 0 (every instance) or more, got %d", *listLimit)
	case *maxAttempts < 1:
		return Usagef("--max-attempts must be at least 1, got %d", *maxAttempts)
	case *format != "text" && *format != "json" && *format != "prometheus":
		return Usagef("--format %q: use text, json or prometheus", *format)
	case *asJSONFlag && *format == "prometheus":
		return Usagef("--json and --format prometheus: choose one")
	case *reset && *format == "prometheus":
		return Usagef("--format prometheus does not go with --reset-attempts")
	case *watch < 0 || (*watch > 0 && *watch < 100*time.Millisecond):
		return Usagef("--watch %v: give an interval of at least 100ms, e.g. --watch 5s", *watch)
	case *watch > 0 && (*format != "text" || *asJSONFlag || *reset):
		return Usagef("--watch prints one line for a shell: it does not go with --format, --json or --reset-attempts")
	}
	if *asJSONFlag {
		*format = "json"
	}
	asJSON := *format == "json"
	// unavailable reports a database doctor could not check: critical, in
	// the output format asked for.
	unavailable := func(msg string) error {
		switch *format {
		case "json":
			_ = json.NewEncoder(env.Stdout).Encode(map[string]string{"schema": t.schema, "status": doctor.Critical, "error": msg})
		case "prometheus":
			_ = (&doctor.Report{Schema: t.schema, Status: doctor.Critical}).WritePrometheus(env.Stdout)
		}
		return exitError{code: exitCritical, msg: msg}
	}
	if err := t.resolve(env); err != nil {
		return err
	}
	db, err := t.connectQualified(ctx)
	var unreachable unreachableError
	if errors.As(err, &unreachable) {
		return unavailable("doctor: critical: " + unreachable.Error())
	}
	if err != nil {
		return err
	}
	defer db.Close()

	if *reset {
		rows, missing, err := doctor.ResetAttempts(ctx, db, t.schema, pos, *apply)
		if err != nil {
			return Failure{Msg: "doctor: reset attempts: " + pgErrText(err)}
		}
		fns, _ := doctor.Functions(ctx, db, t.schema)
		if asJSON {
			enc := json.NewEncoder(env.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(map[string]any{"applied": *apply, "instances": rows, "missing": missing})
		}
		tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "INSTANCE\tMESSAGES\tMAX ATTEMPTS (before)\tWORKER ITEMS\tWORKER MAX ATTEMPTS (before)\n")
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", r.InstanceID, r.Messages, r.MaxAttemptCount, r.WorkerItems, r.WorkerMaxAttemptCount)
		}
		_ = tw.Flush()
		if len(missing) > 0 {
			fmt.Fprintf(env.Stdout, "no orchestrator message or worker item for: %s\n", strings.Join(missing, ", "))
		}
		n, items := int64(0), int64(0)
		for _, r := range rows {
			n, items = n+r.Messages, items+r.WorkerItems
		}
		if *apply {
			fmt.Fprintf(env.Stdout, "reset attempt_count to 0 on %d message(s) and %d worker item(s)\n", n, items)
		} else {
			fmt.Fprintf(env.Stdout, "dry run: would reset attempt_count to 0 on %d message(s) and %d worker item(s); nothing changed; add --apply to do it\n", n, items)
		}
		if !doctor.AllFixed(fns) {
			fmt.Fprintln(env.Stdout, "note: not every function the pack fixes has its fix here: reset messages can be trapped again; run `harness doctor` for details")
		}
		return nil
	}

	opts := doctor.Options{Schema: t.schema, VersionTable: t.cfg.VersionTable, MaxAttempts: *maxAttempts, ListLimit: *listLimit}
	if *listLimit == 0 {
		opts.ListLimit = -1
	}
	if *watch > 0 {
		// Ctrl-C ends the watch: the last line is finished and the exit
		// code is the last check's, not the signal's.
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
		return watchDoctor(ctx, env, db, opts, *watch)
	}
	rep, err := doctor.Check(ctx, db, opts)
	if err != nil {
		return unavailable("doctor: cannot check schema " + t.schema + ": " + pgErrText(err))
	}
	switch *format {
	case "json":
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	case "prometheus":
		if err := rep.WritePrometheus(env.Stdout); err != nil {
			return err
		}
	default:
		rep.Render(env.Stdout)
	}
	return verdict(rep)
}

// verdict is the error (and so the exit code) of a doctor report.
func verdict(rep *doctor.Report) error {
	switch rep.Status {
	case doctor.Critical:
		return exitError{code: exitCritical, msg: "doctor: critical: " + worst(rep, doctor.Critical)}
	case doctor.Warning:
		return Failure{Msg: "doctor: warning: " + worst(rep, doctor.Warning)}
	}
	return nil
}

// watchDoctor checks every interval until ctx ends (Ctrl-C), rewriting one
// line: the time, the status, and what changed it. It ends with a newline
// and the exit code of the last check.
func watchDoctor(ctx context.Context, env *Env, db doctor.Querier, opts doctor.Options, interval time.Duration) error {
	var last *doctor.Report
	for checks := 1; ; checks++ {
		rep, err := doctor.Check(ctx, db, opts)
		if ctx.Err() != nil {
			break
		}
		line := ""
		if err != nil {
			rep = &doctor.Report{Schema: opts.Schema, Status: doctor.Critical}
			line = "cannot check: " + oneLine(pgErrText(err))
		} else {
			line = watchLine(rep)
		}
		last = rep
		fmt.Fprintf(env.Stdout, "\r%s  %s  %s  (check %d, every %v; Ctrl-C to stop)\033[K",
			time.Now().Format("15:04:05"), strings.ToUpper(rep.Status), line, checks, interval)
		select {
		case <-ctx.Done():
		case <-time.After(interval):
			continue
		}
		break
	}
	fmt.Fprintln(env.Stdout)
	if last == nil {
		return nil
	}
	return verdict(last)
}

// watchLine is a report on one line: what is not ok, or the figures.
func watchLine(rep *doctor.Report) string {
	var bad []string
	for _, f := range rep.Findings {
		if f.Severity != doctor.OK {
			bad = append(bad, f.Check)
		}
	}
	fixed := 0
	for _, f := range rep.Functions {
		if f.Verdict == doctor.Fixed {
			fixed++
		}
	}
	s := fmt.Sprintf("fixed %d/%d, max attempt_count %d, trapped %d, skew %+d ms", fixed, len(rep.Functions), rep.MaxAttemptCount, rep.TrappedMessages, rep.ClockSkewMs)
	if len(bad) > 0 {
		s = "check " + strings.Join(bad, ", ") + "; " + s
	}
	return s
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
