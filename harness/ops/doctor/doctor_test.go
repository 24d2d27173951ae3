package doctor_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/doctor"
	"github.com/duroxide-pg/migrations/harness/ops/fingerprint"
	"github.com/duroxide-pg/migrations/internal/packfacts"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

var (
	dbs   *testdb.Pool
	other *testdb.Pool // a schema name that needs quoting
)

func TestMain(m *testing.M) {
	os.Exit(testdb.RunTests(m, func(srv *pgtest.Server) {
		dbs = testdb.NewPool(srv, "duroxide")
		other = testdb.NewPool(srv, "Other's Schema")
	}))
}

func openDB(t *testing.T, d *testdb.Database) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(d.DSN)
	require.NoError(t, err)
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func exec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	_, err := db.ExecContext(context.Background(), q, args...)
	require.NoError(t, err, q)
}

func check(t *testing.T, d *testdb.Database, db *sql.DB) *doctor.Report {
	t.Helper()
	r, err := doctor.Check(context.Background(), db, doctor.Options{Schema: d.Schema})
	require.NoError(t, err)
	return r
}

func finding(r *doctor.Report, check string) doctor.Finding {
	for _, f := range r.Findings {
		if f.Check == check {
			return f
		}
	}
	return doctor.Finding{}
}

func function(r *doctor.Report, name string) doctor.FunctionCheck {
	for _, f := range r.Functions {
		if f.Name == name {
			return f
		}
	}
	return doctor.FunctionCheck{}
}

// At every pack version from 19 on, each function a fix migration fixes is
// listed once, reported fixed exactly when goose is at or past its first
// fix (the newest fix goose records is then in force), whatever the schema
// is called; only the latest version is OK.
func TestEveryFixedFunctionIsIdentifiedOnceAtEveryPackVersion(t *testing.T) {
	t.Parallel()
	latest := migrations.Latest()
	for v := packfacts.LastContiguousPort(); v <= latest; v++ {
		for _, p := range []*testdb.Pool{dbs, other} {
			d := p.New(t, v)
			r := check(t, d, openDB(t, d))
			require.Equal(t, latest, r.PackLatest)
			listed := map[string]int{}
			for _, f := range r.Functions {
				listed[f.Name]++
			}
			for _, m := range migrations.Fixes() {
				for _, name := range m.Fixes {
					f := function(r, name)
					if adder, ok := addedBy(name); ok && v < adder.Version {
						require.Empty(t, f.Verdict, "%s, which %s adds, is not checked at pack %d", name, adder.File, v)
						continue
					}
					if _, ported := fingerprint.PackTexts(packfacts.UpstreamAt(latest))[name]; !ported {
						if _, added := addedBy(name); !added {
							require.Empty(t, f.Verdict, "%s, which only an unreleased upstream migration adds, is not listed where absent", name)
							continue
						}
					}
					require.Equal(t, 1, listed[name], "%s is listed once", name)
					first, _ := migrations.FixOf(name)
					want := doctor.Unfixed
					if v >= first.Version {
						want = doctor.Fixed
					}
					require.Equal(t, want, f.Verdict, "%s at pack %d in schema %q: %+v", name, v, d.Schema, f)
					require.NotEmpty(t, f.Definition)
					if want == doctor.Fixed {
						newest, _, ok := migrations.FixFor(name, 19, v)
						require.True(t, ok)
						require.Equal(t, newest.File, f.FixedBy, "the newest fix up to %d is in force", v)
					}
				}
			}
			if v == latest {
				require.Equal(t, doctor.OK, r.Status, "%+v", r.Findings)
			} else {
				require.Equal(t, doctor.Warning, r.Status, "%+v", r.Findings)
				require.Contains(t, finding(r, "migrations").Message, fmt.Sprintf("the pack has %d", latest))
			}
		}
	}
}

// addedBy is the fix migration whose Adds line names function name.
func addedBy(name string) (migrations.Migration, bool) {
	for _, m := range migrations.Fixes() {
		if slices.Contains(m.Adds, "function "+name) {
			return m, true
		}
	}
	return migrations.Migration{}, false
}

func TestVerdictAt19NamesTheUpstreamDefinitionAndMigrateUp(t *testing.T) {
	t.Parallel()
	d := other.New(t, packfacts.LastContiguousPort())
	r := check(t, d, openDB(t, d))
	require.Equal(t, doctor.Warning, r.Status)
	f := function(r, "fetch_orchestration_item")
	require.Equal(t, doctor.Unfixed, f.Verdict)
	require.Contains(t, f.Definition, "pack")
	require.Contains(t, f.Definition, "19")
	require.Contains(t, finding(r, "fetch_orchestration_item").Action, "migrate up")
}

