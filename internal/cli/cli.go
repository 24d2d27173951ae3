// Package cli is the `harness` command: migrations, throwaway databases and
// the repros, behind one entry point that tests can call in-process.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
)

// Exit codes. doctor's follow the monitoring-plugin convention (0 ok,
// 1 warning, 2 critical); bad input has a code of its own, EX_USAGE of
// sysexits.h, so that monitoring can tell a broken check from a critical
// database.
const (
	exitOK      = 0
	exitFailure = 1 // the command ran and found a problem (e.g. a repro verdict); doctor: warning
	// exitCritical is doctor's "critical" verdict, also given when the
	// database cannot be reached or read.
	exitCritical = 2
	ExitUsage    = 64 // bad input: the message says what to do
)

// exitError ends a command with a given exit code and a one-line message.
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return e.msg }

// usageError is bad input from the user: printed on one line, exit
// ExitUsage.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// unreachableError is a database that cannot be connected to: bad input
// for most commands (check the DSN), a critical state for doctor.
type unreachableError struct{ usage usageError }

func (e unreachableError) Error() string { return e.usage.msg }
func (e unreachableError) Unwrap() error { return e.usage }

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *env, args []string) error
}

// env is what a command writes to.
type env struct {
	Stdout io.Writer
	Stderr io.Writer
}

func commands() []command {
	return []command{
		{"migrate", "apply or roll back migrations, or plan them: migrate up|down|status|version|plan [--to N] [--lock-timeout D] [--dsn DSN | --env NAME] [--schema S]", runMigrate},
		{"db", "throwaway database: db start [--backend auto|local|dsn|docker]", runDB},
		{"sql", "print the SQL migrate would run, for review and psql: sql up|down [--to N] [--dsn DSN | --env NAME] [--schema S] [-o FILE]", runSQL},
		{"baseline", "adopt a database made by duroxide-pg's own runner: baseline [--dsn DSN | --env NAME] [--schema S] [--dry-run] [--force]", runBaseline},
		{"doctor", "health check, exit 0 ok / 1 warning / 2 critical / 64 bad input: doctor [--dsn DSN | --env NAME] [--schema S] [--format text|json|prometheus] [--watch 5s] [--max-attempts 10] [--reset-attempts INSTANCE... [--apply]]", runDoctor},
		{"bench", benchSummary, runBench},
		{"soak", "fault-injection soak, exit 1 on any invariant violation: soak [--duration 5m] [--round 20s] [--dsn DSN] [--version N] [--seed N] [--no-restart] [--json FILE] | soak --runtime [--duration 5m] [--each] [--orchestrations N] [--doc FILE]", runSoak},
		{"repro", "show the bugs before the pack's fixes and the fixes: " + strings.TrimPrefix(reproUsage, "usage: harness "), runRepro},
		{"version", "the pack's version, the sha256 of the migrations built in, and the build: version [--config FILE]", runVersion},
	}
}

// Run executes the command line args (without the program name) and returns
// the process exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	env := &env{Stdout: stdout, Stderr: stderr}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		printHelp(stdout)
		if len(args) == 0 {
			return ExitUsage
		}
		return exitOK
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return report(env, c.run(ctx, env, args[1:]))
		}
	}
	return report(env, usagef("unknown command %q: run `harness help` for the list", args[0]))
}

func report(env *env, err error) int {
	if err == nil {
		return exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	var x exitError
	if errors.As(err, &x) {
		fmt.Fprintln(env.Stderr, "harness: "+oneLine(x.msg))
		return x.code
	}
	var u usageError
	if errors.As(err, &u) {
		fmt.Fprintln(env.Stderr, "harness: "+oneLine(u.msg))
		return ExitUsage
	}
	var f failure
	if errors.As(err, &f) {
		if f.msg != "" {
			fmt.Fprintln(env.Stderr, "harness: "+f.msg)
		}
		return exitFailure
	}
	fmt.Fprintln(env.Stderr, "harness: "+err.Error())
	return exitFailure
}

// failure is a command that ran to the end with a negative verdict.
type failure struct{ msg string }

func (f failure) Error() string { return f.msg }

func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func printHelp(w io.Writer) {
	fmt.Fprintln(w, "harness: duroxide-pg-migrations harness\n\nusage: harness <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nThrowaway work (repro, bench, soak, db) uses an existing server only when named: --dsn or HARNESS_DSN,")
	fmt.Fprintln(w, "never DATABASE_URL; there it creates its own databases and drops only those. migrate, baseline, sql")
	fmt.Fprintln(w, "and doctor work on the --dsn they are given.")
	fmt.Fprintln(w, "\nRun `harness <command> -h` for its flags.")
}

// newFlags makes a flag set that reports errors instead of exiting; -h
// prints its flags to stdout, a bad flag is a one-line usage error.
func newFlags(env *env, name string) *flag.FlagSet {
	fs := flag.NewFlagSet("harness "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(env.Stdout, "usage of %s:\n", fs.Name())
		fs.SetOutput(env.Stdout)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

// parse parses flags, turning flag errors into usage errors; positional
// arguments may come before or after the flags.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usagef("%v (run `%s -h`)", err, fs.Name())
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// obtainServer obtains the throwaway server a command works on: the
// environment's backend, or the existing server of dsn when it is given.
// Failing to get one is a usage error (the message names the ways to get
// one).
func obtainServer(ctx context.Context, dsn string) (*pgtest.Server, error) {
	opts := pgtest.OptionsFromEnv()
	if dsn != "" {
		opts.Backend, opts.DSN = pgtest.DSN, dsn
	}
	return obtainServerWith(ctx, opts)
}

func obtainServerWith(ctx context.Context, opts pgtest.Options) (*pgtest.Server, error) {
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(startCtx, opts)
	if err != nil {
		return nil, usagef("%v", err)
	}
	return srv, nil
}

// migratedDatabase creates a database on srv, its name starting with
// prefix, and migrates schema in it to version (nothing for version 0): the
// database a command that works on one schema runs against. It returns the
// connections to it; the database goes when srv is closed.
func migratedDatabase(ctx context.Context, srv *pgtest.Server, prefix, schema string, version int64) (*dbconn.Source, error) {
	name, err := srv.CreateDatabase(ctx, prefix, "")
	if err != nil {
		return nil, err
	}
	src, err := srv.Source(name)
	if err != nil {
		return nil, err
	}
	if version > 0 {
		if err := migrate.To(ctx, src.Config(), schema, version); err != nil {
			return nil, err
		}
	}
	return src, nil
}
