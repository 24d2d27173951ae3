package migrations_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/harness/catalog"
	"github.com/duroxide-pg/migrations/harness/migrate"
	"github.com/duroxide-pg/migrations/harness/testdb"
)

// upstreamVersions is the number of upstream duroxide-pg versions the pack
// re-creates (0001..0019).
const upstreamVersions = 19

func upstreamCatalog(t *testing.T, version int64) catalog.Snapshot {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "catalog", fmt.Sprintf("v%04d.json", version)))
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

func requireSameCatalog(t *testing.T, want, got catalog.Snapshot, what string) {
	t.Helper()
	if diff := catalog.Diff(want, got); diff != "" {
		t.Fatalf("%s: catalog differs (- missing, + extra, ~ differs):\n%s", what, diff)
	}
}

func TestPackHasOneFilePerUpstreamVersion(t *testing.T) {
	t.Parallel()
	r := dbs.New(t, 0).Runner(t)
	st, err := r.Status(context.Background())
	require.NoError(t, err)
	have := map[int64]string{}
	for _, s := range st {
		have[s.Source.Version] = filepath.Base(s.Source.Path)
	}
	for v := int64(1); v <= upstreamVersions; v++ {
		require.Contains(t, have, v, "no migration file for upstream version %d", v)
	}
}

// Walking up one version at a time, the schema equals upstream's catalog at
// every version; walking back down, every Down restores the previous
// version's catalog and function bodies exactly, and Down of 0001 leaves the
// schema empty.
func TestCatalogMatchesUpstreamAtEveryVersionUpAndDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := dbs.New(t, 0).Runner(t)
	top := min(r.Latest(), upstreamVersions)

	bodies := map[int64]map[string]string{0: takeBodies(t, r)}
	catalogs := map[int64]catalog.Snapshot{0: takeCatalog(t, r)}
	require.True(t, catalogs[0].Empty(), "a fresh schema must be empty")
	for v := int64(1); v <= top; v++ {
		_, err := r.UpTo(ctx, v)
		require.NoError(t, err, "up to %d", v)
		catalogs[v] = takeCatalog(t, r)
		bodies[v] = takeBodies(t, r)
		requireSameCatalog(t, upstreamCatalog(t, v), catalogs[v], fmt.Sprintf("after up to %04d", v))
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
	require.Equal(t, r.Latest(), v)
}

// duroxide-pg's own runner reads (version, name) from _duroxide_migrations
// and skips what is recorded: after Up to N the table holds exactly the rows
// 1..N with upstream's file names, and Down removes them again.
func TestUpstreamBookkeepingRowsFollowTheVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := dbs.New(t, 0).Runner(t)
	st, err := r.Status(ctx)
	require.NoError(t, err)
	names := map[int64]string{}
	for _, s := range st {
		names[s.Source.Version] = filepath.Base(s.Source.Path)
	}
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
	for _, v := range []int64{1, 7, 12, upstreamVersions} {
		_, err := r.UpTo(ctx, v)
		require.NoError(t, err)
		want := map[int64]string{}
		for i := int64(1); i <= v; i++ {
			want[i] = names[i]
		}
		require.Equal(t, want, rows(), "at version %d", v)
	}
	_, err = r.Up(ctx)
	require.NoError(t, err)
	require.Len(t, rows(), upstreamVersions, "0020 is ours, not upstream's 20: it records nothing")
	_, err = r.DownTo(ctx, 5)
	require.NoError(t, err)
	require.Len(t, rows(), 5)
	require.Equal(t, "0005_add_visible_at_to_worker_queue.sql", rows()[5])
}

// The pack's own migrations after 19 change function bodies only: the
// catalog stays upstream's version 19, and each Down restores the previous
// version's bodies exactly.
func TestPackFixesKeepTheCatalogAndDownRestoresTheBodies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := dbs.New(t, upstreamVersions).Runner(t)
	for v := int64(upstreamVersions + 1); v <= r.Latest(); v++ {
		before := takeBodies(t, r)
		_, err := r.UpTo(ctx, v)
		require.NoError(t, err)
		requireSameCatalog(t, upstreamCatalog(t, upstreamVersions), takeCatalog(t, r), fmt.Sprintf("at %04d", v))
		require.NotEqual(t, before, takeBodies(t, r), "%04d must change a function body", v)
		_, err = r.DownTo(ctx, v-1)
		require.NoError(t, err)
		require.Equal(t, before, takeBodies(t, r), "down from %04d restores the bodies of %04d", v, v-1)
		_, err = r.UpTo(ctx, v)
		require.NoError(t, err)
	}
}
