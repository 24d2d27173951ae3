package lab

import (
	"context"
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

// benchScenarios are the bench scenarios the lab runs itself (package
// bench does not know them), in the order they run, each in a database of
// its own, starting from databases the real provider's runner makes.
func benchScenarios() []scenario {
	return []scenario{
		&migrateLoadScenario{},
		&plansScenario{},
		&callsScenario{},
	}
}

// ownReport is a bench scenario that writes a report of its own into
// --report's directory: its files, for the help.
type ownReport interface{ reportFiles() []string }

// scenarioKey is a scenario name as --scenarios matches it: dashes and
// underscores alike.
func scenarioKey(name string) string { return strings.ReplaceAll(strings.TrimSpace(name), "-", "_") }

// runBenchScenario drives s on srv: a database of its own, the run, the
// table on stdout, and the report into dir when it is given.
func runBenchScenario(ctx context.Context, env *cli.Env, srv *pgtest.Server, provider *upstream.Provider, s scenario, rounds int, dir string) error {
	in := &scenarioRun{env: env, srv: srv, provider: provider, rounds: rounds, progress: func(line string) {
		fmt.Fprintf(env.Stderr, "%s: %s ...\n", s.name(), line)
	}}
	server, drop, err := benchDatabase(ctx, in, "harness_bench_"+scenarioKey(s.name())+"_")
	if err != nil {
		return err
	}
	defer drop()
	out, err := s.run(ctx, in)
	if perr := printed(env.Stdout, out, nil); err == nil {
		err = perr
	}
	if err != nil || dir == "" || out.write == nil {
		return err
	}
	if err := out.write(dir, server); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	fmt.Fprintf(env.Stderr, "%s: report written to %s\n", env.Program, filepath.Join(dir, out.reportFile))
	return nil
}

// benchDatabase creates a database on in.srv for a bench scenario the lab
// runs itself, hands it to in, and says which PostgreSQL it is; drop drops
// it.
func benchDatabase(ctx context.Context, in *scenarioRun, prefix string) (server string, drop func(), err error) {
	name, err := in.srv.CreateDatabase(ctx, prefix, "")
	if err != nil {
		return "", nil, err
	}
	drop = func() { _ = in.srv.DropDatabase(context.Background(), name) }
	src, err := in.srv.Source(name)
	if err != nil {
		drop()
		return "", nil, err
	}
	conn, err := src.Connect(ctx)
	if err != nil {
		drop()
		return "", nil, err
	}
	err = conn.QueryRow(ctx, "SELECT 'PostgreSQL ' || current_setting('server_version')").Scan(&server)
	conn.Close(ctx)
	if err != nil {
		drop()
		return "", nil, err
	}
	in.dbName, in.db = name, src
	return server, drop, nil
}

// The two sides the lab's bench scenarios compare: upstream's schema as
// its runner makes it, and the pack's latest.
const upstreamSideName = "upstream 1..21 and 23"

// latestSide is the pack's latest side: its name and how it is made.
func latestSide() (name string, build func(ctx context.Context, src *dbconn.Source, schema string) error) {
	return fmt.Sprintf("pack %04d", migrations.Latest()), func(ctx context.Context, src *dbconn.Source, schema string) error {
		return migrate.To(ctx, src.Config(), schema, migrations.Latest())
	}
}
