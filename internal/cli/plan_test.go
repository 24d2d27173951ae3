package cli

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
)

// `migrate plan` lists what `migrate up` would apply, each migration with
// the locks and duration its header states and the size of the tables
// those locks name, and changes nothing.
func TestMigratePlanListsPendingMigrationsWithTheirLocks(t *testing.T) {
	srv := startServer(t)
	ctx := context.Background()
	name, err := srv.CreateDatabase(ctx, "cli_", "")
	require.NoError(t, err)
	dsn := srv.DSN(name)

	// Start just before the fix that adds the queue heads, with a queue
	// its backfill reads.
	pack := migrations.MustPack()
	i := slices.IndexFunc(pack, func(m migrations.Migration) bool {
		return slices.Contains(m.Adds, "table orchestrator_queue_heads")
	})
	require.GreaterOrEqual(t, i, 1, "no migration of the pack adds the queue heads")
	heads := pack[i]
	from := strconv.FormatInt(heads.Version-1, 10)
	code, _, errOut := run(t, "migrate", "up", "--dsn", dsn, "--schema", "s", "--to", from)
	require.Equal(t, ExitOK, code, errOut)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `INSERT INTO s.orchestrator_queue (instance_id, work_item, visible_at, created_at)
		SELECT 'i-' || g, '{}', now(), now() FROM generate_series(1, 1000) g; ANALYZE s.orchestrator_queue`)
	require.NoError(t, err)

	code, out, errOut := run(t, "migrate", "plan", "--dsn", dsn, "--schema", "s")
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, fmt.Sprintf("schema s is at goose version %s; `migrate up` to %d applies %d migration(s)",
		from, migrations.Latest(), len(pack)-i))
	for _, m := range pack[i:] {
		require.Contains(t, out, "\n"+m.File+"\n", "every pending migration is listed")
	}
	require.NotContains(t, out, pack[i-1].File, "an applied migration is not listed")
	// The migration's lines run up to the blank line before the next one.
	section, _, _ := strings.Cut(out[strings.Index(out, heads.File):], "\n\n")
	require.Contains(t, section, "locks:    SHARE UPDATE EXCLUSIVE on orchestrator_queue")
	require.Contains(t, section, "duration: grows with orchestrator_queue's rows")
	require.Contains(t, section, "orchestrator_queue ~1000 rows")

	code, out, _ = run(t, "migrate", "version", "--dsn", dsn, "--schema", "s")
	require.Equal(t, ExitOK, code)
	require.Equal(t, from+"\n", out, "plan changed the schema's version")

	code, out, errOut = run(t, "migrate", "plan", "--dsn", dsn, "--schema", "s", "--to", strconv.FormatInt(heads.Version, 10))
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, "applies 1 migration(s)")

	code, _, errOut = run(t, "migrate", "up", "--dsn", dsn, "--schema", "s")
	require.Equal(t, ExitOK, code, errOut)
	code, out, _ = run(t, "migrate", "plan", "--dsn", dsn, "--schema", "s")
	require.Equal(t, ExitOK, code)
	require.Contains(t, out, "nothing to apply")
}

// `migrate plan --to N` below the schema's version lists what `migrate
// down --to N` would roll back: each Down, newest first, with the locks
// and duration its header states for it and the size of the tables those
// locks name, and changes nothing.
func TestMigratePlanToALowerVersionListsTheDownPath(t *testing.T) {
	t.Parallel()
	d := dbs.New(t, migrations.Latest())
	sqlExec(t, d, "INSERT INTO "+d.Qualify("instance_locks")+" (instance_id, lock_token, locked_until, locked_at) SELECT 'i-' || g, 'token-' || g, 0, 0 FROM generate_series(1, 500) g; ANALYZE "+d.Qualify("instance_locks"))
	const to = 23
	latest := migrations.Latest()

	code, out, errOut := run(t, "migrate", "plan", "--dsn", d.DSN, "--schema", d.Schema, "--to", strconv.Itoa(to))
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, fmt.Sprintf("schema %s is at goose version %d; `migrate down --to %d` rolls back %d migration(s), newest first",
		d.Schema, latest, to, latest-to))
	flat := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	last := -1
	sawLocks := 0
	for v := latest; v > to; v-- {
		m, ok := migrations.ByVersion(v)
		require.True(t, ok)
		at := strings.Index(out, "\n"+m.File+" (down)\n")
		require.Greater(t, at, last, "%s is listed, after the Downs newer than it", m.File)
		last = at
		section, _, _ := strings.Cut(out[at+1:], "\n\n")
		if m.DownLocks != "" {
			sawLocks++
			require.Contains(t, flat(section), "locks: "+m.DownLocks, "%s: its Down locks paragraph", m.File)
			require.Contains(t, flat(section), "duration: "+m.DownDuration, "%s: its Down duration paragraph", m.File)
		}
		if m.NoTransaction {
			require.Contains(t, section, "outside a transaction", m.File)
		}
		if lockedTableRE("instance_locks").MatchString(m.DownLocks) {
			require.Contains(t, section, "instance_locks ~500 rows", "%s: the live size of the table its Down locks", m.File)
		}
	}
	require.Greater(t, int64(sawLocks), (latest-to)/2, "the Downs on the path state their locks")
	for _, want := range []string{"ACCESS EXCLUSIVE on instance_locks", "ACCESS EXCLUSIVE on orchestrator_queue", "EXCLUSIVE on orchestrator_queue from the LOCK TABLE"} {
		require.Contains(t, flat(out), want, "the down path from the latest to %d", to)
	}
	m23, _ := migrations.ByVersion(to)
	require.NotContains(t, out, m23.File, "the target's own migration stays")

	code, out, _ = run(t, "migrate", "version", "--dsn", d.DSN, "--schema", d.Schema)
	require.Equal(t, ExitOK, code)
	require.Equal(t, fmt.Sprintf("%d\n", latest), out, "plan changed the schema's version")

	code, out, errOut = run(t, "migrate", "plan", "--dsn", d.DSN, "--schema", d.Schema, "--to", "0")
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, fmt.Sprintf("rolls back %d migration(s)", latest))
	require.Contains(t, flat(out), "0001_initial_schema.sql (down) locks: ACCESS EXCLUSIVE on instance_locks")
}
