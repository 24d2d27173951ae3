package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
)

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func startServer(t *testing.T) *pgtest.Server { return pgtest.RequireServer(t) }

func TestMigrateUpThenVersionAndStatus(t *testing.T) {
	srv := startServer(t)
	name, err := srv.CreateDatabase(context.Background(), "cli_", "")
	require.NoError(t, err)
	dsn := srv.DSN(name)

	code, out, errOut := run(t, "migrate", "up", "--dsn", dsn, "--schema", "s", "--to", "19")
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, "now at version 19 (schema s)")

	code, out, _ = run(t, "migrate", "up", "--dsn", dsn, "--schema", "s")
	require.Equal(t, ExitOK, code)
	code, out, _ = run(t, "migrate", "version", "--dsn", dsn, "--schema", "s")
	require.Equal(t, ExitOK, code)
	latest := migrations.Latest()
	require.Equal(t, fmt.Sprintf("%d\n", latest), out, "version prints the newest version")

	code, out, _ = run(t, "migrate", "status", "--dsn", dsn, "--schema", "s")
	require.Equal(t, ExitOK, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, int(latest)+1, "a header and one line per migration")
	require.Contains(t, lines[1], "0001_initial_schema.sql")
	require.Contains(t, lines[latest], "applied")

	code, out, _ = run(t, "migrate", "down", "--dsn", dsn, "--schema", "s", "--to", "19")
	require.Equal(t, ExitOK, code)
	require.Contains(t, out, "now at version 19")
}

// A server that refuses the connection or cannot be reached is not bad
// input: every command exits EX_UNAVAILABLE (69) with one line, but
// doctor, whose monitoring contract says critical (2).
func TestAnUnreachableServerHasAnExitCodeOfItsOwn(t *testing.T) {
	down := "postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=2"
	for _, args := range [][]string{
		{"migrate", "up", "--dsn", down},
		{"migrate", "status", "--dsn", down},
		{"migrate", "plan", "--dsn", down},
		{"sql", "up", "--dsn", down},
		{"baseline", "--dsn", down, "--dry-run"},
	} {
		code, _, errOut := run(t, args...)
		require.Equal(t, ExitUnavailable, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, "cannot use", "%v", args)
		require.NotContains(t, errOut, "hunter2", "passwords are never printed")
		require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
	}
	code, _, _ := run(t, "doctor", "--dsn", down)
	require.Equal(t, exitCritical, code, "doctor: critical")
	require.NotEqual(t, ExitUsage, ExitUnavailable)
}

func TestBadInputExitsWithCode2AndOneLine(t *testing.T) {
	srv := startServer(t)
	dsn := srv.DSN("postgres")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown command", []string{"frobnicate"}, "unknown command"},
		{"unknown migrate action", []string{"migrate", "sideways", "--dsn", dsn}, "unknown migrate action"},
		{"bad DSN", []string{"migrate", "up", "--dsn", "postgres://u:hunter2@%zz/db"}, "bad DSN"},
		{"version that does not exist", []string{"migrate", "up", "--dsn", dsn, "--to", "99"}, "does not exist"},
		{"no database given", []string{"migrate", "up"}, "no database"},
		{"unknown flag", []string{"migrate", "up", "--frob"}, "flag provided but not defined"},
		{"unknown environment", []string{"migrate", "up", "--env", "nowhere"}, "no environment"},
		{"a lab command", []string{"repro", "minimal", "--dsn", dsn}, "run `go run ./harness/cmd/harness-lab repro"},
		{"another lab command", []string{"db", "start"}, "run `go run ./harness/cmd/harness-lab db"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := run(t, tc.args...)
			require.Equal(t, ExitUsage, code)
			require.Contains(t, errOut, tc.want)
			require.NotContains(t, errOut, "hunter2", "passwords are never printed")
			require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
		})
	}
}

// The settings file, goose.yaml, names environments; the name one
// release gave it, harness.yaml, is still read, with one deprecation line on stderr.
func TestEnvironmentFromTheSettingsFile(t *testing.T) {
	srv := startServer(t)
	name, err := srv.CreateDatabase(context.Background(), "cli_", "")
	require.NoError(t, err)
	t.Setenv("CLI_TEST_DSN", srv.DSN(name))
	settings := []byte("schema: fromfile\nenvironments:\n  test:\n    dsn_env: CLI_TEST_DSN\n")

	t.Chdir(t.TempDir())
	require.NoError(t, os.WriteFile("goose.yaml", settings, 0o644))
	code, out, errOut := run(t, "migrate", "up", "--env", "test", "--to", "3")
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, "now at version 3 (schema fromfile)")
	require.Empty(t, errOut)

	require.NoError(t, os.Rename("goose.yaml", "harness.yaml"))
	code, out, errOut = run(t, "migrate", "up", "--env", "test", "--to", "4")
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, "now at version 4 (schema fromfile)")
	require.Equal(t, "harness: deprecated: harness.yaml: the name one release gave the settings file, still read; rename it goose.yaml\n", errOut)

	require.NoError(t, os.WriteFile("goose.yaml", settings, 0o644))
	code, _, errOut = run(t, "migrate", "up", "--env", "test")
	require.Equal(t, ExitUsage, code)
	require.Contains(t, errOut, "both goose.yaml and harness.yaml are here")
}

func TestSQLWritesAScriptAndRefusesBadInput(t *testing.T) {
	srv := startServer(t)
	dsn := srv.DSN("postgres")
	file := filepath.Join(t.TempDir(), "up.sql")
	code, _, errOut := run(t, "sql", "up", "--dsn", dsn, "--schema", "scripted", "--to", "21", "-o", file)
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, errOut, "21 migration(s), goose version 0 -> 21 of schema scripted")
	text, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Contains(t, string(text), "-- ==== 0021_ack_locks_its_lease.sql (Up) ====")
	require.NotContains(t, string(text), "0022_", "nothing past --to")

	for _, args := range [][]string{
		{"sql", "--dsn", dsn},
		{"sql", "down", "--dsn", dsn},
		{"sql", "up", "--dsn", dsn, "--to", fmt.Sprint(migrations.Latest() + 1)},
		{"sql", "sideways", "--dsn", dsn},
	} {
		code, _, errOut := run(t, args...)
		require.Equal(t, ExitUsage, code, "%v: %s", args, errOut)
	}
}
