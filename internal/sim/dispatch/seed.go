package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/eventlog"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/sim/simconfig"
)

// SeedInfo is what Seed created.
type SeedInfo struct {
	Instances []string `json:"instances"`
	// Messages are the ids of the one pending message of each instance.
	Messages []string `json:"messages"`
}

// instanceID names seeded instance i (0-based).
func instanceID(i int) string { return fmt.Sprintf("organic-%04d", i) }

// Seed EMPTIES the orchestration tables of cfg.Schema (instances,
// executions, history, orchestrator_queue, worker_queue, instance_locks,
// kv_store: use a throwaway schema) and creates cfg.Instances running
// orchestrations, as duroxide would have left them: an instances row, a
// 'Running' executions row pinned at DuroxideVersion, cfg.HistoryEvents
// history events of about cfg.EventBytes bytes each (OrchestrationStarted,
// then ActivityScheduled/ActivityCompleted pairs, the last one an
// ExternalSubscribed for EventName), and one visible ExternalRaised message
// each (ids "m-0-<i>").
func Seed(ctx context.Context, src *dbconn.Source, cfg Config) (SeedInfo, error) {
	cfg, err := simconfig.Ready(cfg)
	if err != nil {
		return SeedInfo{}, err
	}
	conn, err := src.Connect(ctx)
	if err != nil {
		return SeedInfo{}, fmt.Errorf("seed: connect: %w", err)
	}
	defer conn.Close(context.Background())

	q := func(table string) string { return pgx.Identifier{cfg.Schema, table}.Sanitize() }
	tx, err := conn.Begin(ctx)
	if err != nil {
		return SeedInfo{}, fmt.Errorf("seed: %w", err)
	}
	defer tx.Rollback(context.Background())

	tables := []string{"instances", "executions", "history", "orchestrator_queue", "worker_queue", "instance_locks", "kv_store"}
	quoted := make([]string, len(tables))
	for i, t := range tables {
		quoted[i] = q(t)
	}
	if _, err := tx.Exec(ctx, "TRUNCATE "+strings.Join(quoted, ", ")); err != nil {
		return SeedInfo{}, fmt.Errorf("seed: empty the schema: %w", err)
	}

	now := time.Now()
	nowMs := now.UnixMilli()
	var info SeedInfo
	var instRows, execRows, queueRows [][]any
	for i := 0; i < cfg.Instances; i++ {
		id := instanceID(i)
		info.Instances = append(info.Instances, id)
		instRows = append(instRows, []any{id, OrchestrationName, OrchestrationVersion, int64(1), now, now})
		execRows = append(execRows, []any{id, int64(1), "Running", now, int32(0), int32(1), int32(29)})
		mid := fmt.Sprintf("m-0-%d", i)
		info.Messages = append(info.Messages, mid)
		// Visible since a second ago, so that clocks skewed behind see it too.
		queueRows = append(queueRows, []any{id, orch.ExternalEventWorkItem(id, EventName, mid), now.Add(-time.Second), now, int32(0)})
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{cfg.Schema, "instances"},
		[]string{"instance_id", "orchestration_name", "orchestration_version", "current_execution_id", "created_at", "updated_at"},
		pgx.CopyFromRows(instRows)); err != nil {
		return SeedInfo{}, fmt.Errorf("seed: instances: %w", err)
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{cfg.Schema, "executions"},
		[]string{"instance_id", "execution_id", "status", "started_at", "duroxide_version_major", "duroxide_version_minor", "duroxide_version_patch"},
		pgx.CopyFromRows(execRows)); err != nil {
		return SeedInfo{}, fmt.Errorf("seed: executions: %w", err)
	}
	hist := &historySource{cfg: cfg, nowMs: nowMs, created: now}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{cfg.Schema, "history"},
		[]string{"instance_id", "execution_id", "event_id", "event_type", "event_data", "created_at"}, hist); err != nil {
		return SeedInfo{}, fmt.Errorf("seed: history: %w", err)
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{cfg.Schema, "orchestrator_queue"},
		[]string{"instance_id", "work_item", "visible_at", "created_at", "attempt_count"},
		pgx.CopyFromRows(queueRows)); err != nil {
		return SeedInfo{}, fmt.Errorf("seed: orchestrator_queue: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return SeedInfo{}, fmt.Errorf("seed: commit: %w", err)
	}
	for _, t := range []string{"instances", "executions", "history", "orchestrator_queue"} {
		if _, err := conn.Exec(ctx, "ANALYZE "+q(t)); err != nil {
			return SeedInfo{}, fmt.Errorf("seed: analyze %s: %w", t, err)
		}
	}
	return info, nil
}

// historySource streams the seeded history rows to COPY.
type historySource struct {
	cfg     Config
	nowMs   int64
	created time.Time

	inst, ev int // current instance (0-based) and event id (1-based)
	row      []any
}