func TestVerdictWithAHandEditedFunctionIsCritical(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := dbs.New(t, migrations.Latest())
	db := openDB(t, d)
	var def string
	require.NoError(t, db.QueryRowContext(ctx, "SELECT pg_get_functiondef($1::regproc)", d.Qualify("ack_orchestration_item")).Scan(&def))
	exec(t, db, strings.Replace(def, "BEGIN", "BEGIN\n    -- replaced by hand", 1))
	r := check(t, d, db)
	require.Equal(t, doctor.Critical, r.Status)
	require.Equal(t, doctor.Unknown, function(r, "ack_orchestration_item").Verdict)
	require.Equal(t, doctor.Fixed, function(r, "fetch_orchestration_item").Verdict)
	require.Contains(t, finding(r, "ack_orchestration_item").Action, "pg_get_functiondef")
}

// A database made by upstream's own runner has upstream's texts: doctor
// names them and sends the DBA to baseline first.
func TestRealProviderDatabaseIsUnfixedUpstreamAndNeedsABaseline(t *testing.T) {
	t.Parallel()
	d := dbs.RealProvider(t)
	r := check(t, d, openDB(t, d))
	require.Equal(t, doctor.Warning, r.Status, "%+v", r.Findings)
	require.Nil(t, r.GooseVersion)
	require.Equal(t, int64(23), *r.UpstreamVersion)
	for _, f := range r.Functions {
		require.Equal(t, doctor.Unfixed, f.Verdict, "%+v", f)
		require.Contains(t, f.Definition, "upstream ")
		require.Contains(t, f.Definition, "23")
		require.Contains(t, finding(r, f.Name).Action, "harness baseline")
	}
}

// The pack built a database at 21 (both fixes, rows 1..19); duroxide-pg's
// runner then applied upstream 20, 21 and 23, replacing 0021's ack with
// upstream 20's. doctor must not say OK: it names the replaced fix and
// the remedy, and migrate up restores it.
func TestAFixReplacedByDuroxidePgsRunnerIsAWarningThatMigrateUpRemedies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ackFix, ok := migrations.FixOf("ack_orchestration_item")
	require.True(t, ok)
	d := dbs.PackThenProvider(t, ackFix.Version)
	db := openDB(t, d)
	r := check(t, d, db)
	require.Equal(t, doctor.Warning, r.Status, "%+v", r.Findings)
	ack := finding(r, "ack_orchestration_item")
	require.Equal(t, doctor.Warning, ack.Severity)
	require.Contains(t, ack.Message, "duroxide-pg's runner replaced the fix")
	require.Contains(t, ack.Action, "harness migrate up")
	require.Equal(t, doctor.Replaced, function(r, "ack_orchestration_item").Verdict)
	require.Equal(t, 1, strings.Count(fmt.Sprint(r.Functions), "ack_orchestration_item"), "listed once")

	_, err := d.Runner(t).Up(ctx)
	require.NoError(t, err)
	r = check(t, d, db)
	require.Equal(t, doctor.OK, r.Status, "%+v", r.Findings)
	require.True(t, doctor.AllFixed(r.Functions))
}

func TestQueueAndLockFindingsAndReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := dbs.New(t, migrations.Latest())
	db := openDB(t, d)
	q := d.Qualify("orchestrator_queue")
	for i, n := range []int{50, 50, 3} {
		exec(t, db, "INSERT INTO "+q+" (instance_id, work_item, visible_at, created_at, attempt_count) VALUES ($1, '{}', now() - $2::interval, now(), $3)",
			[]string{"stuck", "stuck", "fine"}[i], fmt.Sprintf("%d minutes", 10-i), n)
	}
	nowMs := time.Now().UnixMilli()
	exec(t, db, "INSERT INTO "+d.Qualify("instance_locks")+" VALUES ('stuck', 't1', $1, $2), ('gone', 't2', $3, $3)",
		nowMs-60_000, nowMs-90_000, nowMs+60_000)

	r := check(t, d, db)
	require.Equal(t, doctor.Warning, r.Status)
	require.Len(t, r.Trapped, 1)
	require.Equal(t, "stuck", r.Trapped[0].InstanceID)
	require.Equal(t, int64(2), r.Trapped[0].Messages)
	require.Equal(t, int64(50), r.Trapped[0].MaxAttemptCount)
	require.Len(t, r.ExpiredLeases, 1)
	require.Equal(t, "stuck", r.ExpiredLeases[0].InstanceID)
	require.Len(t, r.OrphanLocks, 1)
	require.Equal(t, "gone", r.OrphanLocks[0].InstanceID)

	var screen bytes.Buffer
	r.Render(&screen)
	require.Contains(t, screen.String(), "WARNING")
	require.Contains(t, screen.String(), "stuck")
	raw, err := json.Marshal(r)
	require.NoError(t, err)
	require.Contains(t, string(raw), `"status":"warning"`)

	// Dry run: reports, changes nothing.
	rows, missing, err := doctor.ResetAttempts(ctx, db, d.Schema, []string{"stuck", "nobody"}, false)
	require.NoError(t, err)
	require.Equal(t, []doctor.ResetRow{{InstanceID: "stuck", Messages: 2, MaxAttemptCount: 50}}, rows)
	require.Equal(t, []string{"nobody"}, missing)
	require.Len(t, check(t, d, db).Trapped, 1)

	_, _, err = doctor.ResetAttempts(ctx, db, d.Schema, []string{"stuck"}, true)
	require.NoError(t, err)
	require.Empty(t, check(t, d, db).Trapped)
	var fine int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT attempt_count FROM "+q+" WHERE instance_id = 'fine'").Scan(&fine))
	require.Equal(t, 3, fine, "other instances are untouched")
}

