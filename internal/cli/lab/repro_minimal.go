package lab

import (
	"context"
	"flag"

	"github.com/duroxide-pg/migrations/internal/sim/repro"
)

// minimalRepro is repro.MinimalRepro: one stale fetch on every side.
type minimalRepro struct{}

func (minimalRepro) kind() string           { return "minimal" }
func (minimalRepro) register(*flag.FlagSet) {}
func (minimalRepro) validate(bool) error    { return nil }
func (minimalRepro) needsUpstream() bool    { return true }

func (minimalRepro) run(ctx context.Context, in *reproRun) error {
	in.section()
	res, err := repro.MinimalRepro(ctx, in.setup.db, in.provider, in.sides)
	in.report.Minimal = res
	return in.done("minimal", res.OK(), err, func() error { return repro.PrintMinimal(in.env.Stdout, res) })
}
