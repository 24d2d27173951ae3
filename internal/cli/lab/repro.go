package lab

import (
	"context"
	"fmt"
	"io"
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

// reproScenarios are the repros, in the order `all` runs them.
func reproScenarios() []scenario {
	pair := &workerPair{}
	return []scenario{
		minimalRepro{},
		&organicRepro{},
		&workerMinimalRepro{pair: pair},
		&workerRepro{pair: pair},
		&runtimeRepro{},
		upgradeRepro{},
	}
}

// reproKinds are the repros' names, in the order `all` runs them.
func reproKinds() []string {
	var out []string
	for _, s := range reproScenarios() {
		out = append(out, s.name())
	}
	return out
}

// judged is a repro's result: it says whether it showed what it should.
type judged interface{ OK() bool }

// reproPart is a repro's part: res (unless err) printed, its verdict under
// key, res recorded into the report.
func reproPart[R judged](key string, res R, err error, print func(io.Writer, R) error, record func(*repro.Report, R)) (part, error) {
	if err != nil {
		return part{}, err
	}
	return part{key: key, ok: res.OK(),
		print:  func(w io.Writer) error { return print(w, res) },
		record: func(r *repro.Report) { record(r, res) }}, nil
}

// onePart is the outcome of a repro of one part.
func onePart(p part, err error) (outcome, error) {
	if err != nil {
		return outcome{}, err
	}
	return outcome{parts: []part{p}}, nil
}

func runRepro(ctx context.Context, env *cli.Env, args []string) error {
	fs := cli.NewFlags(env, "repro")
	dsn := fs.String("dsn", "", "use this existing server (a database is created and dropped) instead of a throwaway one")
	sidesFlag := fs.String("sides", strings.Join(repro.Sides(), ","), fmt.Sprintf("minimal, organic, runtime: the schemas to compare, among %s (upstream's latest as its runner makes it; upstream's candidate fix, port; the pack's latest; the candidate with the amendment offered upstream); upstream and pack are required",
		strings.Join([]string{repro.SideUpstream, repro.SideCandidate, repro.SidePack, repro.SideAmended}, ", ")))
	jsonFile := fs.String("json", "", "write the figures as JSON to this file")
	reportDir := fs.String("report", "", "write a Markdown report (with a histogram of remaining lease) into this directory")
	scenarios := reproScenarios()
	flagsUsage := fs.Usage
	fs.Usage = func() {
		fmt.Fprintln(env.Stdout, reproUsage())
		for _, s := range scenarios {
			fmt.Fprintf(env.Stdout, "  %-15s %s\n", s.name(), s.summary())
		}
		flagsUsage()
	}
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
	var chosen []scenario
	for _, s := range scenarios {
		if err := s.validate(which == "all" || which == s.name()); err != nil {
			return err
		}
		if which == "all" || which == s.name() {
			chosen = append(chosen, s)
		}
	}
	sides, err := parseSides(*sidesFlag)
	if err != nil {
		return err
	}
	var provider *upstream.Provider
	if slices.ContainsFunc(chosen, scenario.needsUpstream) {
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
	in := &scenarioRun{env: env, srv: setup.srv, dbName: setup.name, db: setup.db, provider: provider, sides: sides,
		progress: func(line string) { fmt.Fprintln(env.Stderr, env.Program+": "+line) }}
	sections := 0
	for _, s := range chosen {
		out, err := s.run(ctx, in)
		if perr := printed(env.Stdout, out, &sections); err == nil {
			err = perr
		}
		if err != nil {
			return err
		}
		for _, p := range out.parts {
			p.record(&report)
			report.Verdict[p.key] = p.ok
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
