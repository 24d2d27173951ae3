package migrations_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/catalog"
	"github.com/duroxide-pg/migrations/harness/ops/fingerprint"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/packfacts"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// upstreamCatalog is upstream's catalog at upstream version version.
func upstreamCatalog(t *testing.T, version int64) catalog.Snapshot {
	t.Helper()
	name := fmt.Sprintf("v%04d.json", version)
	if version > 19 {
		name = "upstream-later-" + name
	}
	raw, err := os.ReadFile(filepath.Join("testdata", "catalog", name))
	require.NoError(t, err)
	snap, err := catalog.Canonical(raw)
	require.NoError(t, err)
	return snap
}

func takeCatalog(t *testing.T, r *migrate.Runner) catalog.Snapshot {
	t.Helper()
	snap, err := catalog.Take(context.Background(), r.DB(), r.Schema())
	require.NoError(t, err)
	return snap
}

func takeBodies(t *testing.T, r *migrate.Runner) map[string]string {
	t.Helper()
	b, err := catalog.Bodies(context.Background(), r.DB(), r.Schema())
	require.NoError(t, err)
	return b
}

// requireUpstreamPlus asserts that got is upstream's catalog plus exactly
// the objects adds names (the "-- Adds:" lines of the fixes applied): got
// without them is upstream, and each of them is in got.
func requireUpstreamPlus(t *testing.T, upstream, got catalog.Snapshot, adds []string, what string) {
	t.Helper()
	without, err := got.Without(adds)
	require.NoError(t, err)
	requireSameCatalog(t, upstream, without, what+" (without the objects the pack's fixes add)")
	for _, a := range adds {
		if kind, _, _ := strings.Cut(a, " "); kind == "trigger" {
			continue // triggers are not in the catalog snapshot; fix tests check them
		}
		other, err := got.Without([]string{a})
		require.NoError(t, err)
		require.NotEqual(t, string(got), string(other), "%s: %s is missing", what, a)
	}
}

func requireSameCatalog(t *testing.T, want, got catalog.Snapshot, what string) {
	t.Helper()
	if diff := catalog.Diff(want, got); diff != "" {
		t.Fatalf("%s: catalog differs (- missing, + extra, ~ differs):\n%s", what, diff)
	}
}

// Every released upstream version (every one with reference fingerprints)
// has its port in the pack, recording upstream's own file name, and the
// pack ports nothing else.
func TestPackPortsEveryReleasedUpstreamVersion(t *testing.T) {
	t.Parallel()
	for _, v := range fingerprint.FingerprintedVersions() {
		port, ok := migrations.PortOf(v)
		require.True(t, ok, "no port of upstream version %d", v)
		require.Regexp(t, fmt.Sprintf(`^%04d_[a-z0-9_]+\.sql$`, v), port.UpstreamName)
	}
	require.Equal(t, fingerprint.FingerprintedVersions(), migrations.UpstreamVersions())
}

// Walking up one version at a time, the schema equals upstream's catalog at
// every version (a fix keeps the catalog of the port before it), and every
// function body is the one the pack's files say: the port's text, or the
// fix of an applied fix migration. Walking back down, every Down restores
// the previous version's catalog and function bodies exactly, and Down of
// 0001 leaves the schema empty.
func TestCatalogMatchesUpstreamAtEveryVersionUpAndDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := dbs.New(t, 0).Runner(t)
	top := migrations.Latest()

	bodies := map[int64]map[string]string{0: takeBodies(t, r)}
	catalogs := map[int64]catalog.Snapshot{0: takeCatalog(t, r)}
	require.True(t, catalogs[0].Empty(), "a fresh schema must be empty")
	for v := int64(1); v <= top; v++ {
		_, err := r.UpTo(ctx, v)
		require.NoError(t, err, "up to %d", v)
		catalogs[v] = takeCatalog(t, r)
		bodies[v] = takeBodies(t, r)
		requireUpstreamPlus(t, upstreamCatalog(t, packfacts.UpstreamAt(v)), catalogs[v], packfacts.AddedBy(v), fmt.Sprintf("after up to %04d", v))
		requirePackTexts(t, r, v)
	}
	for v := top; v >= 1; v-- {
		_, err := r.DownTo(ctx, v-1)
		require.NoError(t, err, "down to %d", v-1)
		requireSameCatalog(t, catalogs[v-1], takeCatalog(t, r), fmt.Sprintf("after down from %04d", v))
		require.Equal(t, bodies[v-1], takeBodies(t, r),
			"after down from %04d the function bodies (md5 of pg_get_functiondef) must be those of %04d", v, v-1)
	}
	require.True(t, takeCatalog(t, r).Empty(), "down to 0 must leave the schema empty")
}

// requirePackTexts checks that every function of a pack-built schema at
// goose version v has the body the pack's files give it: what baseline and
// doctor recognise as "the pack's".
func requirePackTexts(t *testing.T, r *migrate.Runner, v int64) {
	t.Helper()
	funcs, err := fingerprint.Take(context.Background(), r.DB(), r.Schema())
	require.NoError(t, err)
	texts := fingerprint.PackTexts(packfacts.UpstreamAt(v))
	fixed := map[string]bool{}
	for _, m := range migrations.Fixes() {
		for _, f := range m.Fixes {
			fixed[f] = fixed[f] || m.Version <= v
		}
	}
	added := addedFunctions(v)
	require.Len(t, funcs, len(texts)+len(added), "at %04d: the functions are the pack's", v)
	for id, f := range funcs {
		if fp, ok := added[f.Name]; ok {
			require.True(t, f.Matches(fp), "at %04d %s is the text of the newest fix that defines it", v, id)
			continue
		}
		if fixed[f.Name] {
			d, ok := fingerprint.Identify(f)
			require.True(t, ok && d.Fixed, "at %04d %s carries the fix, got %+v", v, id, d)
			continue
		}
		require.Equal(t, texts[f.Name], f.Raw, "at %04d %s is the pack's text of upstream %d", v, id, packfacts.UpstreamAt(v))
	}
}

