package migrations_test

// Helpers for the behaviour tests of upstream duroxide-pg's versions 20
// and 21: the targets every claim runs on
// (the real upstream provider, and each pack version from the port of
// upstream 20 on), and readers of kv_delta, kv_store, the two KV read
// functions and get_instance_stats.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/packfacts"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// upstreamLevel is the newest upstream version the real provider applies:
// upstream.AddonPackage (0.1.29) runs 1..21 and 23.
const upstreamLevel = 23

// laterTarget is one kind of database the claims about upstream 20 and 21
// must hold on.
type laterTarget struct {
	// name is the subtest name: "upstream 0.1.29" or "pack 0022".
	name string
	// level is the newest upstream version whose behaviour the target has
	// (20 for the port of 0020 and fixes after it, 21 from the port of
	// 0021 on, 23 for the real provider).
	level int64
	// open gives t a database of its own of this kind.
	open func(t *testing.T) *schemaDB
}

// laterTargets lists the targets whose level is in [from, to] (to 0: no
// upper bound). The real provider is listed even where it is missing: its
// open skips with the reason (upstream.Require). The pack contributes every
// goose version from the port of upstream 20 to the newest, none while that
// port does not exist.
func laterTargets(from, to int64) []laterTarget {
	in := func(level int64) bool { return level >= from && (to == 0 || level <= to) }
	var out []laterTarget
	if in(upstreamLevel) {
		_, version, _ := strings.Cut(upstream.AddonPackage, "@")
		out = append(out, laterTarget{name: "upstream " + version, level: upstreamLevel, open: openUpstream})
	}
	port, ok := migrations.PortOf(20)
	if !ok {
		return out
	}
	for _, m := range migrations.MustPack() {
		if m.Version < port.Version || !in(packfacts.UpstreamAt(m.Version)) {
			continue
		}
		v := m.Version
		out = append(out, laterTarget{
			name:  fmt.Sprintf("pack %04d", v),
			level: packfacts.UpstreamAt(v),
			open:  func(t *testing.T) *schemaDB { t.Helper(); return newAtVersion(t, v) },
		})
	}
	return out
}

// openUpstream gives t an empty database into which the real provider's own
// runner applied upstream's migrations (skipping t when it is missing).
func openUpstream(t *testing.T) *schemaDB {
	t.Helper()
	p := upstream.Require(t)
	db := dbs.New(t, 0)
	require.NoError(t, p.Migrate(context.Background(), db.Source, db.Schema))
	return &schemaDB{t: t, db: db, pool: db.PgxPool(t)}
}

// eachLaterTarget runs body once per target of level in [from, to], each as
// a parallel subtest named after the target.
func eachLaterTarget(t *testing.T, from, to int64, body func(t *testing.T, tg laterTarget)) {
	t.Helper()
	for _, tg := range laterTargets(from, to) {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			body(t, tg)
		})
	}
}

// ---------------------------------------------------------------------------
// Acks.

// kvMeta is p_metadata with status and kv_mutations set (the other keys null).
func kvMeta(t *testing.T, status any, mutations ...any) json.RawMessage {
	t.Helper()
	return ackMeta(t, "status", status, "kv_mutations", append([]any{}, mutations...))
}

// turnErr runs one turn of instance: a message enqueued at now, fetched at
// now and acked with tr at now+1 (the ack's p_now_ms). It returns the
// lease's token and the ack's error.
func (h *schemaDB) turnErr(instance string, now int64, tr turn) (string, error) {
	h.t.Helper()
	h.enqueueOrch(instance, externalItem(instance, "tick"), now)
	it := h.mustFetchOrch(now, instance)
	return it.Token, h.ackErr(it.Token, now+1, tr)
}

// hist is one history row as an ack appends it.
type hist struct {
	ID   int64
	Data string
}

// histDelta is p_history_delta of the given rows, event_data verbatim.
func histDelta(t *testing.T, events ...hist) json.RawMessage {
	t.Helper()
	out := make([]map[string]any, 0, len(events))
	for _, e := range events {
		out = append(out, map[string]any{"event_id": e.ID, "event_type": "Event", "event_data": e.Data})
	}
	return mustJSON(t, out)
}

