package migrations_test

// Upstream's continued-as-new ack: its unreleased branch file
// 0024_continue_as_new_completed_at.sql (our port of it,
// internal/testenv/upstream/inflight), applied the way duroxide-pg's
// runner applies a file. On a database the real provider made it does
// what the published facts say; on a database the pack adopted and fixed
// it replaces 0021's fix, and 0021's Up run again (what a restore runs)
// puts the lease lock back without losing the completion times; 0022 run
// over it leaves it; 0021's Down takes the lock away again and nothing
// else. The branch file's version (24) collides with upstream's candidate
// fix: it is looked up by its file.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/baseline"
	"github.com/duroxide-pg/migrations/harness/ops/fingerprint"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

const ackName = "ack_orchestration_item"

// continuedAck is the pack's entry for the branch file (by file: its
// version is also the candidate fix's).
func continuedAck(t *testing.T) fingerprint.Unreleased {
	t.Helper()
	for _, u := range fingerprint.UnreleasedMigrations() {
		if u.File == upstream.InFlightContinuedAck {
			return u
		}
	}
	t.Fatalf("harness/ops/fingerprint/upstream/unreleased.json has no entry for %s", upstream.InFlightContinuedAck)
	return fingerprint.Unreleased{}
}

// ackOf is the installed ack and its fingerprints.
func ackOf(t *testing.T, db *testdb.Database) fingerprint.Function {
	t.Helper()
	funcs, err := fingerprint.Take(context.Background(), sqlDB(t, db), db.Schema)
	require.NoError(t, err)
	var found []fingerprint.Function
	for _, f := range funcs {
		if f.Name == ackName {
			found = append(found, f)
		}
	}
	require.Len(t, found, 1, "one %s in schema %s", ackName, db.Schema)
	return found[0]
}

// packContinuedAcks are the pack's two texts of the continued-as-new
// behaviour (24): the fix a restore installs (the newest fix's body for
// that behaviour, as the restore picks it) and 0021's Down's unfixed one.
func packContinuedAcks(t *testing.T) (fixed, unfixed string) {
	t.Helper()
	fix, def, ok := migrations.FixFor(ackName, 24, migrations.Latest())
	require.True(t, ok, "the pack has a fix of the continued-as-new ack")
	require.EqualValues(t, 21, fix.Version, "0021 fixes it")
	require.Contains(t, def.Behaviours, int64(24))
	require.Contains(t, def.Source, "FOR UPDATE", "the fix locks the lease row")
	for _, k := range fix.Known {
		if k.Function == ackName && k.BehavesAs == 24 && !k.Fixed && strings.HasPrefix(k.Definition, "pack") {
			unfixed = k.Fingerprint
		}
	}
	require.NotEmpty(t, unfixed, "0021's guard knows the pack's unfixed continued-as-new ack")
	require.True(t, slices.ContainsFunc(fix.Definitions, func(d migrations.Definition) bool {
		return d.Down && d.Function == ackName && d.Fingerprint() == unfixed
	}), "0021's Down installs it")
	return def.Fingerprint(), unfixed
}

// noticeConn is a connection to db that collects the notices and warnings
// the server sends it.
func noticeConn(t *testing.T, db *testdb.Database) (*pgx.Conn, *[]*pgconn.Notice) {
	t.Helper()
	cfg, err := pgx.ParseConfig(db.DSN)
	require.NoError(t, err)
	notices := &[]*pgconn.Notice{}
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { *notices = append(*notices, n) }
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn, notices
}

// applyContinuedAck applies our port of the branch file to db as
// upstream's runner applies a file, and returns what the server said.
func applyContinuedAck(t *testing.T, db *testdb.Database) []*pgconn.Notice {
	t.Helper()
	text, err := upstream.InFlightPort(upstream.InFlightContinuedAck)
	require.NoError(t, err)
	conn, notices := noticeConn(t, db)
	require.NoError(t, upstream.ApplyMigration(context.Background(), conn, db.Schema, upstream.InFlightContinuedAck, text))
	return *notices
}

