// Package lab is the `harness-lab` command: throwaway servers, the
// repros, the benches and the soaks. It is apart from the operator command
// (package cli) because it links the throwaway-server backends (the local
// server, PgBouncer, Docker) and the real runtime's driver, which a command
// run against production has no use for.
package lab

import (
	"context"
	"io"
	"strings"
	"time"

	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
)

func program() cli.Program {
	return cli.Program{
		Name: "harness-lab",
		Commands: []cli.Command{
			{Name: "db", Summary: "throwaway database: db start [--backend auto|local|dsn|docker] [--migrate N]", Run: runDB},
			{Name: "bench", Summary: benchSummary(), Run: runBench},
			{Name: "soak", Summary: "fault-injection soak, exit 1 on any invariant violation: soak [--duration 5m] [--round 20s] [--dsn DSN] [--version N] [--seed N] [--no-restart] [--json FILE] | soak --runtime [--duration 5m] [--each] [--orchestrations N] [--doc FILE]", Run: runSoak},
			{Name: "repro", Summary: "show the bugs before the pack's fixes and the fixes: " + strings.TrimPrefix(reproUsage(), "usage: harness-lab "), Run: runRepro},
		},
		Notes: "Throwaway work uses an existing server only when named: --dsn or HARNESS_DSN, never\n" +
			"DATABASE_URL; there it creates its own databases and drops only those.\n\n" +
			"migrate, baseline, sql and doctor are the operator command's: go run ./harness/cmd/harness help",
	}
}

// Run executes the lab command line args (without the program name) and
// returns the process exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Main(ctx, program(), args, stdout, stderr)
}

// obtainServer obtains the throwaway server a command works on: the
// environment's backend, or the existing server of dsn when it is given.
// Failing to get one is a usage error (the message names the ways to get
// one).
func obtainServer(ctx context.Context, dsn string) (*pgtest.Server, error) {
	opts := pgtest.OptionsFromEnv()
	if dsn != "" {
		opts.Backend, opts.DSN = pgtest.DSN, dsn
	}
	return obtainServerWith(ctx, opts)
}

func obtainServerWith(ctx context.Context, opts pgtest.Options) (*pgtest.Server, error) {
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(startCtx, opts)
	if err != nil {
		return nil, cli.Usagef("%v", err)
	}
	return srv, nil
}

// migratedDatabase creates a database on srv, its name starting with
// prefix, and migrates schema in it to version (nothing for version 0): the
// database a command that works on one schema runs against. It returns the
// connections to it; the database goes when srv is closed.
func migratedDatabase(ctx context.Context, srv *pgtest.Server, prefix, schema string, version int64) (*dbconn.Source, error) {
	name, err := srv.CreateDatabase(ctx, prefix, "")
	if err != nil {
		return nil, err
	}
	src, err := srv.Source(name)
	if err != nil {
		return nil, err
	}
	if version > 0 {
		if err := migrate.To(ctx, src.Config(), schema, version); err != nil {
			return nil, err
		}
	}
	return src, nil
}
