package lab

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/repro"
	"github.com/duroxide-pg/migrations/internal/sim/settings"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// scenario is one scenario of the lab, a repro (`harness-lab repro NAME`)
// or a bench scenario the lab runs itself (`harness-lab bench --scenarios
// NAME`), in one shape: its name, its settings (its flags with their
// defaults, and their validation), and its run, which prepares what it
// needs in the database it is handed, runs it (on each side, or in each
// round), and returns its outcome: what to print, its verdicts, the
// figures it records, the report it writes. Each is one file; a new one is
// that file and one line in reproScenarios or benchScenarios.
type scenario interface {
	// name is what the command line names it (with dashes).
	name() string
	// summary says what it shows, for the help.
	summary() string
	// register adds the scenario's flags, with their defaults, to fs.
	register(fs *flag.FlagSet)
	// validate checks the parsed flags, whichever scenarios run (chosen:
	// this one does); its error is a usage error.
	validate(chosen bool) error
	// needsUpstream: the run makes databases with the real provider.
	needsUpstream() bool
	// run runs the scenario; on an error the outcome holds what was done
	// before it, which is printed.
	run(ctx context.Context, in *scenarioRun) (outcome, error)
}

// fromUpstream is embedded by the scenarios whose run makes databases
// with the real provider.
type fromUpstream struct{}

func (fromUpstream) needsUpstream() bool { return true }

// scenarioRun is what the command hands a scenario's run.
type scenarioRun struct {
	env *cli.Env
	// srv is the server, db a database of it for the scenario (dbName).
	srv    *pgtest.Server
	dbName string
	db     *dbconn.Source
	// provider is the real provider (nil unless needsUpstream).
	provider *upstream.Provider
	// sides are the repros' --sides; rounds the bench's --rounds.
	sides  []string
	rounds int
	// progress prints one line on stderr.
	progress func(line string)
}

// outcome is what a scenario's run made: its parts, each printed as a
// section of stdout, and a report of its own.
type outcome struct {
	parts []part
	// reportFile is the file write puts into the report directory ("":
	// the scenario records into the command's report instead).
	reportFile string
	// write writes the report into dir; server names the PostgreSQL the
	// scenario ran on.
	write func(dir, server string) error
}

// part is one section of an outcome.
type part struct {
	// print renders the part.
	print func(w io.Writer) error
	// verdict is recorded under key ("": the part has none).
	key string
	ok  bool
	// record puts the part's figures into the repros' report (nil: none).
	record func(r *repro.Report)
}

// table is an outcome that prints text.
func table(text string) part {
	return part{print: func(w io.Writer) error {
		_, err := io.WriteString(w, text)
		return err
	}}
}

// registerSettings fills the zero settings of l with their defaults and
// adds their flags to fs.
func registerSettings(fs *flag.FlagSet, l *settings.List) {
	l.Fill()
	l.Register(fs)
}

// checkIfChosen holds the settings of l to their least values when the
// scenario runs (chosen); its error is a usage error.
func checkIfChosen(chosen bool, l *settings.List) error {
	if !chosen {
		return nil
	}
	return usageOf(l.Check())
}

// usageOf turns a settings error into a usage error.
func usageOf(err error) error {
	if err != nil {
		return cli.Usagef("%v", err)
	}
	return nil
}

// printed is every part of out printed; with sections, apart: a blank
// line before each but the first of the command (*sections counts them).
func printed(w io.Writer, out outcome, sections *int) error {
	for _, p := range out.parts {
		if sections != nil {
			if *sections > 0 {
				fmt.Fprintln(w)
			}
			*sections++
		}
		if err := p.print(w); err != nil {
			return err
		}
	}
	return nil
}
