package lab

import (
	"context"
	"flag"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// ownScenario is the shape the lab's bench scenarios had before scenario;
// legacy runs one as a scenario until it moves.
type ownScenario interface {
	name() string
	summary() string
	register(fs *flag.FlagSet)
	validate() error
	run(ctx context.Context, in ownRun) (ownResult, error)
}

// ownRun is what an ownScenario's run is handed.
type ownRun struct {
	src      *dbconn.Source
	provider *upstream.Provider
	rounds   int
	progress func(line string)
}

// ownResult is what an ownScenario's run made.
type ownResult struct {
	table      string
	reportFile string
	write      func(dir, server string) error
}

// legacy runs s as a scenario.
func legacy(s ownScenario) scenario { return legacyScenario{s} }

type legacyScenario struct{ ownScenario }

func (legacyScenario) needsUpstream() bool { return true }

func (l legacyScenario) validate(chosen bool) error {
	if !chosen {
		return nil
	}
	return l.ownScenario.validate()
}

func (l legacyScenario) run(ctx context.Context, in *scenarioRun) (outcome, error) {
	res, err := l.ownScenario.run(ctx, ownRun{src: in.db, provider: in.provider, rounds: in.rounds, progress: in.progress})
	if err != nil {
		return outcome{}, err
	}
	return outcome{parts: []part{table(res.table)}, reportFile: res.reportFile, write: res.write}, nil
}
