package bench

import "context"

// migrateScenario: Up from nothing to each side's version in a fresh
// database, timed.
type migrateScenario struct{ noCells }

func (migrateScenario) name() string { return ScenarioMigrate }

func (migrateScenario) summary() string { return pairOf(Versions()) }

func (migrateScenario) steps(Config) int { return 2 }

func (migrateScenario) prepare(_ context.Context, r *runState) error { return r.pairErr }

func (migrateScenario) cells(_ Config, cmp Comparison[Sample]) []Cell {
	return []Cell{{Scenario: ScenarioMigrate, Comparison: cmp}}
}

func (migrateScenario) round(ctx context.Context, r *runState, round int) error {
	c := r.cellOf[(&Cell{Scenario: ScenarioMigrate}).Name()]
	return c.runRound(round, c.Name(), r.note, func(side string) (Sample, error) {
		ms, err := timeMigration(ctx, r.srv, c.Version(side))
		return Sample{WallMs: fp(ms)}, err
	})
}
