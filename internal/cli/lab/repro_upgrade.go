package lab

import (
	"context"
	"flag"

	"github.com/duroxide-pg/migrations/internal/sim/repro"
)

// upgradeRepro is repro.UpgradeRepro: a duroxide-pg upgrade takes a fix
// away, one migrate up brings it back.
type upgradeRepro struct{ fromUpstream }

func (upgradeRepro) name() string { return "upgrade" }
func (upgradeRepro) summary() string {
	return "a duroxide-pg upgrade whose runner replaces the pack's fetch (upstream's candidate), then one migrate up: doctor and reproduction A at each step"
}
func (upgradeRepro) register(*flag.FlagSet) {}
func (upgradeRepro) validate(bool) error    { return nil }

func (upgradeRepro) run(ctx context.Context, in *scenarioRun) (outcome, error) {
	res, err := repro.UpgradeRepro(ctx, in.db, in.provider, in.progress)
	return onePart(reproPart("upgrade", res, err, repro.PrintUpgrade,
		func(r *repro.Report, res repro.UpgradeResult) { r.Upgrade = &res }))
}