func TestClockSkew(t *testing.T) {
	t.Parallel()
	d := dbs.New(t, migrations.Latest())
	r, err := doctor.Check(context.Background(), openDB(t, d), doctor.Options{Schema: d.Schema,
		Now: func() time.Time { return time.Now().Add(-time.Minute) }})
	require.NoError(t, err)
	require.Equal(t, doctor.Critical, r.Status)
	require.InDelta(t, 60_000, r.ClockSkewMs, 5_000)
	require.Contains(t, finding(r, "clock").Message, "ahead of")
}

func TestNoSchema(t *testing.T) {
	t.Parallel()
	d := dbs.New(t, 0)
	r := check(t, d, openDB(t, d))
	require.Equal(t, doctor.Critical, r.Status)
	require.Contains(t, finding(r, "schema").Message, "no duroxide tables")
}

// TestQueueHeadsBrokenByADisabledTriggerAreCriticalUntilRepaired: with the
// heads' insert trigger disabled, a message enqueued has no head (the fetch
// cannot see it): doctor says critical, the metric counts it, and the
// repair doctor names brings it back to OK.
func TestQueueHeadsBrokenByADisabledTriggerAreCriticalUntilRepaired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := dbs.New(t, migrations.Latest())
	db := openDB(t, d)
	q := d.Qualify("orchestrator_queue")
	enqueue := func(instance string) {
		exec(t, db, "INSERT INTO "+q+" (instance_id, work_item, visible_at, created_at) VALUES ($1, '{}', now(), now())", instance)
	}
	enqueue("kept")
	r := check(t, d, db)
	require.Equal(t, doctor.OK, finding(r, "queue_heads").Severity, "%+v", r.Findings)
	require.NotNil(t, r.Heads)
	require.Zero(t, r.Heads.LateInstances)

	exec(t, db, "ALTER TABLE "+q+" DISABLE TRIGGER orchestrator_queue_heads_after_insert")
	enqueue("lost")
	r = check(t, d, db)
	f := finding(r, "queue_heads")
	require.Equal(t, doctor.Critical, f.Severity)
	require.Equal(t, doctor.Critical, r.Status)
	require.Contains(t, f.Message, "orchestrator_queue_heads_after_insert (disabled)")
	require.Equal(t, int64(1), r.Heads.LateInstances)
	require.Equal(t, "lost", r.Heads.Example)
	var prom bytes.Buffer
	require.NoError(t, r.WritePrometheus(&prom))
	require.Contains(t, prom.String(), `duroxide_doctor_queue_heads_late_instances{schema="duroxide"} 1`)
	require.Contains(t, prom.String(), `duroxide_doctor_queue_heads_disabled_triggers{schema="duroxide"} 1`)

	// Triggers enabled again, the head is still missing: still critical.
	exec(t, db, "ALTER TABLE "+q+" ENABLE TRIGGER orchestrator_queue_heads_after_insert")
	r = check(t, d, db)
	require.Equal(t, doctor.Critical, finding(r, "queue_heads").Severity)
	require.Contains(t, finding(r, "queue_heads").Message, "(e.g. lost)")

	// The repair doctor names: re-apply the heads' migration.
	var heads int64
	for _, m := range migrations.Fixes() {
		if slices.Contains(m.Adds, "table orchestrator_queue_heads") {
			heads = m.Version
		}
	}
	require.NotZero(t, heads, "a fix adds the heads table")
	action := finding(r, "queue_heads").Action
	require.Contains(t, action, fmt.Sprintf("migrate down --to %d", heads-1))
	runner := d.Runner(t)
	_, err := runner.DownTo(ctx, heads-1)
	require.NoError(t, err)
	_, err = runner.Up(ctx)
	require.NoError(t, err)
	r = check(t, d, db)
	require.Equal(t, doctor.OK, finding(r, "queue_heads").Severity, "%+v", finding(r, "queue_heads"))
	require.Zero(t, r.Heads.LateInstances)
	var n int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT count(*) FROM "+q).Scan(&n))
	require.Equal(t, 2, n, "the repair keeps the queue's messages")
}
