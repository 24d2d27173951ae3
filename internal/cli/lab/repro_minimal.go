package lab

import (
	"context"
	"flag"

	"github.com/duroxide-pg/migrations/internal/sim/repro"
)

// minimalRepro is repro.MinimalRepro: one stale fetch on every side.
type minimalRepro struct{ fromUpstream }

func (minimalRepro) name() string { return "minimal" }
func (minimalRepro) summary() string {
	return "one fetch with a caller timestamp behind the database clock, then its ack, on every side"
}
func (minimalRepro) register(*flag.FlagSet) {}
func (minimalRepro) validate(bool) error    { return nil }

func (minimalRepro) run(ctx context.Context, in *scenarioRun) (outcome, error) {
	res, err := repro.MinimalRepro(ctx, in.db, in.provider, in.sides)
	return onePart(reproPart("minimal", res, err, repro.PrintMinimal,
		func(r *repro.Report, res repro.MinimalResults) { r.Minimal = res }))
}