// runSection runs one section (Up or Down) of pack migration v on db by
// itself, in one transaction, with the search_path goose gives it (what a
// restore runs, and what the doctor's remedy tells a DBA to run), after
// prelude (when not empty) in the same transaction, and returns what the
// server said and the error.
func runSection(t *testing.T, db *testdb.Database, prelude string, v int64, up bool) ([]*pgconn.Notice, error) {
	t.Helper()
	ctx := context.Background()
	m, ok := migrations.ByVersion(v)
	require.True(t, ok)
	section := m.Down
	if up {
		section = m.Up
	}
	conn, notices := noticeConn(t, db)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SET LOCAL search_path TO "+migrate.SearchPath(db.Schema))
	require.NoError(t, err)
	if prelude != "" {
		_, err = tx.Exec(ctx, prelude)
		require.NoError(t, err, prelude)
	}
	if _, err := tx.Exec(ctx, section, pgx.QueryExecModeSimpleProtocol); err != nil {
		return *notices, err
	}
	return *notices, tx.Commit(ctx)
}

func noticeTexts(ns []*pgconn.Notice) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.Severity+": "+n.Message)
	}
	return out
}

// execEnd is how an executions row ended, as the ack leaves it.
type execEnd struct {
	Status      string
	CompletedAt *time.Time
}

func (h *schemaDB) execEnd(instance string, executionID int64) execEnd {
	h.t.Helper()
	var e execEnd
	h.scan(`SELECT status, completed_at FROM duroxide.executions WHERE instance_id = $1 AND execution_id = $2`,
		[]any{instance, executionID}, &e.Status, &e.CompletedAt)
	if e.CompletedAt != nil {
		utc := e.CompletedAt.UTC()
		e.CompletedAt = &utc
	}
	return e
}

// seededExecutions are executions the ack in place before the branch file
// wrote, and what the backfill must make of them.
type seededExecutions struct {
	// withEvent went ContinuedAsNew in a turn acked at canAt that appended
	// an OrchestrationContinuedAsNew event; withoutEvent went
	// ContinuedAsNew without one; completed completed at completedAt.
	withEvent, withoutEvent, completed string
	canAt, completedAt                 int64
}

// seedExecutions runs, from base on, three orchestrations to their end
// with the ack in place: at upstream 20..23 (and the pack's fixes of them)
// a ContinuedAsNew execution keeps completed_at NULL.
func seedExecutions(h *schemaDB, base int64) seededExecutions {
	h.t.Helper()
	s := seededExecutions{
		withEvent: fmt.Sprintf("seed-can-event-%d", base), withoutEvent: fmt.Sprintf("seed-can-bare-%d", base),
		completed: fmt.Sprintf("seed-done-%d", base),
		canAt:     base + 10_001, completedAt: base + 30_001,
	}
	h.startInstance(s.withEvent, "Loop", "1.0.0", base)
	h.nextTurn(s.withEvent, base+10_000, turn{
		History: historyDelta(h.t, eventJSON(s.withEvent, 1, 2, "OrchestrationContinuedAsNew", `"input":"{}"`)),
		Meta:    ackMeta(h.t, "status", "ContinuedAsNew"),
	})
	h.startInstance(s.withoutEvent, "Loop", "1.0.0", base+15_000)
	h.nextTurn(s.withoutEvent, base+20_000, turn{Meta: ackMeta(h.t, "status", "ContinuedAsNew")})
	h.startInstance(s.completed, "Once", "1.0.0", base+25_000)
	h.nextTurn(s.completed, base+30_000, turn{Meta: ackMeta(h.t, "status", "Completed", "output", `"done"`)})

	for _, inst := range []string{s.withEvent, s.withoutEvent} {
		require.Equal(h.t, execEnd{Status: "ContinuedAsNew"}, h.execEnd(inst, 1),
			"%s: before the branch file a ContinuedAsNew turn leaves completed_at NULL", inst)
	}
	require.Equal(h.t, execEnd{Status: "Completed", CompletedAt: ptrTo(msTime(s.completedAt))}, h.execEnd(s.completed, 1))
	return s
}

