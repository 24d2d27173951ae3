package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/eventlog"
	"github.com/duroxide-pg/migrations/internal/sim/simconfig"
)

// SeedInfo is what Seed enqueued.
type SeedInfo struct {
	// Items are the ids of the seeded items, in queue order.
	Items []string
}

// Seed empties the schema's worker queue, sessions and orchestrator queue
// and enqueues items 1..cfg.Items (Config.ItemAt), visible an hour before
// the database clock so that every worker's clock sees them.
func Seed(ctx context.Context, src *dbconn.Source, cfg Config) (SeedInfo, error) {
	cfg, err := simconfig.Ready(cfg)
	if err != nil {
		return SeedInfo{}, err
	}
	conn, err := src.Connect(ctx)
	if err != nil {
		return SeedInfo{}, fmt.Errorf("worker: seed: %w", err)
	}
	defer conn.Close(context.Background())
	q := func(t string) string { return pgx.Identifier{cfg.Schema, t}.Sanitize() }
	if _, err := conn.Exec(ctx, "TRUNCATE "+q("worker_queue")+", "+q("sessions")+", "+q("orchestrator_queue")); err != nil {
		return SeedInfo{}, fmt.Errorf("worker: seed %s: %w", cfg.Schema, err)
	}
	var dbNow int64
	if err := conn.QueryRow(ctx, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint").Scan(&dbNow); err != nil {
		return SeedInfo{}, fmt.Errorf("worker: seed: %w", err)
	}
	c := NewClient(cfg.Schema)
	info := SeedInfo{}
	batch := &pgx.Batch{}
	visible := dbNow - time.Hour.Milliseconds()
	for k := int64(1); k <= int64(cfg.Items); k++ {
		it := cfg.ItemAt(k)
		info.Items = append(info.Items, it.ID)
		batch.Queue("SELECT "+c.schema+".enqueue_worker_work($1, $2, $3, $4, $5, $6, $7)",
			it.WorkItem(), visible, nullable(it.Instance), int64(1), it.ActivityID, nullable(it.SessionID), nullable(it.Tag))
	}
	if err := conn.SendBatch(ctx, batch).Close(); err != nil {
		return SeedInfo{}, fmt.Errorf("worker: seed %s: enqueue_worker_work: %w", cfg.Schema, err)
	}
	if _, err := conn.Exec(ctx, "ANALYZE "+q("worker_queue")); err != nil {
		return SeedInfo{}, fmt.Errorf("worker: seed %s: %w", cfg.Schema, err)
	}
	return info, nil
}

// PendingItems returns the ids of the items still in the schema's worker
// queue.
func PendingItems(ctx context.Context, src *dbconn.Source, schema string) ([]string, error) {
	conn, err := src.Connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, "SELECT work_item FROM "+pgx.Identifier{schema, "worker_queue"}.Sanitize()+" ORDER BY id")
	if err != nil {
		return nil, fmt.Errorf("worker: read the queue of %s: %w", schema, err)
	}
	texts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("worker: read the queue of %s: %w", schema, err)
	}
	var out []string
	for _, t := range texts {
		it, err := ParseItem(t)
		if err != nil {
			return nil, err
		}
		out = append(out, it.ID)
	}
	return out, nil
}

// Conservation checks that every item seeded or enqueued by a refill was
// completed (acked successfully) exactly once or is still pending, never
// both, and that nothing else was completed or is pending.
func Conservation(seeded []string, events []Event, pending []string) error {
	produced := map[string]int{}
	for _, id := range seeded {
		produced[id]++
	}
	completed := map[string]int{}
	for _, e := range events {
		if e.Outcome != OutcomeOK {
			continue
		}
		switch e.Kind {
		case KindAck:
			completed[e.Item]++
		case KindEnqueue:
			produced[e.Item]++
		}
	}
	return eventlog.Conservation("items", produced, completed, pending)
}

// MeasureCycle times n uncontended fetch+ack cycles on one connection
// (after one warm-up cycle), as a session-aware worker makes them: each
// enqueues one session-bound item (not timed), fetches it and acks it with
// its completion. It leaves the schema's worker queue, sessions and
// orchestrator queue empty.
func MeasureCycle(ctx context.Context, src *dbconn.Source, schema string, n int) ([]time.Duration, error) {
	conn, err := src.Connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	c := NewClient(schema)
	q := func(t string) string { return pgx.Identifier{schema, t}.Sanitize() }
	empty := func() error {
		_, err := conn.Exec(ctx, "TRUNCATE "+q("worker_queue")+", "+q("sessions")+", "+q("orchestrator_queue"))
		return err
	}
	if err := empty(); err != nil {
		return nil, fmt.Errorf("worker: measure: %w", err)
	}
	session := &Session{OwnerID: "calibrate", LockTimeoutMs: time.Minute.Milliseconds()}
	var out []time.Duration
	for i := 0; i <= n; i++ {
		it := Item{ID: fmt.Sprintf("cal-%d", i), Instance: "calibrate", ActivityID: int64(i + 1), SessionID: "cal-s"}
		if err := c.Enqueue(ctx, conn, it, time.Now().UnixMilli()-1000); err != nil {
			return nil, err
		}
		start := time.Now()
		f, _, err := c.Fetch(ctx, conn, start.UnixMilli(), time.Minute.Milliseconds(), session, Filter{Mode: ModeDefaultOnly})
		if err != nil {
			return nil, err
		}
		if f == nil {
			return nil, fmt.Errorf("worker: measure: nothing to fetch in schema %s", schema)
		}
		if err := c.Ack(ctx, conn, f.LockToken, it.Instance, it.Completion(), time.Now().UnixMilli()); err != nil {
			return nil, err
		}
		if i > 0 {
			out = append(out, time.Since(start))
		}
	}
	if err := empty(); err != nil {
		return nil, fmt.Errorf("worker: measure: %w", err)
	}
	return out, nil
}
