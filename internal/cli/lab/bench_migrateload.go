package lab

import (
	"context"
	"flag"
	"fmt"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/migrateload"
)

// migrateLoadScenario is internal/migrateload: `migrate up` to the latest
// while a writer enqueues, from each start state upstream's runner or the
// pack makes.
type migrateLoadScenario struct {
	fromUpstream
	messages, instances, rate int
}

func (*migrateLoadScenario) name() string { return "migrate-load" }

func (*migrateLoadScenario) summary() string {
	return "migrate up to the latest while a writer enqueues"
}

func (*migrateLoadScenario) reportFiles() []string {
	return []string{migrateload.ReportFile, migrateload.JSONFile}
}

func (s *migrateLoadScenario) register(fs *flag.FlagSet) {
	full := migrateload.Full()
	fs.IntVar(&s.messages, "migrate-load-messages", full.Messages, "migrate-load: messages queued before the writer starts")
	fs.IntVar(&s.instances, "migrate-load-instances", full.Instances, "migrate-load: instances the queued messages are spread over")
	fs.IntVar(&s.rate, "migrate-load-rate", full.Rate, "migrate-load: the writer's messages per second")
}

func (s *migrateLoadScenario) load() migrateload.Load {
	return migrateload.Load{Messages: s.messages, Instances: s.instances, Rate: s.rate, Lead: migrateload.Full().Lead, To: migrations.Latest()}
}

func (s *migrateLoadScenario) validate(chosen bool) error {
	if !chosen {
		return nil
	}
	return usageOf(s.load().Validate())
}

func (s *migrateLoadScenario) run(ctx context.Context, in *scenarioRun) (outcome, error) {
	starts, err := migrateload.Starts(func(ctx context.Context, src *dbconn.Source, schema string) error {
		return in.provider.Migrate(ctx, src, schema)
	})
	if err != nil {
		return outcome{}, err
	}
	var reps []*migrateload.Report
	for i, start := range starts {
		in.progress("from " + start.Name)
		l := s.load()
		l.Start = start
		rep, err := migrateload.Run(ctx, in.db, fmt.Sprintf("load_%d", i+1), l)
		if err != nil {
			return outcome{}, err
		}
		reps = append(reps, rep)
	}
	return outcome{parts: []part{table(migrateload.Table(reps))}, reportFile: migrateload.ReportFile, write: func(dir, server string) error {
		return migrateload.WriteReport(dir, server, reps)
	}}, nil
}