// requireBackfilled checks what the branch file's backfill made of s.
func requireBackfilled(t *testing.T, h *schemaDB, s seededExecutions) {
	t.Helper()
	h = h.on(t)
	require.Equal(t, execEnd{Status: "ContinuedAsNew", CompletedAt: ptrTo(msTime(s.canAt))}, h.execEnd(s.withEvent, 1),
		"completed_at is the created_at of the OrchestrationContinuedAsNew event")
	require.Equal(t, execEnd{Status: "ContinuedAsNew"}, h.execEnd(s.withoutEvent, 1),
		"no OrchestrationContinuedAsNew event: completed_at stays NULL")
	require.Equal(t, execEnd{Status: "Completed", CompletedAt: ptrTo(msTime(s.completedAt))}, h.execEnd(s.completed, 1),
		"a Completed execution is not the backfill's")
}

// seededRows reads the executions of the seeded instances.
func (h *schemaDB) seededRows(s seededExecutions) map[string]execEnd {
	h.t.Helper()
	out := map[string]execEnd{}
	for _, inst := range []string{s.withEvent, s.withoutEvent, s.completed} {
		out[inst] = h.execEnd(inst, 1)
	}
	return out
}

// requireContinuedAsNewCompletes checks, from base on, the behaviour the
// branch file gives the ack: every terminal turn (ContinuedAsNew,
// Completed, Failed) sets completed_at to the call's timestamp, a Running
// turn leaves it NULL, and a ContinuedAsNew turn folds kv_delta into
// kv_store.
func requireContinuedAsNewCompletes(t *testing.T, h *schemaDB, base int64) {
	t.Helper()
	h = h.on(t)
	for i, status := range []string{"ContinuedAsNew", "Completed", "Failed", "Running"} {
		inst := fmt.Sprintf("end-%s-%d", strings.ToLower(status), base)
		at := base + int64(i)*10_000
		h.startInstance(inst, "Loop", "1.0.0", at)
		require.Equal(t, execEnd{Status: "Running"}, h.execEnd(inst, 1))
		h.nextTurn(inst, at+5_000, turn{Meta: ackMeta(t, "status", status, "output", `"out"`)})
		want := execEnd{Status: status}
		if status != "Running" {
			want.CompletedAt = ptrTo(msTime(at + 5_001))
		}
		require.Equal(t, want, h.execEnd(inst, 1), "a %s turn", status)
	}

	inst := fmt.Sprintf("end-kv-%d", base)
	at := base + 50_000
	h.startInstance(inst, "Loop", "1.0.0", at)
	h.nextTurn(inst, at+1_000, turn{Meta: kvMeta(t, "Running", kvSet("a", "1", at+1_000))})
	require.Equal(t, []deltaRow{{Key: "a", Value: live("1"), UpdatedAt: at + 1_000}}, h.kvDelta(inst), "a Running turn writes the delta only")
	require.Empty(t, h.kvStore(inst))
	h.nextTurn(inst, at+2_000, turn{Meta: kvMeta(t, "ContinuedAsNew", kvSet("b", "2", at+2_000))})
	require.Empty(t, h.kvDelta(inst), "the ContinuedAsNew turn emptied the delta")
	require.Equal(t, []storeRow{
		{Key: "a", Value: "1", ExecutionID: 1, UpdatedAt: at + 1_000},
		{Key: "b", Value: "2", ExecutionID: 1, UpdatedAt: at + 2_000},
	}, h.kvStore(inst), "the ContinuedAsNew turn folded the delta into the store")
	require.Equal(t, execEnd{Status: "ContinuedAsNew", CompletedAt: ptrTo(msTime(at + 2_001))}, h.execEnd(inst, 1))
}

// ackRace is what happens to an ack that has passed its lease check and
// then waits (here on a history row another session is inserting).
type ackRace struct {
	// leaseRowLocked: meanwhile the instance_locks row cannot be locked
	// by another session (the ack holds it).
	leaseRowLocked bool
	// overtaken: meanwhile a fetch whose clock is past the lease took the
	// instance over.
	overtaken bool
	// left is how many of the instance's messages are queued once the ack
	// succeeded.
	left int
}

