package migrations_test

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// handwrittenVersionRE finds a pack version written by hand in Go code: a
// number from 19 (the last port before the pack's first fix) to 99 where
// the text around it makes it a version: "v20", "version 19", "schema 21",
// "at 19", "against 19", "20 vs 19", "19/20", or a comparison of something
// named version with a number. versionCallRE finds a version-taking call
// of the harness or the tests given a literal version.
var (
	handwrittenVersionRE = regexp.MustCompile(`(?i)` +
		`(\bv|\bversions? |\bschema |\bat |\bagainst |\bvs |\bversion\w* *(==|!=|<=|>=|<|>) *)(19|[2-9][0-9])\b` +
		`|\b(19|[2-9][0-9])/(19|[2-9][0-9])\b`)
	versionCallRE = regexp.MustCompile(`\b(To|UpTo|DownTo|New|newAtVersion|setupFix|PackThenProvider|Minimal)\([^()]*,\s*(19|[2-9][0-9])\s*[,)]`)
)

// No pack version number is written by hand outside sql/ and its reader
// (the root package's pack.go): the harness reads every version it needs (the latest,
// which port is which upstream version, which migration fixes which
// function) from the files, so a new migration changes nothing else.
// In the harness's code, comments may name versions (they explain
// history); code, strings shown to users and flag help texts may not. In
// the tests (of the harness and migrations_test), the versions a test runs
// at come from the pack too; an expected message may still quote one.
func TestNoPackVersionIsWrittenByHand(t *testing.T) {
	t.Parallel()
	var hits []string
	for _, root := range []string{"../harness", "../migrations_test"} {
		require.NoError(t, filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "handwritten_versions_test.go") {
				return err
			}
			isTest := strings.HasSuffix(path, "_test.go")
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
			for n := 1; sc.Scan(); n++ {
				line := sc.Text()
				if strings.HasPrefix(strings.TrimSpace(line), "//") {
					continue
				}
				if versionCallRE.MatchString(line) || (!isTest && handwrittenVersionRE.MatchString(line)) {
					hits = append(hits, filepath.ToSlash(strings.TrimPrefix(path, "../"))+":"+strconv.Itoa(n)+": "+strings.TrimSpace(line))
				}
			}
			return sc.Err()
		}))
	}
	if len(hits) > 0 {
		t.Errorf("pack versions written by hand; read them from sql/ (migrations.Latest, LastContiguousPort, FetchFix, WorkerFix, FixOf, PortOf, UpstreamAt) instead:\n%s",
			strings.Join(hits, "\n"))
	}
}

// The lint above does find what it looks for.
func TestHandwrittenVersionPatternFindsWhatItLooksFor(t *testing.T) {
	t.Parallel()
	for _, line := range []string{
		`Title: "schema 19 against 20"`,
		`if *version < 19 {`,
		`V19 float64 ` + "`json:\"v19\"`",
		`name: "20 vs 19"`,
		`ratio := "20/19"`,
		`fmt.Println("at 21 the ack holds")`,
	} {
		require.Regexp(t, handwrittenVersionRE, line)
	}
	for _, line := range []string{
		`_, err := migrate.To(ctx, dsn, schema, 20)`,
		`d := dbs.New(t, 19)`,
		`_, err = r.DownTo(ctx, 19)`,
		`b := setupFix(t, 19)`,
	} {
		require.Regexp(t, versionCallRE, line)
	}
	require.NotRegexp(t, versionCallRE, `d := dbs.New(t, packfacts.LastContiguousPort())`)
	for _, line := range []string{
		`backoff := 20 * time.Millisecond`,
		`opts.ListLimit = 20`,
		`bug, fix := packfacts.FetchFix()`,
		`fmt.Sprintf("at %04d", v)`,
		`HistoryEvents: 20,`,
	} {
		require.NotRegexp(t, handwrittenVersionRE, line)
	}
}
