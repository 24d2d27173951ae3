package lab

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/cli"
)

// TestBadInputExitsWithCode64AndOneLine: the lab's commands refuse bad
// input before they start a server or create a database: exit 64, one line
// on stderr, no password.
func TestBadInputExitsWithCode64AndOneLine(t *testing.T) {
	// Nothing listens here: a command that got past its input's checks
	// would fail to connect, with another message.
	dsn := "postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=2"
	latest := migrations.Latest()
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown command", []string{"frobnicate"}, "unknown command"},
		{"an operator command", []string{"migrate", "up"}, "unknown command \"migrate\""},
		{"unknown repro", []string{"repro", "sideways"}, "unknown repro"},
		{"repro side that does not exist", []string{"repro", "minimal", "--dsn", dsn, "--sides", "upstream,pack,sideways"}, "--sides"},
		{"repro without upstream's side", []string{"repro", "minimal", "--dsn", dsn, "--sides", "candidate,pack"}, "give both"},
		{"repro side twice", []string{"repro", "runtime", "--dsn", dsn, "--sides", "upstream,pack,pack"}, "at most once"},
		{"db start: a version beyond the latest", []string{"db", "start", "--migrate", "99"}, fmt.Sprintf("--migrate 99: give a version of the pack, 1..%d", latest)},
		{"db start: a negative version", []string{"db", "start", "--migrate", "-1"}, "--migrate -1"},
		{"db start: an unknown backend", []string{"db", "start", "--backend", "cloud"}, `unknown backend "cloud"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := run(t, tc.args...)
			require.Equal(t, cli.ExitUsage, code, errOut)
			require.Contains(t, errOut, tc.want)
			require.True(t, strings.HasPrefix(errOut, "harness-lab: "), errOut)
			require.NotContains(t, errOut, "hunter2", "passwords are never printed")
			require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
		})
	}
}