// raceAck runs the race of fix0021_test.go's ackInFlightOvertaken on b's
// database (whose fetch never waits on locks: 0020's and later), with a
// probe of the lease row's lock, then removes what the race left behind
// (a taken-over batch), so that later fetches meet an empty queue.
func raceAck(t *testing.T, b *fixBundle) ackRace {
	t.Helper()
	ctx := context.Background()
	instance := "race-" + fmt.Sprint(time.Now().UnixNano())
	b.enqueue(t, instance)
	const timeout = 2000
	now := b.dbNow(t)
	item, err := b.c.Fetch(ctx, b.pool, now, timeout, orch.RuntimeFilter())
	require.NoError(t, err)
	require.NotNil(t, item)
	require.Equal(t, instance, item.InstanceID)
	lease, err := b.c.ReadLease(ctx, b.pool, item.LockToken)
	require.NoError(t, err)

	blocker := b.db.Conn(t, "")
	tx, err := blocker.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "INSERT INTO "+b.db.Qualify("history")+
		" (instance_id, execution_id, event_id, event_type, event_data, created_at) VALUES ($1, 1, 1, 'Blocker', '{}', now())", instance)
	require.NoError(t, err)

	acker := b.db.Conn(t, "")
	var ackerPID int
	require.NoError(t, acker.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&ackerPID))
	delta := mustJSON(t, []map[string]any{{"event_id": 1, "event_type": "Event", "event_data": `{"event_id":1}`}})
	ackDone := make(chan error, 1)
	go func() {
		ackDone <- b.c.AckItem(ctx, acker, item.LockToken, now+10, orch.Ack{HistoryDelta: delta})
	}()
	waitUntilBlocked(t, b, ackerPID)

	var r ackRace
	probe := b.db.Conn(t, "")
	ptx, err := probe.Begin(ctx)
	require.NoError(t, err)
	_, err = ptx.Exec(ctx, "SELECT 1 FROM "+b.db.Qualify("instance_locks")+" WHERE instance_id = $1 FOR UPDATE NOWAIT", instance)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
	case errors.As(err, &pgErr) && pgErr.Code == "55P03":
		r.leaseRowLocked = true
	default:
		require.NoError(t, err, "probe the lease row's lock")
	}
	require.NoError(t, ptx.Rollback(ctx))

	taken, err := b.c.Fetch(ctx, b.pool, lease.LockedUntilMs+1, timeout, orch.RuntimeFilter())
	require.NoError(t, err)
	r.overtaken = taken != nil
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, <-ackDone, "the ack passed its check and succeeds once unblocked")
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*)::int FROM "+b.db.Qualify("orchestrator_queue")+" WHERE instance_id = $1", instance).Scan(&r.left))

	_, err = b.pool.Exec(ctx, "DELETE FROM "+b.db.Qualify("orchestrator_queue")+" WHERE instance_id = $1", instance)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "DELETE FROM "+b.db.Qualify("instance_locks")+" WHERE instance_id = $1", instance)
	require.NoError(t, err)
	return r
}

// adoptedLatest is a database the real provider made (upstream 1..21 and
// 23), adopted with `harness baseline` and taken to the pack's latest with
// `harness migrate up`: what a production database is once the pack fixed
// it.
func adoptedLatest(t *testing.T) *testdb.Database {
	t.Helper()
	provider := upstream.Require(t)
	return dbs.NewState(t, "real-provider-adopted-latest", 0, func(ctx context.Context, db *testdb.Database) error {
		if err := provider.Migrate(ctx, db.Source, db.Schema); err != nil {
			return err
		}
		conn, err := sql.Open("pgx", db.DSN)
		if err != nil {
			return err
		}
		defer conn.Close()
		if _, err := baseline.Run(ctx, conn, baseline.Options{Schema: db.Schema}); err != nil {
			return err
		}
		r, err := migrate.Open(ctx, db.Source.Config(), migrate.Options{Schema: db.Schema})
		if err != nil {
			return err
		}
		defer r.Close()
		_, err = r.Up(ctx)
		return err
	})
}

