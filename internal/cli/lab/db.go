package lab

import (
	"context"
	"fmt"
	"os/signal"
	"syscall"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
)

func runDB(ctx context.Context, env *cli.Env, args []string) error {
	fs := cli.NewFlags(env, "db")
	backend := fs.String("backend", "", "auto, local, dsn or docker (default $HARNESS_BACKEND, else auto)")
	migrateTo := fs.Int64("migrate", 0, "also apply migrations up to this version into schema duroxide (0: none)")
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] != "start" {
		return cli.Usagef("usage: harness-lab db start [--backend auto|local|dsn|docker] [--migrate N]")
	}
	if *migrateTo < 0 || *migrateTo > migrations.Latest() {
		return cli.Usagef("--migrate %d: give a version of the pack, 1..%d, or 0 for none", *migrateTo, migrations.Latest())
	}
	opts := pgtest.OptionsFromEnv()
	if *backend != "" {
		opts.Backend = pgtest.Backend(*backend)
	}
	switch opts.Backend {
	case "", pgtest.Auto, pgtest.Local, pgtest.DSN, pgtest.Docker:
	default:
		return cli.Usagef("unknown backend %q: use auto, local, dsn or docker", opts.Backend)
	}
	opts.Logf = func(f string, a ...any) { fmt.Fprintf(env.Stderr, f+"\n", a...) }
	srv, err := obtainServerWith(ctx, opts)
	if err != nil {
		return err
	}
	defer srv.Close(context.Background())
	src, err := migratedDatabase(ctx, srv, "harness_", migrate.DefaultSchema, *migrateTo)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stderr, "harness-lab: %s database ready; Ctrl-C stops it and removes everything\n", srv.Backend())
	fmt.Fprintln(env.Stdout, src.DSN())
	waitCtx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	<-waitCtx.Done()
	fmt.Fprintln(env.Stderr, "harness-lab: stopping")
	return nil
}