// addedFunctions are the functions the fixes up to v add (their "-- Adds:"
// lines), with the fingerprint of the body the newest fix up to v installs
// (the adding fix's, or a later fix's of the same function).
func addedFunctions(v int64) map[string]string {
	added := map[string]bool{}
	out := map[string]string{}
	for _, m := range migrations.Fixes() {
		if m.Version > v {
			continue
		}
		for _, a := range m.Adds {
			if kind, name, _ := strings.Cut(a, " "); kind == "function" {
				added[name] = true
			}
		}
		for _, d := range m.Definitions {
			if added[d.Function] && !d.Down {
				out[d.Function] = d.Fingerprint()
			}
		}
	}
	return out
}

func TestUpDownUpGivesTheSameCatalog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := dbs.New(t, 0).Runner(t)
	_, err := r.Up(ctx)
	require.NoError(t, err)
	first, firstBodies := takeCatalog(t, r), takeBodies(t, r)
	_, err = r.DownTo(ctx, 0)
	require.NoError(t, err)
	require.True(t, takeCatalog(t, r).Empty())
	_, err = r.Up(ctx)
	require.NoError(t, err)
	requireSameCatalog(t, first, takeCatalog(t, r), "up, down, up")
	require.Equal(t, firstBodies, takeBodies(t, r))
}

func TestSecondUpIsANoop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := dbs.New(t, testdb.Latest).Runner(t)
	before := takeCatalog(t, r)
	res, err := r.Up(ctx)
	require.NoError(t, err)
	require.Empty(t, res, "nothing is pending after up")
	requireSameCatalog(t, before, takeCatalog(t, r), "second up")
	v, err := r.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
}

// duroxide-pg's own runner reads (version, name) from _duroxide_migrations
// and skips what is recorded: after Up to N the table holds exactly the rows
// of the upstream versions ported up to N, with upstream's file names (the
// fixes record nothing), and Down removes them again.
func TestUpstreamBookkeepingRowsFollowTheVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := dbs.New(t, 0).Runner(t)
	rows := func() map[int64]string {
		out := map[int64]string{}
		res, err := r.DB().QueryContext(ctx, "SELECT version, name FROM _duroxide_migrations ORDER BY version")
		require.NoError(t, err)
		defer res.Close()
		for res.Next() {
			var v int64
			var n string
			require.NoError(t, res.Scan(&v, &n))
			out[v] = n
		}
		require.NoError(t, res.Err())
		return out
	}
	want := func(v int64) map[int64]string {
		out := map[int64]string{}
		for _, m := range migrations.MustPack() {
			if m.IsPort() && m.Version <= v {
				out[m.Upstream] = m.UpstreamName
			}
		}
		return out
	}
	for v := int64(1); v <= migrations.Latest(); v++ {
		_, err := r.UpTo(ctx, v)
		require.NoError(t, err)
		require.Equal(t, want(v), rows(), "at version %d", v)
	}
	require.Equal(t, "0023_partial_secondary_indexes.sql", rows()[23])
	require.NotContains(t, rows(), int64(22), "upstream has not released 22")
	_, err := r.DownTo(ctx, 5)
	require.NoError(t, err)
	require.Equal(t, want(5), rows())
	require.Equal(t, "0005_add_visible_at_to_worker_queue.sql", rows()[5])
}

// A fix migration changes exactly the functions it names: the catalog stays
// that of the port before it plus exactly the objects its "-- Adds:" line
// names, every other body is untouched, and its Down
// restores the previous bodies exactly.
func TestEachFixChangesExactlyTheFunctionsItNames(t *testing.T) {
	t.Parallel()
	for _, m := range migrations.Fixes() {
		t.Run(m.File, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			r := dbs.New(t, m.Version-1).Runner(t)
			beforeCatalog, before := takeCatalog(t, r), takeBodies(t, r)
			_, err := r.UpTo(ctx, m.Version)
			require.NoError(t, err)
			requireUpstreamPlus(t, beforeCatalog, takeCatalog(t, r), m.Adds, m.File)
			var changed []string
			for id, body := range takeBodies(t, r) {
				name := fingerprint.NameOf(id)
				if before[id] != body && !slices.Contains(m.Adds, "function "+name) {
					changed = append(changed, name)
				}
			}
			// A function the schema does not have (one only an unreleased
			// upstream migration adds, as 0033's fetch_work_items) is left
			// absent: the fix has nothing to change.
			var present []string
			for id := range before {
				if name := fingerprint.NameOf(id); slices.Contains(m.Fixes, name) && !slices.Contains(present, name) {
					present = append(present, name)
				}
			}
			require.ElementsMatch(t, present, changed, "%s changes exactly the functions its header names that the schema has", m.File)
			_, err = r.DownTo(ctx, m.Version-1)
			require.NoError(t, err)
			require.Equal(t, before, takeBodies(t, r), "down from %s restores the bodies", m.File)
		})
	}
}
