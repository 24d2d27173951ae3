package migrations_test

// Tests of the pack's fix of the cost of fetch_orchestration_item: the
// candidate search reads one queue head per instance, so its cost does not
// grow with the messages queued behind leased instances (K).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// scaleFix is the pack's latest fix of fetch_orchestration_item (the one
// that adds the queue heads), and beforeScaleFix the version just before it.
func scaleFix(t *testing.T) (beforeScaleFix, fix int64) {
	t.Helper()
	var m migrations.Migration
	for _, f := range migrations.Fixes() {
		for _, name := range f.Fixes {
			if name == "fetch_orchestration_item" && len(f.Adds) > 0 {
				m = f
			}
		}
	}
	require.NotZero(t, m.Version, "the pack has no fix of fetch_orchestration_item that adds queue heads")
	for _, p := range migrations.MustPack() {
		if p.Version < m.Version {
			beforeScaleFix = p.Version
		}
	}
	return beforeScaleFix, m.Version
}

// seedBlocked queues k messages behind live leases, as a fan-in
// orchestration receiving completions while it runs its turn: on one
// instance ("fanin") or spread over `spread` instances, every one of them
// leased for an hour by the database clock and pinned to duroxide 0.1.5 (inside the runtime's range) so
// that the runtime's version filter is exercised. claimable instances with
// one message each are queued behind them.
func seedBlocked(t *testing.T, db *testdb.Database, k, spread, claimable int) {
	t.Helper()
	ctx := context.Background()
	conn := db.Conn(t, "")
	_, err := conn.Exec(ctx, seedSQL(db, k, spread, claimable))
	require.NoError(t, err, "seed %d blocked messages over %d leased instances", k, spread)
	_, err = conn.Exec(ctx, "ANALYZE "+db.Qualify("orchestrator_queue"))
	require.NoError(t, err)
}

// seedSQL is seedBlocked's script.
func seedSQL(db *testdb.Database, k, spread, claimable int) string {
	s := pgx.Identifier{db.Schema}.Sanitize()
	return fmt.Sprintf(`
DO $seed$
DECLARE
    v_now bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
BEGIN
    INSERT INTO %[1]s.instances (instance_id, orchestration_name, orchestration_version, current_execution_id, created_at, updated_at)
    SELECT 'blocked-' || g, 'FanIn', '1.0.0', 1, now(), now() FROM generate_series(1, %[3]d) g
    UNION ALL
    SELECT 'ready-' || g, 'Ready', '1.0.0', 1, now(), now() FROM generate_series(1, %[4]d) g;
    INSERT INTO %[1]s.executions (instance_id, execution_id, status, started_at,
                                  duroxide_version_major, duroxide_version_minor, duroxide_version_patch)
    SELECT instance_id, 1, 'Running', now(), 0, 1, 5 FROM %[1]s.instances;
    INSERT INTO %[1]s.instance_locks (instance_id, lock_token, locked_until, locked_at)
    SELECT 'blocked-' || g, 'lock_held_' || g, v_now + 3600000, v_now FROM generate_series(1, %[3]d) g;
    INSERT INTO %[1]s.orchestrator_queue (instance_id, work_item, visible_at, created_at)
    SELECT 'blocked-' || (1 + g %% %[3]d), '{"ExternalRaised":{"instance":"x","name":"done","data":"1"}}',
           to_timestamp((v_now - 3600000 + g) / 1000.0), now()
    FROM generate_series(1, %[2]d) g;
    INSERT INTO %[1]s.orchestrator_queue (instance_id, work_item, visible_at, created_at)
    SELECT 'ready-' || g, '{"ExternalRaised":{"instance":"x","name":"go","data":"1"}}',
           to_timestamp((v_now - 60000 + g) / 1000.0), now()
    FROM generate_series(1, %[4]d) g;
END;
$seed$`, s, k, spread, claimable)
}

// rowsRead is what one fetch read of each table, from the statistics of
// its own transaction (pg_stat_xact_user_tables): tuples read by sequential
// scans plus tuples fetched through indexes.
type rowsRead struct {
	Queue, Heads int64
	Instance     string
}

