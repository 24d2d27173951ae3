package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// queueLockers are the fixes whose Up and Down lock the orchestrator queue
// (LOCK TABLE orchestrator_queue IN EXCLUSIVE MODE): a transaction that
// wrote the queue and stays open makes them wait.
func queueLockers(t *testing.T) []migrations.Migration {
	t.Helper()
	var out []migrations.Migration
	for _, m := range migrations.Fixes() {
		if strings.Contains(m.Up, "LOCK TABLE orchestrator_queue IN EXCLUSIVE MODE") &&
			strings.Contains(m.Down, "LOCK TABLE orchestrator_queue IN EXCLUSIVE MODE") {
			out = append(out, m)
		}
	}
	require.NotEmpty(t, out, "no fix of the pack locks the orchestrator queue both ways")
	return out
}

// holdQueue opens a transaction that has queued a message and keeps it
// open until the test ends: it holds ROW EXCLUSIVE on the orchestrator
// queue, as a writer does.
func holdQueue(t *testing.T, d *testdb.Database) {
	t.Helper()
	ctx := context.Background()
	tx, err := d.Conn(t, "").Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, "INSERT INTO "+d.Qualify("orchestrator_queue")+
		` (instance_id, work_item, visible_at, created_at) VALUES ('holder', '{}', now(), now())`)
	require.NoError(t, err)
}

func versions(from, to int64) string {
	var out []string
	step := int64(1)
	if to < from {
		step = -1
	}
	for v := from; ; v += step {
		out = append(out, strconv.FormatInt(v, 10))
		if v == to {
			break
		}
	}
	return strings.Join(out, ", ")
}

// A `migrate up` that stops at a migration waiting on a lock says which
// versions it applied before (each committed on its own, kept), where it
// stopped and the version the schema is at; `migrate status` then says
// where the schema stands and which file is next.
func TestMigrateUpThatFailsSaysWhatItAppliedAndWhereItStopped(t *testing.T) {
	t.Parallel()
	stop := queueLockers(t)[0]
	from := stop.Version - 2 // one migration applies before it (one that locks no table)
	d := dbs.New(t, from)
	holdQueue(t, d)
	base := []string{"--dsn", d.DSN, "--schema", d.Schema}

	code, out, errOut := run(t, append([]string{"migrate", "up", "--lock-timeout", "200ms", "--lock-retries", "0"}, base...)...)
	require.Equal(t, ExitFailure, code, out+errOut)
	msg := strings.Join(strings.Fields(errOut), " ")
	for _, want := range []string{
		fmt.Sprintf("this run applied %s (each committed), then stopped at %s, which failed and was rolled back", versions(from+1, stop.Version-1), stop.File),
		fmt.Sprintf("the schema is at version %d, the previous version, %d still pending", stop.Version-1, stop.Version),
		"SQLSTATE 55P03",
	} {
		require.Contains(t, msg, want)
	}
	require.NotContains(t, out, "now at version", "a failed run does not say it succeeded")

	code, out, _ = run(t, append([]string{"migrate", "version"}, base...)...)
	require.Equal(t, ExitOK, code)
	require.Equal(t, fmt.Sprintf("%d\n", stop.Version-1), out, "the migrations before the failure stay applied")

	code, out, errOut = run(t, append([]string{"migrate", "status"}, base...)...)
	require.Equal(t, ExitOK, code, errOut)
	prev, _ := migrations.ByVersion(stop.Version - 1)
	require.Contains(t, errOut, fmt.Sprintf("schema %s is at goose version %d (%s), the newest applied; next pending: %s, where `migrate up` starts",
		d.Schema, stop.Version-1, prev.File, stop.File))
	require.Regexp(t, fmt.Sprintf(`(?m)^%d\s+pending\s`, stop.Version), out)
}

// The same for `migrate down --to`: the Downs it ran before the one that
// waited stay rolled back, and the error says so.
func TestMigrateDownThatFailsSaysWhatItRolledBackAndWhereItStopped(t *testing.T) {
	t.Parallel()
	lockers := queueLockers(t)
	stop := lockers[len(lockers)-1]
	latest := migrations.Latest()
	require.Greater(t, latest, stop.Version, "a migration above %s to roll back first", stop.File)
	d := dbs.New(t, latest)
	holdQueue(t, d)
	base := []string{"--dsn", d.DSN, "--schema", d.Schema}

	code, out, errOut := run(t, append([]string{"migrate", "down", "--to", strconv.FormatInt(stop.Version-1, 10), "--lock-timeout", "200ms", "--lock-retries", "0"}, base...)...)
	require.Equal(t, ExitFailure, code, out+errOut)
	msg := strings.Join(strings.Fields(errOut), " ")
	require.Contains(t, msg, fmt.Sprintf("migrate down to %d: this run rolled back %s (each committed), then stopped at %s, whose Down failed and was rolled back; the schema is at version %d, %d still applied",
		stop.Version-1, versions(latest, stop.Version+1), stop.File, stop.Version, stop.Version))

	code, out, _ = run(t, append([]string{"migrate", "version"}, base...)...)
	require.Equal(t, ExitOK, code)
	require.Equal(t, fmt.Sprintf("%d\n", stop.Version), out)
	code, _, errOut = run(t, append([]string{"migrate", "status"}, base...)...)
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, errOut, fmt.Sprintf("schema %s is at goose version %d (%s), the newest applied", d.Schema, stop.Version, stop.File))
}

// A migration that runs outside a transaction and stops part-way (its
// concurrent index build waits on a writer past the lock timeout) is said
// to have stopped part-way, and `migrate status` sees what the schema
// already holds of it although goose's table does not record it.
func TestMigrateStatusSeesAnUpStoppedPartWay(t *testing.T) {
	t.Parallel()
	var heads migrations.Migration
	for _, m := range migrations.Fixes() {
		if m.NoTransaction && len(m.Adds) > 0 {
			heads = m
			break
		}
	}
	require.NotZero(t, heads.Version, "a fix that runs outside a transaction and adds objects")
	d := dbs.New(t, heads.Version-1)
	holdQueue(t, d)
	base := []string{"--dsn", d.DSN, "--schema", d.Schema}

	code, out, errOut := run(t, append([]string{"migrate", "up", "--to", strconv.FormatInt(heads.Version, 10), "--lock-timeout", "200ms", "--lock-retries", "0"}, base...)...)
	require.Equal(t, ExitFailure, code, out+errOut)
	msg := strings.Join(strings.Fields(errOut), " ")
	require.Contains(t, msg, fmt.Sprintf("this run applied nothing before it stopped at %s, which failed part-way", heads.File))
	require.Contains(t, msg, "and the next up finishes it")

	code, _, errOut = run(t, append([]string{"migrate", "status"}, base...)...)
	require.Equal(t, ExitOK, code, errOut)
	msg = strings.Join(strings.Fields(errOut), " ")
	require.Contains(t, msg, heads.File+" is pending, yet the schema holds table orchestrator_queue_heads")
	require.Contains(t, msg, "the next `migrate up` finishes it")

	// Once the writer is gone, up finishes it and status says nothing more.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, d.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle in transaction'")
	require.NoError(t, err)
	code, out, errOut = run(t, append([]string{"migrate", "up"}, base...)...)
	require.Equal(t, ExitOK, code, out+errOut)
	code, _, errOut = run(t, append([]string{"migrate", "status"}, base...)...)
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, errOut, "nothing pending: it is the pack's latest")
	require.NotContains(t, errOut, "part-way")
}