func recordedFile(t *testing.T, h *schemaDB, version int64) string {
	t.Helper()
	var name string
	h.scan(`SELECT name FROM duroxide._duroxide_migrations WHERE version = $1`, []any{version}, &name)
	return name
}

var backfillWarningRE = regexp.MustCompile(`^Migration 0024: (\d+) ContinuedAsNew execution\(s\) have no OrchestrationContinuedAsNew event; completed_at left NULL$`)

// (1) The port, applied by upstream's runner to a database the real
// provider made (upstream 1..21 and 23): a ContinuedAsNew turn records its
// completion time, as Completed and Failed turns do, a Running one does
// not, a ContinuedAsNew turn folds the KV delta, and the executions that
// went ContinuedAsNew before it are backfilled from their history.
func TestContinuedAckPortDoesWhatUpstreamsBranchFileDoes(t *testing.T) {
	t.Parallel()
	db := dbs.RealProvider(t)
	h := &schemaDB{t: t, db: db, pool: db.PgxPool(t)}
	seeds := seedExecutions(h, clock0)

	notices := applyContinuedAck(t, db)
	var warned []string
	for _, n := range notices {
		if n.Severity == "WARNING" {
			warned = append(warned, n.Message)
		}
	}
	require.Len(t, warned, 1, "one WARNING: %v", noticeTexts(notices))
	m := backfillWarningRE.FindStringSubmatch(warned[0])
	require.NotNil(t, m, "%q", warned[0])
	require.Equal(t, "1", m[1], "it counts the execution left without completed_at")
	require.Equal(t, upstream.InFlightContinuedAck, recordedFile(t, h, 24), "the runner recorded the file under its version")

	u := continuedAck(t)
	ack := ackOf(t, db)
	require.True(t, u.Holds(ack), "the ack is the port's text (%s): %+v", u.Fingerprints["port"], ack)
	d, ok := fingerprint.Identify(ack)
	require.True(t, ok)
	require.Equal(t, fingerprint.Provenance{Label: "upstream branch 0024 continued-as-new ack, port", BehavesAs: 24}, d)

	requireBackfilled(t, h, seeds)
	requireContinuedAsNewCompletes(t, h, clock0+100_000)
}

// (2) A database the pack adopted and fixed, then the branch file (a
// duroxide-pg release carrying it replaces 0021's fix on connect): the
// ack records completion times but no longer locks its lease, so an ack
// in flight is overtaken. 0021's Up run again, alone in one transaction
// (what a restore runs), installs 0021's fix of that behaviour: the lock
// is back, the completion times stay, and the backfill's results are left
// as upstream's file wrote them.
func TestContinuedAckIsRestoredWithItsLeaseLock(t *testing.T) {
	t.Parallel()
	db := adoptedLatest(t)
	h := &schemaDB{t: t, db: db, pool: db.PgxPool(t), version: migrations.Latest()}
	b := &fixBundle{db: db, pool: h.pool, c: orch.New(db.Schema)}
	fixed, _ := packContinuedAcks(t)
	require.True(t, fingerprint.FixedFrom(ackOf(t, db), 21), "the pack's latest has 0021's fix")

	seeds := seedExecutions(h, clock0)
	notices := applyContinuedAck(t, db)
	require.Equal(t, upstream.InFlightContinuedAck, recordedFile(t, h, 24))
	require.True(t, continuedAck(t).Holds(ackOf(t, db)), "the runner replaced 0021's fix with the branch file's ack")
	requireBackfilled(t, h, seeds)
	backfilled := h.seededRows(seeds)
	require.Len(t, notices, 2, "the WARNING and the closing NOTICE: %v", noticeTexts(notices))

	unfixed := raceAck(t, b)
	require.Equal(t, ackRace{leaseRowLocked: false, overtaken: true, left: 1}, unfixed,
		"the branch file's ack reads its lease without locking it: a fetch takes the batch over and it is processed twice")

	notices, err := runSection(t, db, "", 21, true)
	require.NoError(t, err, "0021's Up knows the branch file's ack: %v", noticeTexts(notices))
	require.Contains(t, noticeTexts(notices), "NOTICE: 0021: ack_orchestration_item was upstream branch 0024 continued-as-new ack, port; installing the fix for upstream 24 behaviour")
	ack := ackOf(t, db)
	require.True(t, ack.Matches(fixed), "0021's fix of the continued-as-new ack: %+v", ack)
	d, ok := fingerprint.Identify(ack)
	require.True(t, ok)
	require.Equal(t, fingerprint.Provenance{Label: "pack 0021 fix, upstream 24 behaviour", Fixed: true, BehavesAs: 24}, d)
	require.True(t, fingerprint.FixedFrom(ack, 21))
	require.Equal(t, backfilled, h.seededRows(seeds), "the restore leaves the backfill's results as upstream's file wrote them")
	require.Equal(t, upstream.InFlightContinuedAck, recordedFile(t, h, 24), "and upstream's row")

	requireContinuedAsNewCompletes(t, h, clock0+100_000)
	require.Equal(t, ackRace{leaseRowLocked: true, overtaken: false, left: 0}, raceAck(t, b),
		"the ack holds its lease row until it commits; the fetch skips the instance and the batch is consumed once")

	// Run again, the fix is installed again: nothing changes.
	_, err = runSection(t, db, "", 21, true)
	require.NoError(t, err)
	require.Equal(t, ack, ackOf(t, db))
}

