package lab

import (
	"context"
	"flag"
	"fmt"

	"github.com/jackc/pgx/v5"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/migrateload"
	"github.com/duroxide-pg/migrations/internal/sim/settings"
)

// migrateLoadScenario is internal/migrateload: `migrate up` to the latest
// while a writer enqueues into each queue, from each start state upstream's
// runner or the pack makes, at each backlog size.
type migrateLoadScenario struct {
	fromUpstream
	sizes             []int
	perInstance, rate int
}

func (*migrateLoadScenario) name() string { return "migrate-load" }

func (*migrateLoadScenario) summary() string {
	return "migrate up to the latest while a writer enqueues into each queue"
}

func (*migrateLoadScenario) reportFiles() []string {
	return []string{migrateload.ReportFile, migrateload.JSONFile}
}

// settings are the scenario's settings, bound to s.
func (s *migrateLoadScenario) settings() *settings.List {
	l := settings.New("--")
	l.Ints(&s.sizes, "migrate-load-messages", migrateload.FullSizes, 0).Flag("migrate-load-messages",
		"migrate-load: the backlogs, comma-separated, each measured from every start state: N messages in orchestrator_queue and N work items in worker_queue")
	l.Int(&s.perInstance, "migrate-load-per-instance", migrateload.MessagesPerInstance, 1).Flag("migrate-load-per-instance",
		"migrate-load: messages of the backlog per instance")
	l.Int(&s.rate, "migrate-load-rate", migrateload.Full().Rate, 1).Flag("migrate-load-rate",
		"migrate-load: each writer's writes per second")
	return l
}

func (s *migrateLoadScenario) register(fs *flag.FlagSet) { registerSettings(fs, s.settings()) }

func (s *migrateLoadScenario) validate(chosen bool) error {
	if err := checkIfChosen(chosen, s.settings()); err != nil || !chosen {
		return err
	}
	for _, n := range s.sizes {
		if err := usageOf(s.load(n).Validate()); err != nil {
			return err
		}
	}
	return nil
}

// load is the measurement at backlog n, without its start state.
func (s *migrateLoadScenario) load(n int) migrateload.Load {
	l := migrateload.Sized(n, s.perInstance, s.rate)
	l.To = migrations.Latest()
	return l
}

func (s *migrateLoadScenario) run(ctx context.Context, in *scenarioRun) (outcome, error) {
	starts, err := migrateload.Starts(func(ctx context.Context, src *dbconn.Source, schema string) error {
		return in.provider.Migrate(ctx, src, schema)
	})
	if err != nil {
		return outcome{}, err
	}
	var reps []*migrateload.Report
	done := func() outcome {
		return outcome{parts: []part{table(migrateload.TargetTable(migrateload.Targets(reps)) + "\n" + migrateload.Table(reps))},
			reportFile: migrateload.ReportFile, write: func(dir, server string) error {
				return migrateload.WriteReport(dir, server, reps)
			}}
	}
	for _, n := range s.sizes {
		for i, start := range starts {
			in.progress(fmt.Sprintf("backlog %d: from %s", n, start.Name))
			l := s.load(n)
			l.Start = start
			schema := fmt.Sprintf("load_%d_%d", n, i+1)
			rep, err := migrateload.Run(ctx, in.db, schema, l)
			if err != nil {
				return done(), err
			}
			reps = append(reps, rep)
			// The next run's concurrent builds need not read past this
			// one's rows, nor its disk keep them.
			if err := dropSchema(ctx, in.db, schema); err != nil {
				return done(), err
			}
		}
	}
	return done(), nil
}

// dropSchema drops schema and everything in it.
func dropSchema(ctx context.Context, src *dbconn.Source, schema string) error {
	conn, err := src.Connect(ctx)
	if err != nil {
		return fmt.Errorf("drop schema %s: %w", schema, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", schema, err)
	}
	return nil
}
