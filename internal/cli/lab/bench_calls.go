package lab

import (
	"context"
	"flag"

	"github.com/duroxide-pg/migrations/internal/callcost"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/sim/settings"
)

// callsScenario is internal/callcost: where a call's server time goes,
// uncontended, on upstream's schema as its runner makes it, the pack's
// latest and its variants, in --rounds rounds.
type callsScenario struct {
	fromUpstream
	count int
}

func (*callsScenario) name() string { return "calls" }

func (*callsScenario) summary() string {
	return "where a call's server time goes, uncontended: upstream's schema, the latest and its variants"
}

func (*callsScenario) reportFiles() []string { return []string{callcost.ReportFile, callcost.JSONFile} }

// settings are the scenario's one setting, bound to s.
func (s *callsScenario) settings() *settings.List {
	l := settings.New("--")
	l.Int(&s.count, "calls-count", 2000, 1).Flag("calls-count", "calls: measured calls per cell, side and round")
	return l
}

func (s *callsScenario) register(fs *flag.FlagSet) { registerSettings(fs, s.settings()) }

func (s *callsScenario) validate(chosen bool) error { return checkIfChosen(chosen, s.settings()) }

func (s *callsScenario) run(ctx context.Context, in *scenarioRun) (outcome, error) {
	latest, makeLatest := latestSide()
	sides := callcost.Sides{
		Upstream: callcost.Side{Name: upstreamSideName, Make: in.provider.Migrate},
		Latest:   callcost.Side{Name: latest, Make: makeLatest},
	}
	filter := orch.RuntimeFilter()
	results, err := callcost.Run(ctx, in.db, sides, callcost.Cells(filter.Min, filter.Max), s.count, in.rounds, in.progress)
	if err != nil {
		return outcome{}, err
	}
	return outcome{parts: []part{table(callcost.Accounting(results, latest) + "\n" + callcost.Table(results))}, reportFile: callcost.ReportFile,
		write: func(dir, server string) error {
			return callcost.WriteReport(dir, server, latest, s.count, in.rounds, results)
		}}, nil
}
