package doctor_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/harness/doctor"
	"github.com/duroxide-pg/migrations/harness/pgtest"
	"github.com/duroxide-pg/migrations/harness/testdb"
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

// The shipped fingerprints are those of the pack's 0019 and 0020, whatever
// the schema is called. When this fails after an edit of sql/0019 or
// sql/0020 (or on a PostgreSQL that prints definitions differently), paste
// the values it prints into FingerprintV19/FingerprintV20 in doctor.go.
func TestReferenceFingerprints(t *testing.T) {
	t.Parallel()
	got := map[int64]string{}
	for _, v := range []int64{19, 20} {
		for _, p := range []*testdb.Pool{dbs, other} {
			d := p.New(t, v)
			fp, err := doctor.Fingerprint(context.Background(), openDB(t, d), d.Schema)
			require.NoError(t, err)
			require.NotEmpty(t, fp)
			if got[v] != "" {
				require.Equal(t, got[v], fp, "version %d: the fingerprint must not depend on the schema name", v)
			}
			got[v] = fp
		}
	}
	require.NotEqual(t, got[19], got[20])
	if got[19] != doctor.FingerprintV19 || got[20] != doctor.FingerprintV20 {
		t.Fatalf("reference fingerprints drifted; set in harness/doctor/doctor.go:\n\tFingerprintV19 = %q\n\tFingerprintV20 = %q", got[19], got[20])
	}
}

func TestVerdictAt20IsOK(t *testing.T) {
	t.Parallel()
	d := dbs.New(t, 20)
	r := check(t, d, openDB(t, d))
	require.Equal(t, doctor.OK, r.Status, "%+v", r.Findings)
	require.Equal(t, "fixed", r.Function.Verdict)
	require.Equal(t, int64(20), *r.GooseVersion)
	require.Equal(t, int64(19), *r.UpstreamVersion)
}

func TestVerdictAt19IsWarning(t *testing.T) {
	t.Parallel()
	d := other.New(t, 19)
	r := check(t, d, openDB(t, d))
	require.Equal(t, doctor.Warning, r.Status)
	require.Equal(t, "bug", r.Function.Verdict)
	require.Contains(t, finding(r, "fetch_orchestration_item").Action, "migrate up")
}

func TestVerdictWithAReplacedFunctionIsCritical(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := dbs.New(t, 20)
	db := openDB(t, d)
	var def string
	require.NoError(t, db.QueryRowContext(ctx, "SELECT pg_get_functiondef($1::regproc)", d.Qualify("fetch_orchestration_item")).Scan(&def))
	exec(t, db, strings.Replace(def, "BEGIN", "BEGIN\n    -- replaced by hand", 1))
	r := check(t, d, db)
	require.Equal(t, doctor.Critical, r.Status)
	require.Equal(t, "unknown", r.Function.Verdict)
	require.NotEmpty(t, finding(r, "fetch_orchestration_item").Action)
}

func TestQueueAndLockFindingsAndReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := dbs.New(t, 20)
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
	d := dbs.New(t, 20)
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
