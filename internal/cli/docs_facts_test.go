package cli

// The documents name the harness's commands, their flags, the pack's
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
	// harnessRE finds a harness command line: the word harness (bin/harness,
	// ./harness/cmd/harness, $HARNESS's expansion) and what follows, up to
	// a shell separator.
	harnessRE = regexp.MustCompile(`(?:^|[\s/(])harness((?:[ \t]+[^\s|;&)>]+|[ \t]*\|[ \t]*[a-z-]+)*)`)
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

// flagsOf runs `harness NAME -h` and reads the flags it lists.
func flagsOf(t *testing.T, name string) []string {
	t.Helper()
	var out strings.Builder
	Run(context.Background(), []string{name, "-h"}, &out, io.Discard)
	flags := []string{"h", "help"}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`).FindAllStringSubmatch(out.String(), -1) {
		flags = append(flags, m[1])
	}
	require.Greater(t, len(flags), 2, "harness %s -h lists its flags", name)
	return flags
}

func TestDocumentsNameOnlyCommandsFlagsAndVersionsTheCodeHas(t *testing.T) {
	actions := map[string][]string{
		"migrate": {"up", "down", "status", "version", "plan"},
		"sql":     {"up", "down"},
		"db":      {"start"},
		"repro":   append(repro.Kinds(), "all"),
	}
	flags := map[string][]string{}
	for _, c := range commands() {
		flags[c.name] = flagsOf(t, c.name)
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
				words := strings.Fields(strings.ReplaceAll(m[1], "|", " | "))
				if len(words) == 0 || strings.HasPrefix(words[0], "-") || words[0] == "help" {
					continue
				}
				name := words[0]
				if _, ok := flags[name]; !ok {
					// A path (harness/ops/...), a Go package, prose.
					if strings.ContainsAny(name, "/.") || !regexp.MustCompile(`^[a-z]+$`).MatchString(name) {
						continue
					}
					t.Errorf("%s: `harness %s`: there is no command %q (%s)", file, strings.Join(words, " "), name, line)
					continue
				}
				commandsSeen++
				checkCommandWords(t, file, line, name, words[1:], actions[name], flags[name], latest)
			}
		}
	}
	require.Greater(t, commandsSeen, 30, "the documents' harness commands were read")
}

// checkCommandWords checks what follows a command: its action (for the
// commands that take one, alternatives split by |), its flags, and the
// versions --to and --migrate name.
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
				t.Errorf("%s: `harness %s`: no flag --%s (%s)", file, name, flag, line)
				continue
			}
			if (flag == "to" || flag == "migrate") && !hasValue && i+1 < len(words) {
				value = words[i+1]
			}
			if v, err := strconv.ParseInt(value, 10, 64); err == nil && (flag == "to" || flag == "migrate") && v > latest {
				t.Errorf("%s: `harness %s --%s %d`: the pack's latest is %d (%s)", file, name, flag, v, latest, line)
			}
		case !actionDone:
			if !slices.Contains(actions, w) && !strings.ContainsAny(w, "$<>{}") && strings.ToUpper(w) != w {
				t.Errorf("%s: `harness %s %s`: %s takes %s (%s)", file, name, w, name, strings.Join(actions, ", "), line)
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
