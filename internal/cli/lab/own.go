package lab

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"strings"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// ownScenario is a bench scenario the lab runs itself (bench.Run does not
// know it), in a database of its own that it creates and drops, starting
// from databases the real provider's runner makes. Each is one file: its
// name, its flags with their defaults, its validation, and a run that
// returns what to print and what to write. A new one is that file and one
// line in ownScenarios.
type ownScenario interface {
	// name is the scenario's name in --scenarios (with dashes).
	name() string
	// summary says what it measures, for --scenarios' help.
	summary() string
	// register adds the scenario's flags, with their defaults, to fs.
	register(fs *flag.FlagSet)
	// validate checks the parsed flags; its error is a usage error.
	validate() error
	// run runs the scenario on the database of in.
	run(ctx context.Context, in ownRun) (ownResult, error)
}

// ownScenarios are the lab's own bench scenarios, in the order they run.
func ownScenarios() []ownScenario {
	return []ownScenario{
		&migrateLoadScenario{},
		&plansScenario{},
		&callsScenario{},
	}
}

// ownRun is what the driver hands a scenario's run.
type ownRun struct {
	src      *dbconn.Source
	provider *upstream.Provider
	// rounds is --rounds, for the scenarios that alternate sides in rounds.
	rounds int
	// progress prints one line on stderr, prefixed with the scenario's name.
	progress func(line string)
}

// ownResult is what a scenario's run made.
type ownResult struct {
	// table is printed on stdout.
	table string
	// reportFile is the file write puts into the report directory.
	reportFile string
	// write writes the report into dir; server names the PostgreSQL it ran on.
	write func(dir, server string) error
}

// ownKey is a scenario name as --scenarios matches it: dashes and
// underscores alike.
func ownKey(name string) string { return strings.ReplaceAll(strings.TrimSpace(name), "-", "_") }

// runOwn drives s on srv: a database of its own, the run, the table on
// stdout, and the report into dir when it is given.
func runOwn(ctx context.Context, env *cli.Env, srv *pgtest.Server, provider *upstream.Provider, s ownScenario, rounds int, dir string) error {
	src, server, drop, err := benchDatabase(ctx, srv, "harness_bench_"+ownKey(s.name())+"_")
	if err != nil {
		return err
	}
	defer drop()
	res, err := s.run(ctx, ownRun{src: src, provider: provider, rounds: rounds, progress: func(line string) {
		fmt.Fprintf(env.Stderr, "%s: %s ...\n", s.name(), line)
	}})
	if err != nil {
		return err
	}
	fmt.Fprint(env.Stdout, res.table)
	if dir == "" {
		return nil
	}
	if err := res.write(dir, server); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	fmt.Fprintf(env.Stderr, "%s: report written to %s\n", env.Program, filepath.Join(dir, res.reportFile))
	return nil
}

// benchDatabase creates a database on srv for a scenario the lab runs
// itself, and says which PostgreSQL it is; drop drops it.
func benchDatabase(ctx context.Context, srv *pgtest.Server, prefix string) (src *dbconn.Source, server string, drop func(), err error) {
	name, err := srv.CreateDatabase(ctx, prefix, "")
	if err != nil {
		return nil, "", nil, err
	}
	drop = func() { _ = srv.DropDatabase(context.Background(), name) }
	if src, err = srv.Source(name); err != nil {
		drop()
		return nil, "", nil, err
	}
	conn, err := src.Connect(ctx)
	if err != nil {
		drop()
		return nil, "", nil, err
	}
	err = conn.QueryRow(ctx, "SELECT 'PostgreSQL ' || current_setting('server_version')").Scan(&server)
	conn.Close(ctx)
	if err != nil {
		drop()
		return nil, "", nil, err
	}
	return src, server, drop, nil
}

// The two sides the lab's own scenarios compare: upstream's schema as its
// runner makes it, and the pack's latest.
const upstreamSideName = "upstream 1..21 and 23"

// latestSide is the pack's latest side: its name and how it is made.
func latestSide() (name string, build func(ctx context.Context, src *dbconn.Source, schema string) error) {
	return fmt.Sprintf("pack %04d", migrations.Latest()), func(ctx context.Context, src *dbconn.Source, schema string) error {
		return migrate.To(ctx, src.Config(), schema, migrations.Latest())
	}
}