func (h *historySource) Next() bool {
	if h.ev == 0 {
		h.ev = 1
	} else {
		h.ev++
		if h.ev > h.cfg.HistoryEvents {
			h.inst++
			h.ev = 1
		}
	}
	if h.inst >= h.cfg.Instances {
		return false
	}
	e := seedEvent(instanceID(h.inst), int64(h.ev), int64(h.cfg.HistoryEvents), h.nowMs-int64(h.cfg.HistoryEvents-h.ev), h.cfg.EventBytes)
	h.row = []any{instanceID(h.inst), int64(1), int64(h.ev), "Event", string(e), h.created}
	return true
}

func (h *historySource) Values() ([]any, error) { return h.row, nil }
func (h *historySource) Err() error             { return nil }

// seedEvent is event id of n in a seeded history, padded to about size
// bytes.
func seedEvent(instance string, id, n, tsMs int64, size int) []byte {
	e := histEvent{EventID: id, InstanceID: instance, ExecutionID: 1, TimestampMs: tsMs}
	pad := func(build func(p string) histEvent) []byte {
		b := build("").JSON()
		if k := size - len(b); k > 0 {
			b = build(strings.Repeat("x", k)).JSON()
		}
		return b
	}
	switch {
	case id == 1:
		return pad(func(p string) histEvent {
			e.Type = "OrchestrationStarted"
			e.Fields = []field{{"name", OrchestrationName}, {"version", OrchestrationVersion}, {"input", p},
				{"parent_instance", nil}, {"parent_id", nil}}
			return e
		})
	case id == n:
		e.Type = "ExternalSubscribed"
		e.Fields = []field{{"name", EventName}}
		return e.JSON()
	case id%2 == 0:
		return pad(func(p string) histEvent {
			e.Type = "ActivityScheduled"
			e.Fields = []field{{"name", "Step"}, {"input", p}}
			return e
		})
	default:
		src := id - 1
		return pad(func(p string) histEvent {
			e.SourceEventID = &src
			e.Type = "ActivityCompleted"
			e.Fields = []field{{"result", p}}
			return e
		})
	}
}

// PendingMessages returns the ids of the messages still in the schema's
// orchestrator queue.
func PendingMessages(ctx context.Context, src *dbconn.Source, schema string) ([]string, error) {
	conn, err := src.Connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, "SELECT work_item FROM "+pgx.Identifier{schema, "orchestrator_queue"}.Sanitize()+" ORDER BY id")
	if err != nil {
		return nil, err
	}
	var items []json.RawMessage
	for rows.Next() {
		var w string
		if err := rows.Scan(&w); err != nil {
			return nil, err
		}
		items = append(items, json.RawMessage(w))
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	arr, _ := json.Marshal(items)
	return messageIDs(arr)
}

// Conservation checks that no message was lost or delivered twice: every
// id seeded or enqueued by a successful ack was consumed by exactly one
// successful ack (ack, fail_ack or poison) or is still pending, and nothing
// else was consumed or is pending.
func Conservation(seeded []string, events []Event, pending []string) error {
	produced, consumed := Seeded(seeded), map[string]int{}
	for _, e := range events {
		if e.Outcome == OutcomeOK {
			e.CountCommitted(produced, consumed)
		}
	}
	return eventlog.Conservation("messages", produced, consumed, pending)
}

// Seeded counts the seeded ids as produced once each.
func Seeded(ids []string) map[string]int {
	produced := make(map[string]int, len(ids))
	for _, id := range ids {
		produced[id]++
	}
	return produced
}

// IsAck reports the kinds that ack a batch: ack, fail_ack and poison.
func (k Kind) IsAck() bool { return k == KindAck || k == KindFailAck || k == KindPoison }

// CountCommitted counts an ack that committed: its batch's messages as
// consumed, the ids it enqueued as produced. Other events count nothing.
func (e Event) CountCommitted(produced, consumed map[string]int) {
	if !e.Kind.IsAck() {
		return
	}
	for _, id := range e.Messages {
		if id != "" {
			consumed[id]++
		}
	}
	for _, id := range e.Enqueued {
		produced[id]++
	}
}

// MeasureFetch times n uncontended fetch_orchestration_item calls on one
// connection (after one warm-up call), as a dispatcher makes them, handing
// each lease back with abandon (ignore_attempt, so attempt_count is
// unchanged). The schema must hold a fetchable instance (Seed).
func MeasureFetch(ctx context.Context, src *dbconn.Source, schema string, n int) ([]time.Duration, error) {
	conn, err := src.Connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	c := orch.New(schema)
	var out []time.Duration
	for i := 0; i <= n; i++ {
		start := time.Now()
		it, err := c.Fetch(ctx, conn, start.UnixMilli(), time.Minute.Milliseconds(), orch.RuntimeFilter())
		lat := time.Since(start)
		if err != nil {
			return nil, err
		}
		if it == nil {
			return nil, fmt.Errorf("measure fetch: nothing to fetch in schema %s", schema)
		}
		if _, err := c.Abandon(ctx, conn, it.LockToken, time.Now().UnixMilli(), 0, true); err != nil {
			return nil, err
		}
		if i > 0 {
			out = append(out, lat)
		}
	}
	return out, nil
}
