package lab

import (
	"context"
	"flag"
	"fmt"

	"github.com/duroxide-pg/migrations/internal/sim/repro"
)

// minimalRepro is repro.RunMinimal: one stale fetch on every side.
type minimalRepro struct{}

func (minimalRepro) kind() string           { return "minimal" }
func (minimalRepro) register(*flag.FlagSet) {}
func (minimalRepro) validate(bool) error    { return nil }
func (minimalRepro) needsUpstream() bool    { return true }
func (minimalRepro) schemas() []int64       { return nil }

func (minimalRepro) run(ctx context.Context, in *reproRun) error {
	in.section()
	made, err := repro.MakeSides(ctx, in.setup.db, in.provider, "minimal", in.sides)
	if err != nil {
		return fmt.Errorf("minimal repro: %w", err)
	}
	res, err := repro.RunMinimal(ctx, in.setup.db, made)
	in.report.Minimal = res
	return in.done("minimal", res.OK(), err, func() error { return repro.PrintMinimal(in.env.Stdout, res) })
}