// instanceWith creates instance (execution 1, Running) with exactly the
// given history rows, in one ack at now+1.
func (h *schemaDB) instanceWith(instance string, now int64, events ...hist) {
	h.t.Helper()
	h.enqueueOrch(instance, startItem(instance, "P", "1.0.0", 1), now)
	it := h.mustFetchOrch(now, instance)
	h.ack(it.Token, now+1, turn{History: histDelta(h.t, events...),
		Meta: ackMeta(h.t, "orchestration_name", "P", "orchestration_version", "1.0.0", "status", "Running")})
}

// ---------------------------------------------------------------------------
// The two KV tables.

// deltaRow is one kv_delta row of an instance (Value nil: a tombstone).
type deltaRow struct {
	Key       string
	Value     *string
	UpdatedAt int64
}

func (h *schemaDB) kvDelta(instance string) []deltaRow {
	h.t.Helper()
	rows, err := h.pool.Query(h.ctx(), `SELECT key, value, last_updated_at_ms FROM duroxide.kv_delta
		WHERE instance_id = $1 ORDER BY key`, instance)
	require.NoError(h.t, err)
	defer rows.Close()
	out := []deltaRow{}
	for rows.Next() {
		var r deltaRow
		require.NoError(h.t, rows.Scan(&r.Key, &r.Value, &r.UpdatedAt))
		out = append(out, r)
	}
	require.NoError(h.t, rows.Err())
	return out
}

// storeRow is one kv_store row of an instance.
type storeRow struct {
	Key         string
	Value       string
	ExecutionID int64
	UpdatedAt   int64
}

func (h *schemaDB) kvStore(instance string) []storeRow {
	h.t.Helper()
	rows, err := h.pool.Query(h.ctx(), `SELECT key, value, execution_id, last_updated_at_ms FROM duroxide.kv_store
		WHERE instance_id = $1 ORDER BY key`, instance)
	require.NoError(h.t, err)
	defer rows.Close()
	out := []storeRow{}
	for rows.Next() {
		var r storeRow
		require.NoError(h.t, rows.Scan(&r.Key, &r.Value, &r.ExecutionID, &r.UpdatedAt))
		out = append(out, r)
	}
	require.NoError(h.t, rows.Err())
	return out
}

// seedStore writes kv_store rows directly: the state as of the instance's
// last terminal turn.
func (h *schemaDB) seedStore(instance string, executionID, updatedAt int64, keyValues ...string) {
	h.t.Helper()
	require.Zero(h.t, len(keyValues)%2, "seedStore takes key/value pairs")
	for i := 0; i < len(keyValues); i += 2 {
		h.exec(`INSERT INTO duroxide.kv_store (instance_id, key, value, execution_id, last_updated_at_ms) VALUES ($1, $2, $3, $4, $5)`,
			instance, keyValues[i], keyValues[i+1], executionID, updatedAt)
	}
}

// seedDelta writes one kv_delta row directly (value nil: a tombstone).
func (h *schemaDB) seedDelta(instance, key string, value *string, updatedAt int64) {
	h.t.Helper()
	h.exec(`INSERT INTO duroxide.kv_delta (instance_id, key, value, last_updated_at_ms) VALUES ($1, $2, $3, $4)`,
		instance, key, value, updatedAt)
}

// live is a live kv_delta value.
func live(v string) *string { return &v }

// ---------------------------------------------------------------------------
// Read functions.

// kvValue is one row of get_kv_value.
type kvValue struct {
	Value *string
	Found bool
}

// getKVValue returns every row get_kv_value gives (nil arguments: NULL).
func (h *schemaDB) getKVValue(instance, key any) []kvValue {
	h.t.Helper()
	rows, err := h.pool.Query(h.ctx(), `SELECT out_value, out_found FROM duroxide.get_kv_value($1, $2)`, instance, key)
	require.NoError(h.t, err)
	defer rows.Close()
	out := []kvValue{}
	for rows.Next() {
		var r kvValue
		require.NoError(h.t, rows.Scan(&r.Value, &r.Found))
		out = append(out, r)
	}
	require.NoError(h.t, rows.Err())
	return out
}

