package cli

import (
	"context"
	"fmt"
	"runtime/debug"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/config"
)

// runVersion prints what a DBA checks before running a copied binary: the
// pack's version (its latest migration), the digest of the migrations
// built into it, the build's Go version and source revision, and whether
// the settings file here names a migrations directory that differs from them
// (migrate and sql then refuse: every command uses the built-in pack).
func runVersion(_ context.Context, env *Env, args []string) error {
	fs := NewFlags(env, "version")
	configPath := fs.String("config", "", "settings file (default ./goose.yaml when present, else ./harness.yaml, the name one release gave it)")
	pos, err := Parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return Usagef("version takes no arguments, got %q", pos[0])
	}
	latest, ok := migrations.ByVersion(migrations.Latest())
	if !ok {
		return fmt.Errorf("version: the built-in pack has no migration %d", migrations.Latest())
	}
	digest, files, err := migrations.Digest(migrations.FS)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "duroxide-pg-migrations pack %d (%s)\n", latest.Version, latest.File)
	fmt.Fprintf(env.Stdout, "migrations sha256:%s (%d files, built in)\n", digest, files)
	if info, ok := debug.ReadBuildInfo(); ok {
		rev, modified := "unknown revision", ""
		for _, s := range info.Settings {
			switch {
			case s.Key == "vcs.revision":
				rev = "revision " + s.Value
			case s.Key == "vcs.modified" && s.Value == "true":
				modified = ", with uncommitted changes"
			}
		}
		fmt.Fprintf(env.Stdout, "built with %s from %s%s\n", info.GoVersion, rev, modified)
	}
	cfg, err := config.Load(*configPath)
	if err != nil {
		return Usagef("%v", err)
	}
	if d := cfg.Deprecation(); d != "" {
		fmt.Fprintf(env.Stderr, "%s: deprecated: %s\n", env.Program, d)
	}
	if dir := cfg.MigrationsFS(); dir != nil {
		if diff := differingMigration(dir, migrations.FS); diff != "" {
			fmt.Fprintf(env.Stdout, "note: %s's migrations_dir %s is not the built-in pack (%s): migrate and sql refuse to run here until the harness is rebuilt\n", cfg.Name(), cfg.MigrationsDir, diff)
		}
	}
	return nil
}
