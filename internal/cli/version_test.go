package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
)

func TestVersionAndTheCommandsThatApplyMigrationsSeeADifferingDirectory(t *testing.T) {
	digest, files, err := migrations.Digest(migrations.FS)
	require.NoError(t, err)
	latest, ok := migrations.ByVersion(migrations.Latest())
	require.True(t, ok)

	// Where goose.yaml names a copy of the pack: no note.
	dir := t.TempDir()
	sqlDir := filepath.Join(dir, "sql")
	require.NoError(t, os.CopyFS(sqlDir, migrations.FS))
	config := filepath.Join(dir, "goose.yaml")
	require.NoError(t, os.WriteFile(config, []byte("migrations_dir: sql\n"), 0o644))
	code, out, errOut := run(t, "version", "--config", config)
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, fmt.Sprintf("duroxide-pg-migrations pack %d (%s)\n", latest.Version, latest.File))
	require.Contains(t, out, fmt.Sprintf("migrations sha256:%s (%d files, built in)\n", digest, files))
	require.Contains(t, out, "built with go")
	require.NotContains(t, out, "note:")

	// Edited since the build: migrate would apply the edited file.
	require.NoError(t, os.WriteFile(filepath.Join(sqlDir, latest.File), []byte("-- edited\n"), 0o644))
	code, out, errOut = run(t, "version", "--config", config)
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, fmt.Sprintf("note: goose.yaml's migrations_dir sql is not the built-in pack (%s differs)", latest.File))

	// migrate and sql refuse, before they connect, to run a pack other
	// than the one doctor and baseline check against.
	for _, args := range [][]string{{"migrate", "up"}, {"migrate", "down", "--to", "1"}, {"sql", "up"}} {
		code, _, errOut = run(t, append(args, "--config", config, "--dsn", "postgres://u@127.0.0.1:1/db")...)
		require.Equal(t, ExitUsage, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, fmt.Sprintf("goose.yaml's migrations_dir sql differs from the pack built into this harness (%s differs)", latest.File), "%v", args)
	}

	code, _, errOut = run(t, "version", "extra")
	require.Equal(t, ExitUsage, code)
	require.Contains(t, errOut, `version takes no arguments, got "extra"`)
}
