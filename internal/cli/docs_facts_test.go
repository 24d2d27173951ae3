package cli_test

// The documents name the commands of both programs (harness, the operator
// command, and harness-lab), their flags, the pack's
// migration files and its versions: every such name must be one the code
// has, so that a command renamed, a flag dropped or a migration added shows
// up here rather than in a DBA's terminal. (docs_commands_test.go, in
// migrations_test, runs the shell blocks of some of them; this reads every
// code span of all of them.)

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/cli/lab"
	"github.com/duroxide-pg/migrations/internal/sim/repro"
)

// docFiles are the documents a user reads (CHANGELOG.md is history: it
// names what was removed, on purpose).
func docFiles(t *testing.T) []string {
	t.Helper()
	root := filepath.Join("..", "..")
	files := []string{"README.md", "sql/README.md", "upstream/README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	for _, f := range more {
		rel, err := filepath.Rel(root, f)
		require.NoError(t, err)
		files = append(files, rel)
	}
	return files
}

var (
	fencedRE = regexp.MustCompile("(?s)```[a-z]*\n(.*?)```")
	spanRE   = regexp.MustCompile("`([^`\n]+)`")
	// harnessRE finds a command line of either program: the word harness
	// or harness-lab (bin/harness, ./harness/cmd/harness-lab, $HARNESS's
	// expansion) and what follows, up to a shell separator.
	harnessRE = regexp.MustCompile(`(?:^|[\s/(])(harness(?:-lab)?)((?:[ \t]+[^\s|;&)>]+|[ \t]*\|[ \t]*[a-z-]+)*)`)
	sqlFileRE = regexp.MustCompile(`sql/(\d{4}_[a-z0-9_]+\.sql)`)
	gooseRE   = regexp.MustCompile(`\bgoose (?:version )?(\d+)\b`)
)

// codeOf is the code a document shows: its fenced blocks and inline spans.
func codeOf(text string) []string {
	var out []string
	for _, m := range fencedRE.FindAllStringSubmatch(text, -1) {
		out = append(out, strings.Split(m[1], "\n")...)
	}
	for _, m := range spanRE.FindAllStringSubmatch(fencedRE.ReplaceAllString(text, ""), -1) {
		out = append(out, m[1])
	}
	return out
}

// programs are the two commands, by name: the entry point of each.
var programs = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) int{
	"harness":     cli.Run,
	"harness-lab": lab.Run,
}

// commandsOf reads the commands a program's help lists.
func commandsOf(t *testing.T, program string) []string {
	t.Helper()
	var out strings.Builder
	programs[program](context.Background(), []string{"help"}, &out, io.Discard)
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^  ([a-z]+) `).FindAllStringSubmatch(out.String(), -1) {
		names = append(names, m[1])
	}
	require.NotEmpty(t, names, "%s help lists its commands", program)
	return names
}

// flagsOf runs `PROGRAM NAME -h` and reads the flags it lists.
func flagsOf(t *testing.T, program, name string) []string {
	t.Helper()
	var out strings.Builder
	programs[program](context.Background(), []string{name, "-h"}, &out, io.Discard)
	flags := []string{"h", "help"}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`).FindAllStringSubmatch(out.String(), -1) {
		flags = append(flags, m[1])
	}
	require.Greater(t, len(flags), 2, "%s %s -h lists its flags", program, name)
	return flags
}

func TestDocumentsNameOnlyCommandsFlagsAndVersionsTheCodeHas(t *testing.T) {
	actions := map[string][]string{
		"migrate": {"up", "down", "status", "version", "plan"},
		"sql":     {"up", "down", "restore"},
		"db":      {"start"},
		"repro":   append(repro.Kinds(), "all"),
	}
	// flags[program][command] are the command's flags.
	flags := map[string]map[string][]string{}
	for program := range programs {
		flags[program] = map[string][]string{}
		for _, name := range commandsOf(t, program) {
			flags[program][name] = flagsOf(t, program, name)
		}
	}
	latest := migrations.Latest()
	var commandsSeen int
	for _, file := range docFiles(t) {
		raw, err := os.ReadFile(filepath.Join("..", "..", file))
		require.NoError(t, err)
		text := string(raw)
		for _, m := range sqlFileRE.FindAllStringSubmatch(text, -1) {
			if _, err := os.Stat(filepath.Join("..", "..", "sql", m[1])); err != nil {
				t.Errorf("%s names sql/%s, which the pack does not have", file, m[1])
			}
		}
		for _, m := range gooseRE.FindAllStringSubmatch(text, -1) {
			v, _ := strconv.ParseInt(m[1], 10, 64)
			if v > latest {
				t.Errorf("%s: %q names a version past the pack's latest (%d)", file, m[0], latest)
			}
		}
		for _, line := range codeOf(text) {
			for _, m := range harnessRE.FindAllStringSubmatch(line, -1) {
				program := m[1]
				words := strings.Fields(strings.ReplaceAll(m[2], "|", " | "))
				if len(words) == 0 || strings.HasPrefix(words[0], "-") || words[0] == "help" {
					continue
				}
				name := words[0]
				if _, ok := flags[program][name]; !ok {
					// A path (harness/ops/...), a Go package, prose.
					if strings.ContainsAny(name, "/.") || !regexp.MustCompile(`^[a-z]+$`).MatchString(name) {
						continue
					}
					t.Errorf("%s: `%s %s`: %s has no command %q (%s)", file, program, strings.Join(words, " "), program, name, line)
					continue
				}
				commandsSeen++
				checkCommandWords(t, file, line, program+" "+name, words[1:], actions[name], flags[program][name], latest)
			}
		}
	}
	require.Greater(t, commandsSeen, 30, "the documents' harness commands were read")
}

// checkCommandWords checks what follows a command: its action (for the
// commands that take one, alternatives split by |), its flags, and the
// versions --to and --migrate name. name is the program and the command.
func checkCommandWords(t *testing.T, file, line, name string, words, actions, flags []string, latest int64) {
	t.Helper()
	actionDone := len(actions) == 0
	for i := 0; i < len(words); i++ {
		w := strings.Trim(words[i], "[]\"'`,")
		switch {
		case w == "" || w == "|" || w == "..." || w == "…":
		case strings.HasPrefix(w, "-"):
			flag, value, hasValue := strings.Cut(strings.TrimLeft(w, "-"), "=")
			if !slices.Contains(flags, flag) {
				t.Errorf("%s: `%s`: no flag --%s (%s)", file, name, flag, line)
				continue
			}
			if (flag == "to" || flag == "migrate") && !hasValue && i+1 < len(words) {
				value = words[i+1]
			}
			if v, err := strconv.ParseInt(value, 10, 64); err == nil && (flag == "to" || flag == "migrate") && v > latest {
				t.Errorf("%s: `%s --%s %d`: the pack's latest is %d (%s)", file, name, flag, v, latest, line)
			}
		case !actionDone:
			if !slices.Contains(actions, w) && !strings.ContainsAny(w, "$<>{}") && strings.ToUpper(w) != w {
				t.Errorf("%s: `%s %s`: it takes %s (%s)", file, name, w, strings.Join(actions, ", "), line)
			}
			// `up|down`: the next words are alternatives of this one.
			if i+1 >= len(words) || words[i+1] != "|" {
				actionDone = true
			} else {
				i++
			}
		}
	}
}
