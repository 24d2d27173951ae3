package lab

import (
	"context"
	"flag"

	"github.com/duroxide-pg/migrations/internal/planshape"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/sim/settings"
)

// plansScenario is internal/planshape: the rows a queue read reads, call
// after call on one session, next to rows it does not need, on upstream's
// schema as its runner makes it and on the pack's latest.
type plansScenario struct {
	fromUpstream
	rows int
}

func (*plansScenario) name() string { return "plans" }

func (*plansScenario) summary() string {
	return "rows a queue read reads, call after call: upstream's schema and the latest"
}

func (*plansScenario) reportFiles() []string {
	return []string{planshape.ReportFile, planshape.JSONFile}
}

// settings are the scenario's one setting, bound to s.
func (s *plansScenario) settings() *settings.List {
	l := settings.New("--")
	l.Int(&s.rows, "plans-rows", planshape.DefaultRows, 1).Flag("plans-rows", "plans: the rows a call does not need, in every cell")
	return l
}

func (s *plansScenario) register(fs *flag.FlagSet) { registerSettings(fs, s.settings()) }

func (s *plansScenario) validate(chosen bool) error { return checkIfChosen(chosen, s.settings()) }

func (s *plansScenario) run(ctx context.Context, in *scenarioRun) (outcome, error) {
	latest, makeLatest := latestSide()
	sides := []planshape.Side{{Name: upstreamSideName, Make: in.provider.Migrate}, {Name: latest, Make: makeLatest}}
	results, err := planshape.Run(ctx, in.db, sides, planshape.Cells(orch.RuntimeFilter()), s.rows, in.progress)
	if err != nil {
		return outcome{}, err
	}
	return outcome{parts: []part{table(planshape.Table(results))}, reportFile: planshape.ReportFile, write: func(dir, server string) error {
		return planshape.WriteReport(dir, server, latest, results)
	}}, nil
}
