package lab

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/sim/bench"
	"github.com/duroxide-pg/migrations/internal/sim/settings"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// benchSummary is the line of `harness help` for the bench command (the
// versions compared are in `harness-lab bench -h`, read from the pack).
func benchSummary() string {
	return "speed before and after the pack's fixes, side by side in one run: bench [--rounds 3] [--duration 2.5s] [--scenarios " +
		strings.Join(benchNames(), ",") + "] [--scale-blocked 1000,10000,100000] [--json FILE] [--report DIR] [--dsn DSN]"
}

// benchNames are the names of every bench scenario: package bench's, then
// the lab's own.
func benchNames() []string {
	var names []string
	for _, d := range bench.Described() {
		names = append(names, d.Name)
	}
	for _, s := range benchScenarios() {
		names = append(names, s.name())
	}
	return names
}

// scenariosHelp is --scenarios' help: every scenario, with what it
// compares, package bench's then the lab's own.
func scenariosHelp() string {
	var help []string
	for _, d := range bench.Described() {
		if d.Summary == "" {
			help = append(help, d.Name)
			continue
		}
		help = append(help, fmt.Sprintf("%s (%s)", d.Name, d.Summary))
	}
	for _, s := range benchScenarios() {
		help = append(help, fmt.Sprintf("%s (%s; not run unless named)", s.name(), s.summary()))
	}
	return "scenarios to run: " + strings.Join(help, ", ")
}

// reportHelp is --report's help: package bench's files, then those of
// each of the lab's own scenarios.
func reportHelp() string {
	var own []string
	for _, s := range benchScenarios() {
		if r, ok := s.(ownReport); ok {
			own = append(own, fmt.Sprintf("%s: %s", s.name(), strings.Join(r.reportFiles(), " and ")))
		}
	}
	return fmt.Sprintf("write %s, %s and %s into this directory (%s)", bench.ReportFile, bench.ChartFile, bench.JSONFile, strings.Join(own, "; "))
}