func fetchReading(t *testing.T, db *testdb.Database) rowsRead {
	t.Helper()
	ctx := context.Background()
	conn := db.Conn(t, "")
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var out rowsRead
	var instance *string
	err = tx.QueryRow(ctx, "SELECT out_instance_id FROM "+db.Qualify("fetch_orchestration_item")+"($1, 30000, $2, $3)",
		time.Now().UnixMilli(), orch.RuntimeFilter().Min, orch.RuntimeFilter().Max).Scan(&instance)
	if err != pgx.ErrNoRows {
		require.NoError(t, err)
	}
	if instance != nil {
		out.Instance = *instance
	}
	read := func(table string) int64 {
		var n int64
		require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)), 0)::bigint
			FROM pg_stat_xact_user_tables WHERE schemaname = $1 AND relname = $2`, db.Schema, table).Scan(&n))
		return n
	}
	out.Queue, out.Heads = read("orchestrator_queue"), read("orchestrator_queue_heads")
	return out
}

// The plan shape, at a K large enough to tell: before the fix a fetch reads
// every queued message of the leased instances (at least K rows of
// orchestrator_queue); with it, an empty poll reads no queue row at all and
// a fetch that finds an instance reads only that instance's messages, and
// the heads it reads are bounded by the leased instances, not by K. Fan-in
// (K on one instance) and K spread over many leased instances alike.
func TestV27FetchReadsNoRowPerBlockedMessage(t *testing.T) {
	t.Parallel()
	before, fix := scaleFix(t)
	const k = 20_000
	cases := []struct {
		name              string
		spread, claimable int
	}{
		{"fan-in, empty poll", 1, 0},
		{"fan-in, one instance claimable behind", 1, 1},
		{"spread over 50 leased instances, empty poll", 50, 0},
		{"spread over 50 leased instances, one instance claimable behind", 50, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, v := range []int64{before, fix} {
				db := dbs.New(t, v)
				seedBlocked(t, db, k, tc.spread, tc.claimable)
				got := fetchReading(t, db)
				if tc.claimable > 0 {
					require.Equal(t, "ready-1", got.Instance, "at %04d the claimable instance behind the backlog is found", v)
				} else {
					require.Empty(t, got.Instance, "at %04d nothing is claimable", v)
				}
				if v == before {
					require.GreaterOrEqual(t, got.Queue, int64(k), "at %04d the fetch walks every blocked message (the test could fail)", v)
					continue
				}
				require.LessOrEqual(t, got.Queue, int64(16*tc.claimable), "at %04d queue rows read by one fetch with %d blocked messages", v, k)
				require.LessOrEqual(t, got.Heads, int64(tc.spread+tc.claimable+2), "at %04d heads read: one per leased instance at most", v)
			}
		})
	}
}

// requireHeadsCover checks the heads against the queue: every instance with
// a queued message has a head no later than its oldest message (never late
// or missing: the fetch would not see it), and once every head is brought
// up to date they are exactly the oldest messages.
func requireHeadsCover(t *testing.T, db *testdb.Database) {
	t.Helper()
	ctx := context.Background()
	conn := db.Conn(t, "")
	q := func(sql string) int64 {
		var n int64
		require.NoError(t, conn.QueryRow(ctx, sql).Scan(&n), sql)
		return n
	}
	s := pgx.Identifier{db.Schema}.Sanitize()
	oldest := `SELECT DISTINCT ON (instance_id) instance_id, visible_at, id FROM ` + s + `.orchestrator_queue ORDER BY instance_id, visible_at, id`
	require.Zero(t, q(`SELECT count(*) FROM (`+oldest+`) o LEFT JOIN `+s+`.orchestrator_queue_heads h USING (instance_id)
		WHERE h.instance_id IS NULL OR (h.visible_at, h.id) > (o.visible_at, o.id)`),
		"an instance with messages whose head is missing or later than its oldest message")
	_, err := conn.Exec(ctx, `SELECT `+s+`.orchestrator_queue_head_refresh(instance_id) FROM `+s+`.orchestrator_queue_heads`)
	require.NoError(t, err)
	require.Zero(t, q(`SELECT count(*) FROM ((`+oldest+`) EXCEPT ALL (SELECT instance_id, visible_at, id FROM `+s+`.orchestrator_queue_heads)) d`),
		"after a refresh, an instance's head is its oldest message")
	require.Zero(t, q(`SELECT count(*) FROM ((SELECT instance_id, visible_at, id FROM `+s+`.orchestrator_queue_heads) EXCEPT ALL (`+oldest+`)) d`),
		"after a refresh, no head is left for an instance without messages")
}

// Under concurrent enqueues (fan-in on a few instances), fetches, acks that
// enqueue to other instances, and abandons with a delay, the heads never
// lose an instance, no instance is leased twice at once, and every message
// is consumed exactly once.
func TestV27HeadsStayCorrectUnderConcurrency(t *testing.T) {
	t.Parallel()
	_, fix := scaleFix(t)
	// 0027's own upkeep (advisory keys) and the latest's (row locks, 0030).
	for _, v := range []int64{fix, migrations.Latest()} {
		t.Run(fmt.Sprintf("%04d", v), func(t *testing.T) {
			t.Parallel()
			headsUnderConcurrency(t, dbs.New(t, v))
		})
	}
}

func headsUnderConcurrency(t *testing.T, db *testdb.Database) {
	c := orch.New(db.Schema)
	// run bounds the workload; every call runs to completion on call, so
	// that no call's outcome is lost to a cancellation at the end.
	run, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	ctx := context.Background()
	instances := []string{"a", "b", "c", "d", "e", "f"}
	var enqueued, consumed atomic.Int64
	var enqueueErr atomic.Value
	enqueue := func(conn *pgx.Conn, instance string) {
		err := c.Enqueue(ctx, conn, instance, orch.ExternalEventWorkItem(instance, "e", "x"), time.Now())
		if err == nil {
			enqueued.Add(1)
		} else {
			enqueueErr.Store(describe(err))
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	holder := map[string]string{} // instance -> lock token of the live lease
	var doubles, deadlocks []string
	for e := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn := db.Conn(t, "")
			rng := rand.New(rand.NewPCG(uint64(e), 1))
			for run.Err() == nil {
				enqueue(conn, instances[rng.IntN(2)]) // fan-in on a and b
			}
		}()
	}
	for d := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn := db.Conn(t, "")
			rng := rand.New(rand.NewPCG(uint64(d), 2))
			for run.Err() == nil {
				it, err := c.Fetch(ctx, conn, time.Now().UnixMilli(), 5_000, orch.RuntimeFilter())
				if err != nil || it == nil {
					continue
				}
				mu.Lock()
				if other, taken := holder[it.InstanceID]; taken {
					doubles = append(doubles, fmt.Sprintf("%s leased to %s and %s at once", it.InstanceID, other, it.LockToken))
				}
				holder[it.InstanceID] = it.LockToken
				mu.Unlock()
				release := func() {
					mu.Lock()
					delete(holder, it.InstanceID)
					mu.Unlock()
				}
				if rng.IntN(5) == 0 {
					release()
					_, err = c.Abandon(ctx, conn, it.LockToken, time.Now().UnixMilli(), int64(1+rng.IntN(50)), false)
					if code := orch.SQLState(err); code == "40P01" || code == "40001" {
						mu.Lock()
						deadlocks = append(deadlocks, describe(err))
						mu.Unlock()
					}
					continue
				}
				target := instances[rng.IntN(len(instances))]
				next := fmt.Sprintf("[%s]", orch.ExternalEventWorkItem(target, "t", "y"))
				release()
				err = c.AckItem(ctx, conn, it.LockToken, time.Now().UnixMilli(), orch.Ack{OrchestratorItems: []byte(next)})
				if code := orch.SQLState(err); code == "40P01" || code == "40001" {
					mu.Lock()
					deadlocks = append(deadlocks, describe(err))
					mu.Unlock()
				}
				if err == nil {
					var batch []json.RawMessage
					if json.Unmarshal(it.Messages, &batch) == nil {
						consumed.Add(int64(len(batch)))
					}
					enqueued.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	require.Nil(t, enqueueErr.Load(), "enqueues succeed")
	require.Empty(t, doubles, "no instance is leased twice at once")
	require.Empty(t, deadlocks, "no ack deadlocks or fails to serialize on the heads")
	require.Positive(t, consumed.Load(), "turns were acked")
	requireHeadsCover(t, db)
	var left int64
	require.NoError(t, db.PgxPool(t).QueryRow(context.Background(), "SELECT count(*) FROM "+db.Qualify("orchestrator_queue")).Scan(&left))
	require.Equal(t, enqueued.Load(), consumed.Load()+left, "every message enqueued is consumed once or still queued")
	t.Logf("%d enqueued, %d consumed, %d left", enqueued.Load(), consumed.Load(), left)
}

// describe is err with PostgreSQL's detail and context, which name the
// processes and locks of a deadlock.
func describe(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return err.Error() + "\n" + pgErr.Detail + "\n" + pgErr.Where
	}
	return err.Error()
}
