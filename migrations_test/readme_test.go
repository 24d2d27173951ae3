package migrations_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeLayoutListsEveryPackage: README's layout table has a row for
// every Go package under harness/ and internal/, so a newcomer can find what
// each is for.
func TestReadmeLayoutListsEveryPackage(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	layout := string(readme)
	start := strings.Index(layout, "## Layout")
	require.GreaterOrEqual(t, start, 0, "README has a Layout section")
	layout = layout[start:]
	if end := strings.Index(layout[1:], "\n## "); end >= 0 {
		layout = layout[:end+1]
	}
	packages := map[string]bool{}
	for _, tree := range []string{"../harness", "../internal"} {
		require.NoError(t, filepath.WalkDir(tree, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
				return err
			}
			packages[filepath.ToSlash(filepath.Dir(strings.TrimPrefix(path, "../")))] = true
			return nil
		}))
	}
	require.NotEmpty(t, packages)
	for pkg := range packages {
		require.Contains(t, layout, "`"+pkg+"`", "README's layout table has no row for %s", pkg)
	}
}

// TestDocumentLinksResolve: every relative link of README.md and the
// documents under docs/ names a file of the checkout, so moving a section
// cannot leave a link behind.
func TestDocumentLinksResolve(t *testing.T) {
	files := []string{"../README.md", "../sql/README.md"}
	for _, pattern := range []string{"../docs/*.md", "../docs/design/*.md"} {
		more, err := filepath.Glob(pattern)
		require.NoError(t, err)
		files = append(files, more...)
	}
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
	checked := 0
	for _, f := range files {
		text, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range link.FindAllStringSubmatch(string(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			_, err := os.Stat(filepath.Join(filepath.Dir(f), target))
			require.NoError(t, err, "%s links to %s, which is not in the checkout", f, target)
			checked++
		}
	}
	require.NotZero(t, checked)
}

// TestReadmeIsAFirstScreen: README.md stays short (what the pack is, the
// two commands, the fix, where to read on); the rest lives in docs/.
func TestReadmeIsAFirstScreen(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	lines := strings.Count(string(readme), "\n")
	require.LessOrEqual(t, lines, 150, "README.md has %d lines; move detail to docs/", lines)
}