// runBench is `harness-lab bench`: every scenario of package bench, rounds
// alternating the versions before and after the fix of
// fetch_orchestration_item (the worker scenario: before and after the
// worker fixes), on a throwaway server (or --dsn), a table of medians and
// ratios on stdout, a progress line on stderr.
func runBench(ctx context.Context, env *cli.Env, args []string) error {
	def := bench.Defaults()
	cfg := def
	fs := cli.NewFlags(env, "bench")
	dsn := fs.String("dsn", "", "use this existing server (a database is created and dropped) instead of a throwaway one")
	// The command asks for 3 rounds at least, so that medians mean
	// something (the library runs any number; its smoke tests run one).
	run := settings.New("--")
	run.Int(&cfg.Rounds, "rounds", def.Rounds, 3).Flag("rounds", "rounds per cell and version (at least 3)")
	run.Register(fs)
	own := benchScenarios()
	scenarios := fs.String("scenarios", strings.Join(def.Scenarios, ","), scenariosHelp())
	cfg.Register(fs)
	for _, s := range own {
		s.register(fs)
	}
	jsonFile := fs.String("json", "", "write the result as JSON to this file")
	reportDir := fs.String("report", "", reportHelp())
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return cli.Usagef("harness-lab bench takes no arguments, got %q (run `harness-lab bench -h`)", pos[0])
	}
	if err := run.Check(); err != nil {
		return usageOf(err)
	}
	cfg.Scenarios = nil
	named := map[int]bool{} // the lab's scenarios named, by index in own
	for _, name := range strings.Split(*scenarios, ",") {
		key := scenarioKey(name)
		if key == "" {
			continue
		}
		i := slices.IndexFunc(own, func(s scenario) bool { return scenarioKey(s.name()) == key })
		if i < 0 {
			cfg.Scenarios = append(cfg.Scenarios, key)
			continue
		}
		named[i] = true
	}
	var chosen []scenario // in benchScenarios' order, each once
	for i, s := range own {
		if err := s.validate(named[i]); err != nil {
			return err
		}
		if named[i] {
			chosen = append(chosen, s)
		}
	}
	if len(cfg.Scenarios) == 0 && len(chosen) == 0 {
		return cli.Usagef("--scenarios is empty: name some of %s", strings.Join(benchNames(), ", "))
	}
	if err := cfg.Validate(); err != nil {
		return cli.Usagef("%v", err)
	}
	var provider *upstream.Provider
	if slices.ContainsFunc(chosen, scenario.needsUpstream) {
		if provider, err = upstream.Find(); err != nil {
			names := make([]string, len(own))
			for i, s := range own {
				names[i] = s.name()
			}
			return cli.Usagef("bench --scenarios %s start from a database the real provider's runner makes: %v (make upstream installs it)", strings.Join(names, ", "), err)
		}
	}

	// A throwaway server loads pg_stat_statements for the runtime
	// scenario's per-function figures (an existing one is taken as it is).
	opts := pgtest.OptionsFromEnv()
	if *dsn != "" {
		opts.Backend, opts.DSN = pgtest.DSN, *dsn
	}
	opts.Preload = []string{"pg_stat_statements"}
	srv, err := obtainServerWith(ctx, opts)
	if err != nil {
		return err
	}
	defer srv.Close(context.Background())

	for _, s := range chosen {
		if err := runBenchScenario(ctx, env, srv, provider, s, cfg.Rounds, *reportDir); err != nil {
			return err
		}
	}
	if len(cfg.Scenarios) == 0 {
		return nil
	}
	bar := newProgressBar(env.Stderr)
	res, err := bench.Run(ctx, srv, cfg, bar.update)
	bar.done()
	res.Server.Backend = string(srv.Backend())
	if err != nil {
		return err
	}
	if err := bench.PrintTable(env.Stdout, &res); err != nil {
		return err
	}
	if *reportDir != "" {
		if err := bench.WriteReport(*reportDir, &res); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
		fmt.Fprintf(env.Stderr, "harness-lab: report written to %s\n", filepath.Join(*reportDir, bench.ReportFile))
	}
	if *jsonFile != "" {
		if err := bench.WriteJSON(*jsonFile, &res); err != nil {
			return fmt.Errorf("write %s: %w", *jsonFile, err)
		}
	}
	return nil
}

// progressBar draws one line on a terminal (rewritten in place) or one
// line per step elsewhere (CI logs).
type progressBar struct {
	w    io.Writer
	tty  bool
	last int
}

func newProgressBar(w io.Writer) *progressBar {
	tty := false
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	return &progressBar{w: w, tty: tty}
}

func (p *progressBar) update(pr bench.Progress) {
	const width = 24
	filled := 0
	if pr.Steps > 0 {
		filled = width * max(pr.Step-1, 0) / pr.Steps
	}
	eta := ""
	if pr.Step > 1 && pr.Steps > 0 {
		left := time.Duration(float64(pr.Elapsed) / float64(pr.Step-1) * float64(pr.Steps-pr.Step+1))
		eta = fmt.Sprintf(", ~%v left", left.Round(time.Second))
	}
	round := ""
	if pr.Round > 0 {
		round = fmt.Sprintf("round %d/%d ", pr.Round, pr.Rounds)
	}
	line := fmt.Sprintf("bench [%s%s] %d/%d %s%s (%v%s)", strings.Repeat("#", filled), strings.Repeat(".", width-filled),
		pr.Step, pr.Steps, round, pr.Label, pr.Elapsed.Round(time.Second), eta)
	if p.tty {
		pad := max(p.last-len(line), 0)
		fmt.Fprintf(p.w, "\r%s%s", line, strings.Repeat(" ", pad))
		p.last = len(line)
		return
	}
	fmt.Fprintln(p.w, line)
}

func (p *progressBar) done() {
	if p.tty && p.last > 0 {
		fmt.Fprintln(p.w)
	}
}
