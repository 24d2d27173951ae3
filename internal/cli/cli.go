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
)

// Exit codes. doctor's follow the monitoring-plugin convention (0 ok,
// 1 warning, 2 critical); bad input has a code of its own, EX_USAGE of
// sysexits.h, so that monitoring can tell a broken check from a critical
// database; and so has a server that refused the connection or could not
// be reached, EX_UNAVAILABLE, for every command but doctor (which says
// critical, its monitoring contract).
const (
	ExitOK      = 0
	ExitFailure = 1 // the command ran and found a problem (e.g. a repro verdict); doctor: warning
	// exitCritical is doctor's "critical" verdict, also given when the
	// database cannot be reached or read.
	exitCritical = 2
	ExitUsage    = 64 // bad input: the message says what to do
	// ExitUnavailable: the server refused the connection or could not be
	// reached (doctor: exitCritical).
	ExitUnavailable = 69
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

func Usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// unreachableError is a database that refused the connection or could not
// be reached: ExitUnavailable for most commands, a critical state for
// doctor.
type unreachableError struct{ msg string }

func (e unreachableError) Error() string { return e.msg }

// Command is one subcommand of a program.
type Command struct {
	Name    string
	Summary string
	Run     func(ctx context.Context, env *Env, args []string) error
}

// Env is what a command writes to, and the name of the program it runs
// in (the prefix of its messages and of its flags' usage).
type Env struct {
	Program string
	Stdout  io.Writer
	Stderr  io.Writer
}

// Program is a command line: its name, its subcommands, and the text help
// prints after their list.
type Program struct {
	Name     string
	Commands []Command
	Notes    string
	// Moved are commands another program now has, by name: what to run
	// instead, for the refusal.
	Moved map[string]string
}

// operator is the `harness` command: what a DBA runs against a database
// they name. It links no throwaway server and no test code; the lab
// command (package lab) has those.
func operator() Program {
	p := Program{
		Name: "harness",
		Commands: []Command{
			{"migrate", "apply or roll back migrations, or plan them: migrate up|down|status|version|plan [--to N] [--lock-timeout D] [--dsn DSN | --env NAME] [--schema S]", runMigrate},
			{"sql", "print the SQL migrate would run, for review and psql: sql up|down [--to N] [--lock-timeout D] [--dsn DSN | --env NAME] [--schema S] [-o FILE], or the restore step alone: sql restore [--to N] [-o FILE]", runSQL},
			{"baseline", "adopt a database made by duroxide-pg's own runner: baseline [--dsn DSN | --env NAME] [--schema S] [--dry-run] [--force]", runBaseline},
			{"doctor", "health check, exit 0 ok / 1 warning / 2 critical / 64 bad input: doctor [--dsn DSN | --env NAME] [--schema S] [--format text|json|prometheus] [--watch 5s] [--max-attempts 10] [--reset-attempts INSTANCE... [--apply]]", runDoctor},
			{"version", "the pack's version, the sha256 of the migrations built in, and the build: version [--config FILE]", runVersion},
		},
		Notes: "migrate, baseline, sql and doctor work on the --dsn they are given, and on nothing else.\n\n" +
			"Throwaway servers, the repros, the benches and the soaks are the lab command's:\n" +
			"go run ./harness/cmd/harness-lab help",
		Moved: map[string]string{},
	}
	// The lab's commands were the operator's until the split: a `harness
	// repro` from an older script is told where the command went.
	for _, name := range []string{"db", "bench", "soak", "repro"} {
		p.Moved[name] = "go run ./harness/cmd/harness-lab " + name + " (or bin/harness-lab " + name + ")"
	}
	return p
}

// Run executes the operator command line args (without the program name)
// and returns the process exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return Main(ctx, operator(), args, stdout, stderr)
}

// Main executes the command line args of prog (without the program name)
// and returns the process exit code.
func Main(ctx context.Context, prog Program, args []string, stdout, stderr io.Writer) int {
	env := &Env{Program: prog.Name, Stdout: stdout, Stderr: stderr}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		printHelp(stdout, prog)
		if len(args) == 0 {
			return ExitUsage
		}
		return ExitOK
	}
	for _, c := range prog.Commands {
		if c.Name == args[0] {
			return report(env, c.Run(ctx, env, args[1:]))
		}
	}
	if instead, ok := prog.Moved[args[0]]; ok {
		return report(env, Usagef("%s is not a command of %s: run `%s`", args[0], prog.Name, instead))
	}
	return report(env, Usagef("unknown command %q: run `%s help` for the list", args[0], prog.Name))
}

func report(env *Env, err error) int {
	if err == nil {
		return ExitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	prefix := env.Program + ": "
	var x exitError
	if errors.As(err, &x) {
		fmt.Fprintln(env.Stderr, prefix+oneLine(x.msg))
		return x.code
	}
	var down unreachableError
	if errors.As(err, &down) {
		fmt.Fprintln(env.Stderr, prefix+oneLine(down.msg))
		return ExitUnavailable
	}
	var u usageError
	if errors.As(err, &u) {
		fmt.Fprintln(env.Stderr, prefix+oneLine(u.msg))
		return ExitUsage
	}
	var f Failure
	if errors.As(err, &f) {
		if f.Msg != "" {
			fmt.Fprintln(env.Stderr, prefix+f.Msg)
		}
		return ExitFailure
	}
	fmt.Fprintln(env.Stderr, prefix+err.Error())
	return ExitFailure
}

// Failure is a command that ran to the end with a negative verdict: exit
// 1, Msg on stderr.
type Failure struct{ Msg string }

func (f Failure) Error() string { return f.Msg }

func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func printHelp(w io.Writer, prog Program) {
	fmt.Fprintf(w, "%[1]s: duroxide-pg-migrations %[1]s\n\nusage: %[1]s <command> [flags]\n\ncommands:\n", prog.Name)
	for _, c := range prog.Commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.Name, c.Summary)
	}
	if prog.Notes != "" {
		fmt.Fprintln(w, "\n"+prog.Notes)
	}
	fmt.Fprintf(w, "\nRun `%s <command> -h` for its flags.\n", prog.Name)
}

// NewFlags makes a flag set that reports errors instead of exiting; -h
// prints its flags to stdout, a bad flag is a one-line usage error.
func NewFlags(env *Env, name string) *flag.FlagSet {
	fs := flag.NewFlagSet(env.Program+" "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(env.Stdout, "usage of %s:\n", fs.Name())
		fs.SetOutput(env.Stdout)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

// Parse parses flags, turning flag errors into usage errors; positional
// arguments may come before or after the flags.
func Parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, Usagef("%v (run `%s -h`)", err, fs.Name())
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}
