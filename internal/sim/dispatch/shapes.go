package dispatch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// DuroxideVersion is the crate version the simulated runtime writes into
// events and pins executions at (0.1.29 packs to 1029, the top of
// orch.RuntimeFilter()).
const DuroxideVersion = "0.1.29"

// EventName is the external event every simulated turn waits for and
// receives.
const EventName = "tick"

// OrchestrationName and OrchestrationVersion name the seeded orchestrations.
const (
	OrchestrationName    = "OrganicLoop"
	OrchestrationVersion = "1.0.0"
)

// field is one key of a JSON object, in order.
type field struct {
	key string
	val any
}

// object renders fields in the order given, as serde does for a struct.
func object(fields ...field) json.RawMessage {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range fields {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(f.key)
		b.Write(k)
		b.WriteByte(':')
		switch v := f.val.(type) {
		case json.RawMessage:
			b.Write(v)
		default:
			enc, err := json.Marshal(v)
			if err != nil {
				panic(fmt.Sprintf("dispatch: encode %s: %v", f.key, err))
			}
			b.Write(enc)
		}
	}
	b.WriteByte('}')
	return b.Bytes()
}

// histEvent is a duroxide Event: the common fields in declaration order,
// then "type" and the variant's fields (EventKind is flattened and
// internally tagged).
type histEvent struct {
	EventID       int64
	SourceEventID *int64
	InstanceID    string
	ExecutionID   int64
	TimestampMs   int64
	Type          string
	Fields        []field
}

func (e histEvent) JSON() json.RawMessage {
	fs := []field{
		{"event_id", e.EventID},
		{"source_event_id", e.SourceEventID},
		{"instance_id", e.InstanceID},
		{"execution_id", e.ExecutionID},
		{"timestamp_ms", e.TimestampMs},
		{"duroxide_version", DuroxideVersion},
		{"type", e.Type},
	}
	return object(append(fs, e.Fields...)...)
}

// deltaElem is one element of ack's p_history_delta as duroxide-pg sends
// it: event_type is always "Event" and event_data the Event JSON as a
// string.
func deltaElem(e histEvent) json.RawMessage {
	return object(field{"event_id", e.EventID}, field{"event_type", "Event"}, field{"event_data", string(e.JSON())})
}

func deltaArray(events ...histEvent) json.RawMessage {
	elems := make([]json.RawMessage, len(events))
	for i, e := range events {
		elems[i] = deltaElem(e)
	}
	b, _ := json.Marshal(elems)
	return b
}

// metadata is p_metadata with every key present, as the Rust side sends it.
type metadata struct {
	Name, Version, Status, Output *string
}

func (m metadata) JSON() json.RawMessage {
	return object(
		field{"orchestration_name", m.Name},
		field{"orchestration_version", m.Version},
		field{"status", m.Status},
		field{"output", m.Output},
		field{"parent_instance_id", nil},
		field{"pinned_duroxide_version", nil},
		field{"custom_status_action", nil},
		field{"custom_status_value", nil},
		field{"kv_mutations", json.RawMessage("[]")},
	)
}

func strp(s string) *string { return &s }

// messageIDs returns the data of each ExternalRaised of a fetched batch (the
// message ids); other work items yield "".
func messageIDs(messages json.RawMessage) ([]string, error) {
	var items []map[string]json.RawMessage
	if len(messages) == 0 {
		return nil, nil
	}
	if err := json.Unmarshal(messages, &items); err != nil {
		return nil, fmt.Errorf("decode messages: %w", err)
	}
	ids := make([]string, len(items))
	for i, it := range items {
		if raw, ok := it["ExternalRaised"]; ok {
			var er struct {
				Data string `json:"data"`
			}
			if err := json.Unmarshal(raw, &er); err == nil {
				ids[i] = er.Data
			}
		}
	}
	return ids, nil
}

// historyFacts are what a turn needs from the fetched history, found
// without decoding the whole array (a hot instance's history is megabytes):
// jsonb renders `"key": value`, and inside string values every quote is
// escaped, so the byte patterns below match only real keys.
type historyFacts struct {
	LastEventID   int64
	LastType      string
	PinnedVersion string // duroxide_version of the first event when it is OrchestrationStarted
	Empty         bool
}

var (
	patEventID = []byte(`"event_id": `)
	patType    = []byte(`"type": "`)
	patVersion = []byte(`"duroxide_version": "`)
)

func scanHistory(h json.RawMessage) historyFacts {
	var f historyFacts
	trimmed := bytes.TrimSpace(h)
	if len(trimmed) <= 2 { // "[]" or nothing
		f.Empty = true
		return f
	}
	if i := bytes.LastIndex(h, patEventID); i >= 0 {
		rest := h[i+len(patEventID):]
		n := 0
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		f.LastEventID, _ = strconv.ParseInt(string(rest[:n]), 10, 64)
	}
	if i := bytes.LastIndex(h, patType); i >= 0 {
		f.LastType = quoted(h[i+len(patType):])
	}
	// The first element: decode just it.
	dec := json.NewDecoder(bytes.NewReader(h))
	if _, err := dec.Token(); err == nil && dec.More() {
		var first struct {
			Type    string `json:"type"`
			Version string `json:"duroxide_version"`
		}
		if dec.Decode(&first) == nil && first.Type == "OrchestrationStarted" {
			f.PinnedVersion = first.Version
		}
	}
	return f
}

func quoted(b []byte) string {
	if j := bytes.IndexByte(b, '"'); j >= 0 {
		return string(b[:j])
	}
	return ""
}

// packVersion packs "major.minor.patch" as duroxide-pg does
// (major*1_000_000 + minor*1_000 + patch); ok is false for anything else.
func packVersion(v string) (int64, bool) {
	var major, minor, patch int64
	if _, err := fmt.Sscanf(v, "%d.%d.%d", &major, &minor, &patch); err != nil {
		return 0, false
	}
	return major*1_000_000 + minor*1_000 + patch, true
}
