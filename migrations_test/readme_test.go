package migrations_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeLayoutListsEveryPackage: README's layout table has a row for
// every Go package under harness/, so a newcomer can find what each is for.
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
	require.NoError(t, filepath.WalkDir("../harness", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		packages[filepath.ToSlash(filepath.Dir(strings.TrimPrefix(path, "../")))] = true
		return nil
	}))
	require.NotEmpty(t, packages)
	for pkg := range packages {
		require.Contains(t, layout, "`"+pkg+"`", "README's layout table has no row for %s", pkg)
	}
}