// getKVAll returns get_kv_all_values' rows as key → value, requiring that
// no value is NULL and no key repeats (the provider collects a HashMap of
// (String, String)).
func (h *schemaDB) getKVAll(instance any) map[string]string {
	h.t.Helper()
	rows, err := h.pool.Query(h.ctx(), `SELECT out_key, out_value FROM duroxide.get_kv_all_values($1)`, instance)
	require.NoError(h.t, err)
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, v *string
		require.NoError(h.t, rows.Scan(&k, &v))
		require.NotNil(h.t, k, "out_key is NULL")
		require.NotNil(h.t, v, "out_value of %q is NULL", *k)
		require.NotContains(h.t, out, *k, "key %q returned twice", *k)
		out[*k] = *v
	}
	require.NoError(h.t, rows.Err())
	return out
}

// instanceStats is one row of get_instance_stats.
type instanceStats struct {
	Found        bool
	Events       int64
	HistoryBytes int64
	QueuePending int64
	KVKeys       int64
	KVBytes      int64
}

func (h *schemaDB) instanceStatsErr(instance any) ([]instanceStats, error) {
	rows, err := h.pool.Query(h.ctx(), `SELECT out_found, out_history_event_count, out_history_size_bytes,
		out_queue_pending_count, out_kv_user_key_count, out_kv_total_value_bytes FROM duroxide.get_instance_stats($1)`, instance)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []instanceStats{}
	for rows.Next() {
		var s instanceStats
		if err := rows.Scan(&s.Found, &s.Events, &s.HistoryBytes, &s.QueuePending, &s.KVKeys, &s.KVBytes); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// stats requires get_instance_stats to return exactly one row and returns it.
func (h *schemaDB) stats(instance any) instanceStats {
	h.t.Helper()
	rows, err := h.instanceStatsErr(instance)
	require.NoError(h.t, err)
	require.Len(h.t, rows, 1, "get_instance_stats returns exactly one row")
	return rows[0]
}

// systemStats is what the provider makes of get_instance_stats' rows
// (provider.rs: fetch_optional, then Some only for out_found true).
func systemStats(rows []instanceStats) *instanceStats {
	if len(rows) == 0 || !rows[0].Found {
		return nil
	}
	return &rows[0]
}

// ---------------------------------------------------------------------------
// Catalog.

// schemaFunctions lists every function of schema duroxide as
// name(argtypes), sorted.
func (h *schemaDB) schemaFunctions() []string {
	h.t.Helper()
	return h.withoutPackAdditions(h.texts(`SELECT p.proname || '(' || replace(pg_catalog.oidvectortypes(p.proargtypes), ' ', '') || ')'
		FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'duroxide' ORDER BY 1`))
}

// withoutPackAdditions drops from names ("name(args)" or "name kind") the
// objects the pack's fixes up to h's version add to upstream's catalog
// (their "-- Adds:" lines), and the relations of an added table (its
// primary key): what is left is duroxide-pg's own. Upstream's
// cleanup_schema knows nothing of them; TestCleanupSchema states what it
// leaves.
func (h *schemaDB) withoutPackAdditions(names []string) []string {
	added := packfacts.AddedBy(h.version)
	out := []string{}
	for _, n := range names {
		base, _, _ := strings.Cut(strings.Fields(n + " ")[0], "(")
		pack := false
		for _, a := range added {
			_, name, _ := strings.Cut(a, " ")
			pack = pack || base == name || strings.HasPrefix(a, "table ") && strings.HasPrefix(base, name+"_")
		}
		if !pack {
			out = append(out, n)
		}
	}
	return out
}

// schemaRelations lists every relation of schema duroxide (any kind) as
// "name kind", sorted, except goose's own bookkeeping table and sequence,
// which belong to the pack's runner, not to duroxide-pg.
func (h *schemaDB) schemaRelations() []string {
	h.t.Helper()
	return h.withoutPackAdditions(h.texts(`SELECT c.relname || ' ' || c.relkind::text
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'duroxide' AND c.relname NOT LIKE 'goose\_db\_version%' ORDER BY 1`))
}

// legacyFunctions are the four functions of 0006 that no cleanup_schema drops.
var legacyFunctions = []string{
	"ack_orchestration(text,jsonb,bigint)", "enqueue_completion(text,text,bigint)",
	"enqueue_message(text,text,bigint,bigint)", "enqueue_orchestration_work(text,text,bigint)",
}