// (3) A database the pack built to 0021 that duroxide-pg's runner then
// took to upstream 20, 21 and 23 and to the branch file: 0022 (the port of
// upstream 20), re-applied over it, must leave the continued-as-new ack as
// it is (installing 20's would undo upstream's later change); 0023 and
// 0024 (the ports of 21 and 23) do not touch the ack either. Each runs
// alone (goose's ApplyVersion: `migrate up` also runs the restore, which
// then installs 0021's fix of that behaviour).
func TestKVDeltaPortLeavesTheContinuedAck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbs.PackThenProvider(t, orchFixedStop())
	h := &schemaDB{t: t, db: db, pool: db.PgxPool(t)}
	require.NoError(t, upstream.ApplyInFlight(ctx, db.Source, db.Schema, upstream.InFlightContinuedAck))
	for v, file := range map[int64]string{20: "0020_add_kv_delta.sql", 21: "0021_add_get_instance_stats.sql", 23: "0023_partial_secondary_indexes.sql", 24: upstream.InFlightContinuedAck} {
		require.Equal(t, file, recordedFile(t, h, v), "the runner applied upstream %d", v)
	}
	before := ackOf(t, db)
	require.True(t, continuedAck(t).Holds(before))

	r := db.Runner(t)
	port, ok := migrations.PortOf(20)
	require.True(t, ok)
	require.EqualValues(t, orchFixedStop()+1, port.Version, "0022 comes right after 0021")
	for _, u := range []int64{20, 21, 23} {
		m, ok := migrations.PortOf(u)
		require.True(t, ok)
		require.NoError(t, r.ApplyVersion(ctx, m.Version, true), "%s over the continued-as-new ack", m.File)
		require.Equal(t, before, ackOf(t, db), "%s left the ack as it is", m.File)
	}
	requireContinuedAsNewCompletes(t, h, clock0)

	_, err := r.Up(ctx)
	require.NoError(t, err)
	fixed, _ := packContinuedAcks(t)
	require.True(t, ackOf(t, db).Matches(fixed), "`migrate up` restored 0021's fix of the continued-as-new ack")
	requireContinuedAsNewCompletes(t, h, clock0+100_000)

	// 0022's Down refuses over it: because upstream's later versions are
	// recorded, and, were their rows gone, because going down would put
	// 0021's fix of 19's ack in place of upstream's later one.
	_, err = runSection(t, db, "", port.Version, false)
	requireRefused(t, err, "above 20")
	_, err = runSection(t, db, "DELETE FROM _duroxide_migrations WHERE version > 20", port.Version, false)
	requireRefused(t, err, "is pack 0021 fix, upstream 24 behaviour, a change of upstream's after version 20 that going down would undo")
	require.True(t, ackOf(t, db).Matches(fixed), "the refused Downs changed nothing")
	require.Equal(t, upstream.InFlightContinuedAck, recordedFile(t, h, 24))
}

