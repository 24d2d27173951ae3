package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
)

// scaleAckMetadata is ack_orchestration_item's p_metadata of a turn that
// changes nothing about the instance, every key present as duroxide-pg
// sends it.
const scaleAckMetadata = `{"orchestration_name":null,"orchestration_version":null,"status":null,"output":null,` +
	`"parent_instance_id":null,"pinned_duroxide_version":null,"custom_status_action":null,"custom_status_value":null,"kv_mutations":[]}`

// cycles queues one message for the first ready instance, then runs calls
// fetch+ack turns of it on one fresh session, as a dispatcher does: fetch
// (autocommit), then ack appending one ExternalEvent to the history and
// enqueueing the instance's next message (so the next fetch finds one).
// It records the fetch (early, steady), the ack and the whole cycle
// (steady) and the server CPU per cycle, then takes the message out again.
func cycles(ctx context.Context, src *dbconn.Source, schema string, calls int, cpu *serverCPU, s *scaleSample) error {
	admin, err := connect(ctx, src, "cycle setup")
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())
	if err := readyMessages(ctx, admin, schema, 1); err != nil {
		return err
	}
	instance := readyPrefix + "1"
	var next int64
	if err := admin.QueryRow(ctx, "SELECT coalesce(max(event_id), 0) + 1 FROM "+pgx.Identifier{schema, "history"}.Sanitize()+
		" WHERE instance_id = $1", instance).Scan(&next); err != nil {
		return fmt.Errorf("scale: cycle: next event id: %w", err)
	}
	conn, err := connect(ctx, src, "cycles")
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	c := orch.New(schema)
	var fetchLat, ackLat, cycleLat []int64
	w := cpu.begin()
	for i := range calls {
		it, fetchUs, err := fetchNow(ctx, conn, c)
		if err != nil {
			return fmt.Errorf("scale: cycle %d: %w", i+1, err)
		}
		s.CycleCalls++
		if it == nil {
			return fmt.Errorf("scale: cycle %d: the fetch returned no row although %s has a message", i+1, instance)
		}
		ack, err := cycleAck(it, next, fmt.Sprintf("c-%d", next))
		if err != nil {
			return err
		}
		start := time.Now()
		if err := c.AckItem(ctx, conn, it.LockToken, start.UnixMilli(), ack); err != nil {
			return fmt.Errorf("scale: cycle %d: %w", i+1, err)
		}
		ackUs := time.Since(start).Microseconds()
		s.CycleAcks++
		next++
		fetchLat, ackLat, cycleLat = append(fetchLat, fetchUs), append(ackLat, ackUs), append(cycleLat, fetchUs+ackUs)
	}
	if sec := w.end(); sec >= 0 && s.CycleAcks > 0 {
		s.CPUMsPerCycle = fp(1000 * sec / float64(s.CycleAcks))
	}
	s.CycleFetchEarlyMs, s.CycleFetchSteadyMs = phases(fetchLat)
	_, s.CycleAckSteadyMs = phases(ackLat)
	_, s.CycleSteadyMs = phases(cycleLat)
	return clearReady(ctx, admin, schema)
}

// cycleAck is the ack of one turn of it: history event eventID, an
// ExternalEvent receiving the batch, and the instance's next message,
// carrying data.
func cycleAck(it *orch.Item, eventID int64, data string) (orch.Ack, error) {
	type event struct {
		EventID         int64   `json:"event_id"`
		SourceEventID   *int64  `json:"source_event_id"`
		InstanceID      string  `json:"instance_id"`
		ExecutionID     int64   `json:"execution_id"`
		TimestampMs     int64   `json:"timestamp_ms"`
		DuroxideVersion string  `json:"duroxide_version"`
		Type            string  `json:"type"`
		Name            string  `json:"name"`
		Data            *string `json:"data"`
	}
	type deltaElem struct {
		EventID   int64  `json:"event_id"`
		EventType string `json:"event_type"`
		EventData string `json:"event_data"`
	}
	e, err := json.Marshal(event{EventID: eventID, InstanceID: it.InstanceID, ExecutionID: it.ExecutionID, TimestampMs: time.Now().UnixMilli(),
		DuroxideVersion: dispatch.DuroxideVersion, Type: "ExternalEvent", Name: dispatch.EventName, Data: &data})
	if err != nil {
		return orch.Ack{}, fmt.Errorf("scale: cycle ack: %w", err)
	}
	delta, err := json.Marshal([]deltaElem{{EventID: eventID, EventType: "Event", EventData: string(e)}})
	if err != nil {
		return orch.Ack{}, fmt.Errorf("scale: cycle ack: %w", err)
	}
	return orch.Ack{ExecutionID: it.ExecutionID, HistoryDelta: delta,
		OrchestratorItems: json.RawMessage("[" + orch.ExternalEventWorkItem(it.InstanceID, dispatch.EventName, data) + "]"),
		Metadata:          json.RawMessage(scaleAckMetadata)}, nil
}
