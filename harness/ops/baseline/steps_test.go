package baseline

// The steps of Run that need no database, each on its own. The steps that
// read or write one are tested in steps_db_test.go.

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/fingerprint"
)

// runnerRows are the rows duroxide-pg's runner leaves in
// _duroxide_migrations at upstream versions vs: upstream's file names.
func runnerRows(t *testing.T, vs ...int64) map[int64]string {
	t.Helper()
	rows := map[int64]string{}
	for _, v := range vs {
		port, ok := migrations.PortOf(v)
		require.True(t, ok, "the pack ports upstream %d", v)
		rows[v] = port.UpstreamName
	}
	return rows
}

func upTo(n int64) []int64 {
	var out []int64
	for _, v := range migrations.UpstreamVersions() {
		if v <= n {
			out = append(out, v)
		}
	}
	return out
}

func TestHistoryReadsTheRunnersRecord(t *testing.T) {
	t.Run("a release's history", func(t *testing.T) {
		h := history{schema: "s"}
		require.NoError(t, h.read(runnerRows(t, upTo(23)...)))
		require.Equal(t, int64(23), h.state)
		require.Equal(t, upTo(23), h.recorded)
		require.Nil(t, h.doubt())
		require.Contains(t, h.lines()[0], "duroxide-pg applied upstream versions")
	})
	t.Run("a version the pack does not know is a doubt, not a refusal", func(t *testing.T) {
		rows := runnerRows(t, upTo(23)...)
		rows[99] = "0099_from_the_future.sql"
		h := history{schema: "s"}
		require.NoError(t, h.read(rows))
		require.Equal(t, int64(23), h.state, "checked as the newest state the pack knows")
		require.Equal(t, []int64{99}, h.unknown)
		d := h.doubt()
		require.NotNil(t, d)
		require.Contains(t, d.reason, "version(s) 99, which this pack does not know")
	})
	t.Run("upstream's candidate is known, and said", func(t *testing.T) {
		var u fingerprint.Unreleased
		for _, got := range fingerprint.UnreleasedMigrations() {
			if fingerprint.NameOf(got.Function) == "fetch_orchestration_item" {
				u = got
				break
			}
		}
		require.NotZero(t, u.Version, "the pack knows an unreleased upstream version")
		rows := runnerRows(t, upTo(23)...)
		rows[u.Version] = u.File
		h := history{schema: "s"}
		require.NoError(t, h.read(rows))
		require.Equal(t, []int64{u.Version}, h.unreleasedVersions())
		require.Nil(t, h.doubt())
		require.Contains(t, strings.Join(h.lines(), "\n"), "is in no release, and the pack knows it")
	})
	for _, c := range []struct {
		name string
		rows func() map[int64]string
		says string
	}{
		{"no version the pack knows", func() map[int64]string { return map[int64]string{99: "x.sql"} }, "none of which the pack knows"},
		{"a gap", func() map[int64]string { r := runnerRows(t, upTo(12)...); delete(r, 3); return r }, "but not 3, which duroxide-pg applies in order"},
		{"a name that is not upstream's", func() map[int64]string { r := runnerRows(t, upTo(12)...); r[5] = "0005_mine.sql"; return r }, `version 5 is "0005_mine.sql"`},
	} {
		t.Run("refuses "+c.name, func(t *testing.T) {
			h := history{schema: "s"}
			err := h.read(c.rows())
			require.True(t, IsRefusal(err), "%v", err)
			require.ErrorContains(t, err, c.says)
		})
	}
}

func TestGooseTableDecidesWhatRecordingDoes(t *testing.T) {
	seq := func(n int64) []int64 {
		out := []int64{}
		for v := int64(1); v <= n; v++ {
			out = append(out, v)
		}
		return out
	}
	for _, c := range []struct {
		name        string
		versions    []int64
		newest      int64
		nothingToDo bool
		doubt       bool
		says        string
	}{
		{"no table: create it", nil, -1, false, false, ""},
		{"an empty table: fill it", []int64{}, 0, false, false, "records no migration: filling it"},
		{"already 1..19", seq(19), 19, true, false, "already records versions 1..19: nothing to do"},
		{"already past the baseline", seq(25), 25, true, false, "nothing to do"},
		{"fewer than the baseline", seq(3), 3, false, true, ""},
		{"a gap above the baseline", append(seq(19), 30), 30, false, true, "will apply them again"},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := gooseTable{versions: c.versions}
			require.Equal(t, c.newest, g.newest())
			step := g.decide(19, `"s"."goose_db_version"`)
			require.Equal(t, c.nothingToDo, step.nothingToDo)
			require.Equal(t, c.doubt, step.doubt != nil)
			if c.doubt {
				require.Contains(t, step.doubt.reason, "disagree with _duroxide_migrations")
			}
			if c.says == "" {
				require.Empty(t, step.lines)
			} else {
				require.Contains(t, strings.Join(step.lines, "\n"), c.says)
			}
		})
	}
}

func TestJournalVouchesOnlyWithForce(t *testing.T) {
	var j journal
	require.NoError(t, j.vouch(nil, false), "nothing to vouch for")

	err := j.vouch(&doubt{reason: "odd", diff: "- missing x\n"}, false)
	var r *Refusal
	require.ErrorAs(t, err, &r)
	require.Equal(t, "odd; nothing was changed (--force proceeds anyway):", r.Reason)
	require.Equal(t, "- missing x\n", r.Diff)
	require.Empty(t, j.unvouched)
	require.Empty(t, j.lines)

	require.NoError(t, j.vouch(&doubt{reason: "odd", diff: "- missing x\n"}, true))
	require.Equal(t, []string{"odd:\n- missing x"}, j.unvouched)
	require.Equal(t, []string{"--force: odd:\n- missing x"}, j.lines)
}