// requireRefused asserts err is a guard's refusal (55000) saying what.
func requireRefused(t *testing.T, err error, what string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "refused: %v", err)
	require.Equal(t, "55000", pgErr.Code, pgErr.Message)
	require.Contains(t, pgErr.Message, what)
}

// The ack block of 0022 leaves exactly the texts its guard knows as
// behaviour 24.
func TestKVDeltaPortLeavesTheAcksItsGuardKnowsAs24(t *testing.T) {
	port, ok := migrations.PortOf(20)
	require.True(t, ok)
	var guard []string
	for _, k := range port.Known {
		if !k.Down && k.Function == ackName && k.BehavesAs == 24 {
			guard = append(guard, k.Fingerprint)
		}
	}
	start := strings.Index(port.Up, "DO $ack$")
	require.GreaterOrEqual(t, start, 0, "0022's Up installs the ack in a block that can leave it")
	block := port.Up[start:]
	block = block[:strings.Index(block, "CREATE OR REPLACE FUNCTION")]
	left := regexp.MustCompile(`'([0-9a-f]{32})'`).FindAllStringSubmatch(block, -1)
	var listed []string
	for _, l := range left {
		listed = append(listed, l[1])
	}
	slices.Sort(guard)
	slices.Sort(listed)
	require.NotEmpty(t, guard)
	require.Equal(t, guard, listed)
	fixed, unfixed := packContinuedAcks(t)
	require.Contains(t, listed, fixed)
	require.Contains(t, listed, unfixed)
	require.Contains(t, listed, continuedAck(t).Fingerprints["port"])
}

// (4) 0021's Down over its fix of the continued-as-new ack restores the
// pack's unfixed text of that behaviour (the completion times stay, the
// lock goes); over an unfixed one (the pack's or the branch file's) it
// changes nothing; 0021's Up afterwards fixes it again.
func TestFix0021DownRestoresTheUnfixedContinuedAck(t *testing.T) {
	t.Parallel()
	db := adoptedLatest(t)
	h := &schemaDB{t: t, db: db, pool: db.PgxPool(t), version: migrations.Latest()}
	b := &fixBundle{db: db, pool: h.pool, c: orch.New(db.Schema)}
	fixed, unfixed := packContinuedAcks(t)
	applyContinuedAck(t, db)
	port := ackOf(t, db)

	// Over the branch file's text: left as it is.
	notices, err := runSection(t, db, "", 21, false)
	require.NoError(t, err)
	require.Contains(t, noticeTexts(notices), "NOTICE: 0021: ack_orchestration_item is upstream branch 0024 continued-as-new ack, port, which does not carry the fix: left as it is")
	require.Equal(t, port, ackOf(t, db))

	_, err = runSection(t, db, "", 21, true)
	require.NoError(t, err)
	require.True(t, ackOf(t, db).Matches(fixed))

	notices, err = runSection(t, db, "", 21, false)
	require.NoError(t, err, "%v", noticeTexts(notices))
	restored := ackOf(t, db)
	require.True(t, restored.Matches(unfixed), "the pack's unfixed continued-as-new ack: %+v", restored)
	d, ok := fingerprint.Identify(restored)
	require.True(t, ok)
	require.Equal(t, fingerprint.Provenance{Label: "pack, as upstream 24", BehavesAs: 24}, d)
	requireContinuedAsNewCompletes(t, h, clock0)
	require.Equal(t, ackRace{leaseRowLocked: false, overtaken: true, left: 1}, raceAck(t, b), "without the lock")

	// Again: the unfixed text is left as it is.
	notices, err = runSection(t, db, "", 21, false)
	require.NoError(t, err)
	require.Contains(t, noticeTexts(notices), "NOTICE: 0021: ack_orchestration_item is pack, as upstream 24, which does not carry the fix: left as it is")
	require.Equal(t, restored, ackOf(t, db))

	// And the Up knows it.
	_, err = runSection(t, db, "", 21, true)
	require.NoError(t, err)
	require.True(t, ackOf(t, db).Matches(fixed))
}
