package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
	"github.com/duroxide-pg/migrations/internal/sim/settings"
)

// scenario is one scenario of a run: its name (in Config.Scenarios and the
// JSON), its settings (its part of Config, in its file, each declared once
// with its default, least value and flag), the checks across them, how
// many cell runs one round of
// it reports, and its run: prepare (its schemas, seeded, before any
// round), its cells (the dispatcher and migrate cells it adds to the
// result), one round, and what it does after the rounds (the scenarios
// that run their own rounds, and the figures they put into the result). A
// new scenario is a file, a line in scenarios and its part in Config.
type scenario interface {
	name() string
	// summary says what the scenario compares, for the help ("": its
	// name says it).
	summary() string
	// settings declares the scenario's part of c: each setting's default,
	// its least value and, for those the command line sets, its flag.
	settings(c *Config, l *settings.List)
	// validate checks what the settings' least values do not (bounds
	// across settings), told whether the scenario runs (chosen).
	validate(c Config, chosen bool) error
	steps(c Config) int
	prepare(ctx context.Context, r *runState) error
	cells(c Config, cmp Comparison[Sample]) []Cell
	round(ctx context.Context, r *runState, round int) error
	after(ctx context.Context, r *runState) error
}

// scenarios are every scenario, in the order a round runs them.
func scenarios() []scenario {
	return []scenario{backlogScenario{}, hotScenario{}, queueScenario{}, migrateScenario{}, workerScenario{}, scaleScenario{}, runtimeScenario{}}
}

// allScenarios lists every scenario's name in the order a round runs them.
func allScenarios() []string {
	var out []string
	for _, s := range scenarios() {
		out = append(out, s.name())
	}
	return out
}

// chosen are the scenarios c names, in the order a round runs them.
func (c Config) chosen() []scenario {
	var out []scenario
	for _, s := range scenarios() {
		if slices.Contains(c.Scenarios, s.name()) {
			out = append(out, s)
		}
	}
	return out
}

// Description is a scenario as the help names it.
type Description struct {
	// Name is the scenario's name with dashes (queue-only).
	Name string
	// Summary says what it compares ("" when its name says it).
	Summary string
}

// Described lists every scenario, in the order a round runs them, for the
// help of a command that runs them.
func Described() []Description {
	var out []Description
	for _, s := range scenarios() {
		out = append(out, Description{Name: strings.ReplaceAll(s.name(), "_", "-"), Summary: s.summary()})
	}
	return out
}

// pairOf says which versions a scenario compares: "schema B against F",
// or why there are none.
func pairOf(before, after int64, err error) string {
	if err != nil {
		return "none: " + err.Error()
	}
	return fmt.Sprintf("schema %d against %d", before, after)
}

// noCells is a scenario's part that does nothing: embedded, it leaves a
// scenario to write only what it does.
type noCells struct{}

func (noCells) settings(*Config, *settings.List)            {}
func (noCells) summary() string                             { return "" }
func (noCells) validate(Config, bool) error                 { return nil }
func (noCells) prepare(context.Context, *runState) error    { return nil }
func (noCells) cells(Config, Comparison[Sample]) []Cell     { return nil }
func (noCells) round(context.Context, *runState, int) error { return nil }
func (noCells) after(context.Context, *runState) error      { return nil }

// runState is what the scenarios of one run share.
type runState struct {
	srv Databases
	src *dbconn.Source
	// cfg is the run's config; a scenario's prepare may settle a value
	// (the hot lock timeout, calibrated).
	cfg   Config
	cpu   *serverCPU
	res   *Result
	start time.Time
	// progress reports a phase; note a step (a cell run).
	progress func(Progress)
	note     func(round int, label string)
	// before and after are the fetch fix's pair (Versions); pairErr says
	// why there is none.
	before, after int64
	pairErr       error
	// schemas are the seeded schemas of the dispatcher scenarios.
	schemas map[schemaKey]prepared
	// cellOf finds a cell of res by its name.
	cellOf map[string]*Cell
	worker *workerBench
}

// schemaKey names a dispatcher scenario's schema: scenario and side.
type schemaKey struct{ scenario, side string }

// phase reports a step of the run that is not a cell run.
func (r *runState) phase(label string) {
	r.progress(Progress{Steps: r.cfg.Steps(), Rounds: r.cfg.Rounds, Label: label, Elapsed: time.Since(r.start)})
}

// versionOf is the version of side in the fetch fix's pair.
func (r *runState) versionOf(side string) int64 {
	if side == sideBefore {
		return r.before
	}
	return r.after
}

// prep migrates the schema of scenario and side to version, seeds it with
// dcfg and snapshots it for the rounds' resets (without the history when
// dropHistory).
func (r *runState) prep(ctx context.Context, scenario, side string, version int64, dcfg dispatch.Config, dropHistory bool) error {
	if r.pairErr != nil {
		return r.pairErr
	}
	schema := fmt.Sprintf("bench_%s_%s", scenario, side)
	if err := migrateSchema(ctx, r.src, schema, version); err != nil {
		return err
	}
	dcfg.Schema = schema
	if _, err := dispatch.Seed(ctx, r.src, dcfg); err != nil {
		return fmt.Errorf("bench: seed %s: %w", schema, err)
	}
	p := prepared{schema: schema, history: dcfg.HistoryEvents}
	if dropHistory {
		p.history = 0
	}
	if err := snapshot(ctx, r.src, p, dropHistory); err != nil {
		return err
	}
	r.schemas[schemaKey{scenario, side}] = p
	return nil
}

// prepSides prepares the schema of scenario on the before and the after
// side, each at its version of the fetch fix's pair (see prep).
func (r *runState) prepSides(ctx context.Context, scenario string, dcfg dispatch.Config, dropHistory bool) error {
	for _, side := range []string{sideBefore, sideAfter} {
		if err := r.prep(ctx, scenario, side, r.versionOf(side), dcfg, dropHistory); err != nil {
			return err
		}
	}
	return nil
}

// dispatchCell runs one round of the dispatcher cell of scenario at n
// dispatchers, each side on its seeded schema.
func (r *runState) dispatchCell(ctx context.Context, round int, scenario string, n int, dcfg dispatch.Config) error {
	c := r.cellOf[(&Cell{Scenario: scenario, Dispatchers: n}).Name()]
	return c.runRound(round, c.Name(), r.note, func(side string) (Sample, error) {
		return runDispatch(ctx, r.src, r.schemas[schemaKey{scenario, side}], dcfg, r.cpu)
	})
}
