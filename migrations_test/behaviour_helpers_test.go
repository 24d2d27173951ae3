package migrations_test

// Helpers for the behaviour tests (behaviour_*_test.go): they drive the
// functions of a database at one pack version the way duroxide-pg does,
// always schema-qualified, on a pool whose sessions have an empty
// search_path. Time is the caller's clock: every p_now_ms is chosen by the
// test, so "time passes" by passing a larger value.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/packfacts"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

const (
	// clock0 is the test clock's origin (2099-12-03 17:33:20 UTC), in epoch
	// ms: the caller's clock runs ahead of the database's, as a caller's
	// clock may, so the fixes that take the later of both clocks take the
	// caller's, and every claim about values computed from p_now_ms holds
	// unchanged at every version (the fixes' own tests give them a clock
	// that lags).
	clock0 int64 = 4_100_000_000_000
	// lockMs is the orchestration/worker lock timeout the tests pass (the
	// runtime's default of 5 s).
	lockMs int64 = 5_000
)

// lockTokenRE is the lock token format: 'lock_' and a lowercase UUID.
var lockTokenRE = regexp.MustCompile(`^lock_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// schemaDB is one test's database at one pack version and the pool that
// talks to it.
type schemaDB struct {
	t       *testing.T
	db      *testdb.Database
	pool    *pgxpool.Pool
	version int64 // the pack version it is migrated to (0: not the pack's)
}

// newAtVersion gives t a database of its own migrated to pack version
// version (the helpers work on any version from the last port of
// upstream's own history on: later migrations keep its catalog).
func newAtVersion(t *testing.T, version int64) *schemaDB {
	t.Helper()
	db := dbs.New(t, version)
	return &schemaDB{t: t, db: db, pool: db.PgxPool(t), version: version}
}

// behaviourVersions are the pack versions every behaviour suite runs at:
// the last port of upstream's own history (the schema duroxide-pg's
// releases had before any fix of the pack) and every later version, fixes
// and later ports alike. All of it is read from sql/.
func behaviourVersions() []int64 {
	var out []int64
	for _, m := range migrations.MustPack() {
		if m.Version >= packfacts.LastContiguousPort() {
			out = append(out, m.Version)
		}
	}
	return out
}

// atEveryVersion runs body once per behaviourVersions, each as a parallel
// subtest "at NNNN" with one database of its own; fresh empties it and
// hands it to one claim (see sharedSuite).
func atEveryVersion(t *testing.T, body func(t *testing.T, fresh func(*testing.T) *schemaDB)) {
	t.Helper()
	atVersions(t, behaviourVersions(), body)
}

// atEveryVersionWithout is atEveryVersion restricted to the versions that
// still hold upstream's definition of function: the claims about a defect
// the pack's fix of function removes (the fix's own tests claim the
// opposite from the fix on).
func atEveryVersionWithout(t *testing.T, function string, body func(t *testing.T, fresh func(*testing.T) *schemaDB)) {
	t.Helper()
	fix, ok := migrations.FixOf(function)
	require.True(t, ok, "the pack has no fix of %s", function)
	var versions []int64
	for _, v := range behaviourVersions() {
		if v < fix.Version {
			versions = append(versions, v)
		}
	}
	atVersions(t, versions, body)
}

func atVersions(t *testing.T, versions []int64, body func(t *testing.T, fresh func(*testing.T) *schemaDB)) {
	t.Helper()
	require.NotEmpty(t, versions, "no pack version to run at")
	t.Parallel()
	for _, v := range versions {
		t.Run(fmt.Sprintf("at %04d", v), func(t *testing.T) {
			t.Parallel()
			body(t, sharedSuite(t, newAtVersion(t, v)))
		})
	}
}

// hasFix reports whether h's version carries the pack's fix of function:
// where a claim's expectation changes with a fix, the claim asks this
// rather than naming a version.
func (h *schemaDB) hasFix(function string) bool {
	fix, ok := migrations.FixOf(function)
	return ok && h.version >= fix.Version
}

// sharedSuite gives the subtests of t the one database shared (cloning a
// database per claim would dominate the run time). The returned fresh
// empties every table of the schema but goose's and duroxide-pg's
// bookkeeping, and hands the database to one subtest; subtests that share
// it therefore run one after another, each on an empty schema, and every
// function call stays one autocommit statement as duroxide-pg issues it.
// Sequences are not reset: tests compare ids, never their values.
func sharedSuite(t *testing.T, shared *schemaDB) (fresh func(t *testing.T) *schemaDB) {
	t.Helper()
	var tables string
	shared.scan(`SELECT string_agg(format('%I.%I', schemaname, tablename), ', ' ORDER BY tablename)
		FROM pg_tables WHERE schemaname = 'duroxide'
		AND tablename NOT IN ('_duroxide_migrations', 'goose_db_version')`, nil, &tables)
	return func(st *testing.T) *schemaDB {
		st.Helper()
		_, err := shared.pool.Exec(shared.ctx(), "TRUNCATE "+tables)
		require.NoError(st, err, "empty the tables")
		return shared.on(st)
	}
}

func (h *schemaDB) ctx() context.Context { return context.Background() }

// on is h reporting to t: for subtests that read a database another test
// prepared.
func (h *schemaDB) on(t *testing.T) *schemaDB {
	c := *h
	c.t = t
	return &c
}

// exec runs sql and requires it to succeed.
func (h *schemaDB) exec(sql string, args ...any) {
	h.t.Helper()
	_, err := h.pool.Exec(h.ctx(), sql, args...)
	require.NoError(h.t, err, sql)
}

// try runs sql and returns its error.
func (h *schemaDB) try(sql string, args ...any) error {
	_, err := h.pool.Exec(h.ctx(), sql, args...)
	return err
}

// scan runs a one-row query and scans it into dst.
func (h *schemaDB) scan(sql string, args []any, dst ...any) {
	h.t.Helper()
	require.NoError(h.t, h.pool.QueryRow(h.ctx(), sql, args...).Scan(dst...), sql)
}

// count counts the rows of duroxide.<table> matching where.
func (h *schemaDB) count(table, where string, args ...any) int64 {
	h.t.Helper()
	var n int64
	h.scan("SELECT count(*) FROM duroxide."+table+" WHERE "+where, args, &n)
	return n
}

// texts runs a query returning one text column.
func (h *schemaDB) texts(sql string, args ...any) []string {
	h.t.Helper()
	rows, err := h.pool.Query(h.ctx(), sql, args...)
	require.NoError(h.t, err, sql)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(h.t, err, sql)
	if out == nil {
		out = []string{}
	}
	return out
}

// requirePgError asserts err is a PostgreSQL error with that SQLSTATE and,
// when message is not empty, exactly that message.
func requirePgError(t *testing.T, err error, code, message string) {
	t.Helper()
	require.Error(t, err)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want a PostgreSQL error, got %v", err)
	require.Equal(t, code, pgErr.Code, "SQLSTATE of %q", pgErr.Message)
	if message != "" {
		require.Equal(t, message, pgErr.Message)
	}
}

// msTime is the timestamptz the functions compute for epoch-ms x.
func msTime(x int64) time.Time { return time.UnixMilli(x).UTC() }

func ptrTo[T any](v T) *T { return &v }

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// ---------------------------------------------------------------------------
// Work items and events, in the runtime's JSON shapes.

func startItem(instance, orchestration string, version any, executionID int64) string {
	return fmt.Sprintf(`{"StartOrchestration":{"instance":%q,"orchestration":%q,"input":"{}","version":%s,"parent_instance":null,"parent_id":null,"execution_id":%d}}`,
		instance, orchestration, jsonValue(version), executionID)
}

func childStartItem(instance, orchestration, parent string) string {
	return fmt.Sprintf(`{"StartOrchestration":{"instance":%q,"orchestration":%q,"input":"{}","version":"1.0.0","parent_instance":%q,"parent_id":2,"execution_id":1}}`,
		instance, orchestration, parent)
}

func externalItem(instance, name string) string {
	return fmt.Sprintf(`{"ExternalRaised":{"instance":%q,"name":%q,"data":"{}"}}`, instance, name)
}

func queueMessageItem(instance, data string) string {
	return fmt.Sprintf(`{"QueueMessage":{"instance":%q,"name":"inbox","data":%q}}`, instance, data)
}

func activityCompletedItem(instance string, executionID, id int64) string {
	return fmt.Sprintf(`{"ActivityCompleted":{"instance":%q,"execution_id":%d,"id":%d,"result":"\"ok\""}}`, instance, executionID, id)
}

func continueAsNewItem(instance, orchestration, version string) string {
	return fmt.Sprintf(`{"ContinueAsNew":{"instance":%q,"orchestration":%q,"input":"{}","version":%q,"carry_forward_events":[]}}`,
		instance, orchestration, version)
}

func timerFiredItem(instance string, executionID, id, fireAtMs int64) string {
	return fmt.Sprintf(`{"TimerFired":{"instance":%q,"execution_id":%d,"id":%d,"fire_at_ms":%d}}`, instance, executionID, id, fireAtMs)
}

func subOrchCompletedItem(parent string) string {
	return fmt.Sprintf(`{"SubOrchCompleted":{"parent_instance":%q,"parent_execution_id":1,"parent_id":3,"result":"\"ok\""}}`, parent)
}

func activityExecuteItem(instance string, executionID, id int64, session, tag any) string {
	extra := ""
	if session != nil {
		extra += fmt.Sprintf(`,"session_id":%q`, session)
	}
	if tag != nil {
		extra += fmt.Sprintf(`,"tag":%q`, tag)
	}
	return fmt.Sprintf(`{"ActivityExecute":{"instance":%q,"execution_id":%d,"id":%d,"name":"Charge","input":"\"x\""%s}}`,
		instance, executionID, id, extra)
}

func jsonValue(v any) string {
	if v == nil {
		return "null"
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// eventJSON is the JSON text of one history Event; fields are extra members
// written after "type", e.g. `"name":"X"`.
func eventJSON(instance string, executionID, eventID int64, typ string, fields ...string) string {
	extra := ""
	for _, f := range fields {
		extra += "," + f
	}
	return fmt.Sprintf(`{"event_id":%d,"source_event_id":null,"instance_id":%q,"execution_id":%d,"timestamp_ms":%d,"duroxide_version":"0.1.29","type":%q%s}`,
		eventID, instance, executionID, clock0, typ, extra)
}

func startedEvent(instance string, executionID int64, name, version string) string {
	return eventJSON(instance, executionID, 1, "OrchestrationStarted",
		fmt.Sprintf(`"name":%q`, name), fmt.Sprintf(`"version":%q`, version), `"input":"{}"`, `"parent_instance":null`, `"parent_id":null`)
}

// historyDelta is p_history_delta as the provider builds it: event_id, the constant
// event_type "Event", and the whole event as a JSON string.
func historyDelta(t *testing.T, events ...string) json.RawMessage {
	t.Helper()
	out := make([]map[string]any, 0, len(events))
	for _, e := range events {
		var head struct {
			EventID int64 `json:"event_id"`
		}
		require.NoError(t, json.Unmarshal([]byte(e), &head), e)
		out = append(out, map[string]any{"event_id": head.EventID, "event_type": "Event", "event_data": e})
	}
	return mustJSON(t, out)
}

// rawArray is a JSON array of already-serialised JSON values.
func rawArray(items ...string) json.RawMessage {
	s := "["
	for i, it := range items {
		if i > 0 {
			s += ","
		}
		s += it
	}
	return json.RawMessage(s + "]")
}

// ackMeta is p_metadata with every key the provider always sends, set to null
// (kv_mutations to []), then overridden by kv (key, value, key, value...).
func ackMeta(t *testing.T, kv ...any) json.RawMessage {
	t.Helper()
	m := map[string]any{
		"orchestration_name": nil, "orchestration_version": nil, "status": nil, "output": nil,
		"parent_instance_id": nil, "pinned_duroxide_version": nil,
		"custom_status_action": nil, "custom_status_value": nil, "kv_mutations": []any{},
	}
	require.Zero(t, len(kv)%2, "ackMeta takes key/value pairs")
	for i := 0; i < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return mustJSON(t, m)
}

func pinVersion(major, minor, patch int) map[string]any {
	return map[string]any{"major": major, "minor": minor, "patch": patch}
}

func kvSet(key, value string, at int64) map[string]any {
	return map[string]any{"action": "set", "key": key, "value": value, "last_updated_at_ms": at}
}

func kvClearKey(key string) map[string]any { return map[string]any{"action": "clear_key", "key": key} }

func kvClearAll() map[string]any { return map[string]any{"action": "clear_all"} }

// ---------------------------------------------------------------------------
// Orchestration path.

// enqueueOrch is enqueue_orchestrator_work as the provider calls it: the
// three trailing arguments NULL.
func (h *schemaDB) enqueueOrch(instance, workItem string, visibleAtMs int64) {
	h.t.Helper()
	h.exec(`SELECT duroxide.enqueue_orchestrator_work($1, $2, $3, NULL, NULL, NULL)`, instance, workItem, msTime(visibleAtMs))
}

// kvEntry is one member of out_kv_snapshot.
type kvEntry struct {
	Value           string `json:"value"`
	LastUpdatedAtMs int64  `json:"last_updated_at_ms"`
}

// orchItem is the row fetch_orchestration_item returns.
type orchItem struct {
	Instance    string
	Name        *string
	Version     *string
	ExecutionID int64
	History     []json.RawMessage
	Messages    []json.RawMessage
	Token       string
	Attempts    int32
	KVRaw       json.RawMessage
	KV          map[string]kvEntry
}

// fetchOrchErr calls fetch_orchestration_item; min and max are nil for NULL.
// It returns nil when the function returns no row.
func (h *schemaDB) fetchOrchErr(nowMs, timeoutMs int64, minPacked, maxPacked any) (*orchItem, error) {
	rows, err := h.pool.Query(h.ctx(), `SELECT out_instance_id, out_orchestration_name, out_orchestration_version,
		out_execution_id, out_history, out_messages, out_lock_token, out_attempt_count, out_kv_snapshot
		FROM duroxide.fetch_orchestration_item($1, $2, $3, $4)`, nowMs, timeoutMs, minPacked, maxPacked)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var items []*orchItem
	for rows.Next() {
		var it orchItem
		var hist, msgs, kv []byte
		if err := rows.Scan(&it.Instance, &it.Name, &it.Version, &it.ExecutionID, &hist, &msgs, &it.Token, &it.Attempts, &kv); err != nil {
			return nil, err
		}
		if err := json.Unmarshal(hist, &it.History); err != nil {
			return nil, fmt.Errorf("out_history %s: %w", hist, err)
		}
		if err := json.Unmarshal(msgs, &it.Messages); err != nil {
			return nil, fmt.Errorf("out_messages %s: %w", msgs, err)
		}
		it.KVRaw = kv
		if err := json.Unmarshal(kv, &it.KV); err != nil {
			return nil, fmt.Errorf("out_kv_snapshot %s: %w", kv, err)
		}
		items = append(items, &it)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(items) > 1 {
		return nil, fmt.Errorf("fetch_orchestration_item returned %d rows", len(items))
	}
	if len(items) == 0 {
		return nil, nil
	}
	return items[0], nil
}

// fetchOrch fetches without a version filter and requires success.
func (h *schemaDB) fetchOrch(nowMs int64) *orchItem {
	h.t.Helper()
	it, err := h.fetchOrchErr(nowMs, lockMs, nil, nil)
	require.NoError(h.t, err)
	return it
}

// mustFetchOrch fetches and requires a row for instance.
func (h *schemaDB) mustFetchOrch(nowMs int64, instance string) *orchItem {
	h.t.Helper()
	it := h.fetchOrch(nowMs)
	require.NotNil(h.t, it, "fetch at %d returned no row, want instance %s", nowMs, instance)
	require.Equal(h.t, instance, it.Instance)
	return it
}

// turn is the payload of one ack_orchestration_item call. Nil arrays are
// sent as [], a nil Meta as the all-null metadata.
type turn struct {
	ExecutionID int64
	History     json.RawMessage
	Worker      json.RawMessage
	Orch        json.RawMessage
	Meta        json.RawMessage
	Cancelled   json.RawMessage
}

func (h *schemaDB) ackErr(token string, nowMs int64, tr turn) error {
	or := func(v json.RawMessage, d string) json.RawMessage {
		if v == nil {
			return json.RawMessage(d)
		}
		return v
	}
	if tr.ExecutionID == 0 {
		tr.ExecutionID = 1
	}
	if tr.Meta == nil {
		tr.Meta = ackMeta(h.t)
	}
	return h.try(`SELECT duroxide.ack_orchestration_item($1, $2, $3, $4, $5, $6, $7, $8)`,
		token, nowMs, tr.ExecutionID, or(tr.History, "[]"), or(tr.Worker, "[]"), or(tr.Orch, "[]"), tr.Meta, or(tr.Cancelled, "[]"))
}

func (h *schemaDB) ack(token string, nowMs int64, tr turn) {
	h.t.Helper()
	require.NoError(h.t, h.ackErr(token, nowMs, tr))
}

// startInstance runs the first turn of a new orchestration at nowMs:
// enqueue StartOrchestration, fetch it, ack OrchestrationStarted with the
// given metadata (name, version, status Running and extra key/values).
func (h *schemaDB) startInstance(instance, name, version string, nowMs int64, extra ...any) {
	h.t.Helper()
	h.enqueueOrch(instance, startItem(instance, name, version, 1), nowMs)
	it := h.mustFetchOrch(nowMs, instance)
	kv := append([]any{"orchestration_name", name, "orchestration_version", version, "status", "Running"}, extra...)
	h.ack(it.Token, nowMs+1, turn{
		History: historyDelta(h.t, startedEvent(instance, 1, name, version)),
		Meta:    ackMeta(h.t, kv...),
	})
}

// orchRow is one orchestrator_queue row.
type orchRow struct {
	ID          int64
	Instance    string
	WorkItem    string
	VisibleAt   time.Time
	Token       *string
	LockedUntil *int64
	CreatedAt   time.Time
	Attempts    int32
}

func (h *schemaDB) orchRows() []orchRow {
	h.t.Helper()
	rows, err := h.pool.Query(h.ctx(), `SELECT id, instance_id, work_item, visible_at, lock_token, locked_until, created_at, attempt_count
		FROM duroxide.orchestrator_queue ORDER BY id`)
	require.NoError(h.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[orchRow])
	require.NoError(h.t, err)
	return out
}

// instanceLock is the instance_locks row of an instance, nil if none.
type instanceLock struct {
	Token       string
	LockedUntil int64
	LockedAt    int64
}

func (h *schemaDB) instanceLock(instance string) *instanceLock {
	h.t.Helper()
	rows, err := h.pool.Query(h.ctx(), `SELECT lock_token, locked_until, locked_at FROM duroxide.instance_locks WHERE instance_id = $1`, instance)
	require.NoError(h.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[instanceLock])
	require.NoError(h.t, err)
	require.LessOrEqual(h.t, len(out), 1)
	if len(out) == 0 {
		return nil
	}
	return &out[0]
}

// ---------------------------------------------------------------------------
// Worker path.

// workItem is the row fetch_work_item returns.
type workItem struct {
	WorkItem string
	Token    string
	Attempts int32
}

// fetchWork calls fetch_work_item with every argument given (nil → NULL)
// and returns nil when no row comes back.
func (h *schemaDB) fetchWork(nowMs, timeoutMs int64, owner, sessionTimeout any, tags []string, mode any) *workItem {
	h.t.Helper()
	rows, err := h.pool.Query(h.ctx(), `SELECT out_work_item, out_lock_token, out_attempt_count
		FROM duroxide.fetch_work_item($1, $2, $3, $4, $5, $6)`, nowMs, timeoutMs, owner, sessionTimeout, tags, mode)
	require.NoError(h.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[workItem])
	require.NoError(h.t, err)
	require.LessOrEqual(h.t, len(out), 1)
	if len(out) == 0 {
		return nil
	}
	return &out[0]
}

// fetchDefault is a non-session, default_only fetch as the provider sends it.
func (h *schemaDB) fetchDefault(nowMs int64) *workItem {
	h.t.Helper()
	return h.fetchWork(nowMs, lockMs, nil, nil, []string{}, "default_only")
}

// enqueueWork is enqueue_worker_work with identity columns NULL except the
// session and tag given (nil → NULL).
func (h *schemaDB) enqueueWork(item string, nowMs int64, session, tag any) {
	h.t.Helper()
	h.exec(`SELECT duroxide.enqueue_worker_work($1, $2, NULL, NULL, NULL, $3, $4)`, item, nowMs, session, tag)
}

// workerRow is one worker_queue row.
type workerRow struct {
	ID          int64
	WorkItem    string
	VisibleAt   time.Time
	Token       *string
	LockedUntil *int64
	CreatedAt   time.Time
	Attempts    int32
	Instance    *string
	ExecutionID *int64
	ActivityID  *int64
	Session     *string
	Tag         *string
}

func (h *schemaDB) workerRows() []workerRow {
	h.t.Helper()
	rows, err := h.pool.Query(h.ctx(), `SELECT id, work_item, visible_at, lock_token, locked_until, created_at, attempt_count,
		instance_id, execution_id, activity_id, session_id, tag FROM duroxide.worker_queue ORDER BY id`)
	require.NoError(h.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[workerRow])
	require.NoError(h.t, err)
	return out
}

// sessionRow is one sessions row.
type sessionRow struct {
	Worker         string
	LockedUntil    int64
	LastActivityAt int64
}

func (h *schemaDB) session(id string) *sessionRow {
	h.t.Helper()
	rows, err := h.pool.Query(h.ctx(), `SELECT worker_id, locked_until, last_activity_at FROM duroxide.sessions WHERE session_id = $1`, id)
	require.NoError(h.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[sessionRow])
	require.NoError(h.t, err)
	if len(out) == 0 {
		return nil
	}
	return &out[0]
}
