package lab

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/repro"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// reproSetup is the repros' throwaway database; each repro makes its own
// schemas in it.
type reproSetup struct {
	srv  *pgtest.Server
	name string
	db   *dbconn.Source
}

// setupRepro starts (or borrows, with dsn) a server and creates a
// database.
func setupRepro(ctx context.Context, env *cli.Env, dsn string) (*reproSetup, error) {
	srv, err := obtainServer(ctx, dsn)
	if err != nil {
		return nil, err
	}
	name, err := srv.CreateDatabase(ctx, "harness_repro_", "")
	if err != nil {
		srv.Close(context.Background())
		return nil, err
	}
	db, err := srv.Source(name)
	if err != nil {
		srv.Close(context.Background())
		return nil, err
	}
	fmt.Fprintf(env.Stderr, "%s: %s database %s\n", env.Program, srv.Backend(), name)
	return &reproSetup{srv: srv, name: name, db: db}, nil
}

func (s *reproSetup) close() { _ = s.srv.Close(context.Background()) }

// reproUsage is the repro command's synopsis.
func reproUsage() string {
	return "usage: harness-lab repro [" + strings.Join(append(reproKinds(), "all"), "|") +
		"] [--sides upstream,candidate,pack] [--form held-key|pool|all] [--worker-versions BUG,FIX] [--json FILE] [--report DIR] [--dsn DSN]"
}

// reproScenario is one repro of `harness-lab repro`: its kind (what
// `repro KIND` names), its flags with their defaults, their validation, and
// a run that prints its section and records its result and verdict in the
// report. Each is one file; a new one is that file and one line in
// reproScenarios.
type reproScenario interface {
	kind() string
	// register adds the repro's flags, with their defaults, to fs.
	register(fs *flag.FlagSet)
	// validate checks the parsed flags, whichever repros run (chosen: this
	// one does); its error is a usage error.
	validate(chosen bool) error
	// needsUpstream: the repro makes sides with the real provider.
	needsUpstream() bool
	run(ctx context.Context, in *reproRun) error
}

// reproScenarios are the repros, in the order `all` runs them.
func reproScenarios() []reproScenario {
	pair := &workerPair{}
	return []reproScenario{
		minimalRepro{},
		&organicRepro{},
		&workerMinimalRepro{pair: pair},
		&workerRepro{pair: pair},
		&runtimeRepro{},
	}
}

// reproKinds are the repros' kinds, in the order `all` runs them.
func reproKinds() []string {
	var out []string
	for _, s := range reproScenarios() {
		out = append(out, s.kind())
	}
	return out
}

// reproRun is what every repro's run is handed: the database, the
// provider, the sides, and the report it records into.
type reproRun struct {
	env      *cli.Env
	setup    *reproSetup
	provider *upstream.Provider
	sides    []string
	report   *repro.Report
	progress func(line string)
	sections int
}

// section starts a section of the output: a blank line before every one
// but the first.
func (in *reproRun) section() {
	if in.sections > 0 {
		fmt.Fprintln(in.env.Stdout)
	}
	in.sections++
}

// done ends a section: err, or the printout, then verdict recorded under
// key.
func (in *reproRun) done(key string, verdict bool, err error, print func() error) error {
	if err != nil {
		return err
	}
	if err := print(); err != nil {
		return err
	}
	in.report.Verdict[key] = verdict
	return nil
}

func runRepro(ctx context.Context, env *cli.Env, args []string) error {
	fs := cli.NewFlags(env, "repro")
	dsn := fs.String("dsn", "", "use this existing server (a database is created and dropped) instead of a throwaway one")
	sidesFlag := fs.String("sides", strings.Join(repro.Sides(), ","), fmt.Sprintf("minimal, organic, runtime: the schemas to compare, among %s (upstream's latest as its runner makes it; upstream's candidate fix, port; the pack's latest; the candidate with the amendment offered upstream); upstream and pack are required",
		strings.Join([]string{repro.SideUpstream, repro.SideCandidate, repro.SidePack, repro.SideAmended}, ", ")))
	jsonFile := fs.String("json", "", "write the figures as JSON to this file")
	reportDir := fs.String("report", "", "write a Markdown report (with a histogram of remaining lease) into this directory")
	scenarios := reproScenarios()
	for _, s := range scenarios {
		s.register(fs)
	}
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	which := "all"
	if len(pos) > 1 {
		return cli.Usagef("%s", reproUsage())
	}
	if len(pos) == 1 {
		which = pos[0]
	}
	kinds := reproKinds()
	if which != "all" && !slices.Contains(kinds, which) {
		return cli.Usagef("unknown repro %q: use %s or all", which, strings.Join(kinds, ", "))
	}
	var chosen []reproScenario
	for _, s := range scenarios {
		if err := s.validate(which == "all" || which == s.kind()); err != nil {
			return err
		}
		if which == "all" || which == s.kind() {
			chosen = append(chosen, s)
		}
	}
	sides, err := parseSides(*sidesFlag)
	if err != nil {
		return err
	}
	var provider *upstream.Provider
	if slices.ContainsFunc(chosen, reproScenario.needsUpstream) {
		// Upstream's side, and its candidate's, are made by the real
		// provider.
		if provider, err = upstream.Find(); err != nil {
			return fmt.Errorf("repro: %w", err)
		}
	}
	setup, err := setupRepro(ctx, env, *dsn)
	if err != nil {
		return err
	}
	defer setup.close()

	report := repro.Report{Verdict: map[string]bool{}}
	in := &reproRun{env: env, setup: setup, provider: provider, sides: sides, report: &report,
		progress: func(line string) { fmt.Fprintln(env.Stderr, env.Program+": "+line) }}
	for _, s := range chosen {
		if err := s.run(ctx, in); err != nil {
			return err
		}
	}
	if *reportDir != "" {
		if err := report.Write(*reportDir); err != nil {
			return err
		}
		fmt.Fprintf(env.Stderr, "%s: report written to %s\n", env.Program, filepath.Join(*reportDir, repro.ReportFile))
	}
	if *jsonFile != "" {
		if err := report.WriteJSON(*jsonFile); err != nil {
			return err
		}
	}
	if !report.OK() {
		return cli.Failure{Msg: "the repro did not show what it should (see the verdicts above)"}
	}
	return nil
}

// parseSides reads --sides: known keys, each once, upstream's and the
// pack's among them.
func parseSides(s string) ([]string, error) {
	known := []string{repro.SideUpstream, repro.SideCandidate, repro.SidePack, repro.SideAmended}
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if !slices.Contains(known, f) || slices.Contains(out, f) {
			return nil, cli.Usagef("--sides %q: give each of %s at most once", s, strings.Join(known, ", "))
		}
		out = append(out, f)
	}
	if !slices.Contains(out, repro.SideUpstream) || !slices.Contains(out, repro.SidePack) {
		return nil, cli.Usagef("--sides %q: the verdicts compare upstream's side with the pack's; give both", s)
	}
	return out, nil
}
