// Package orch calls the orchestration functions of a duroxide-pg schema
// the way duroxide-pg's provider does: schema-qualified, with the caller's
// clock in epoch milliseconds, one autocommit statement per call.
package orch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier is a *pgx.Conn, *pgxpool.Pool or pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Client calls the functions of one schema.
type Client struct {
	schema string
}

// New returns a client for schema.
func New(schema string) Client { return Client{schema: pgx.Identifier{schema}.Sanitize()} }

// VersionRange is the runtime's version filter, packed as
// major*1_000_000 + minor*1_000 + patch. The duroxide runtime always passes
// one (min 0, max its own version).
type VersionRange struct{ Min, Max int64 }

// RuntimeFilter is the filter a duroxide 0.1.29 runtime passes (a new
// value each call: no caller can change another's).
func RuntimeFilter() *VersionRange { return &VersionRange{Min: 0, Max: 1029} }

// Item is one row of fetch_orchestration_item.
type Item struct {
	InstanceID   string
	Name         *string
	Version      *string
	ExecutionID  int64
	History      json.RawMessage
	Messages     json.RawMessage
	LockToken    string
	AttemptCount int32
	KVSnapshot   json.RawMessage
	// DBReturnMs is the database clock (epoch ms) when the function had
	// returned: read in the same statement, after the function's rows.
	DBReturnMs int64
}

// Fetch calls fetch_orchestration_item(now, timeout, min, max); nil filter
// passes NULLs. It returns nil, nil when no row comes back.
func (c Client) Fetch(ctx context.Context, q Querier, nowMs, lockTimeoutMs int64, filter *VersionRange) (*Item, error) {
	var min, max *int64
	if filter != nil {
		min, max = &filter.Min, &filter.Max
	}
	var it Item
	err := q.QueryRow(ctx, "SELECT out_instance_id, out_orchestration_name, out_orchestration_version, out_execution_id, "+
		"out_history, out_messages, out_lock_token, out_attempt_count, out_kv_snapshot, "+
		"floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint FROM "+
		c.schema+".fetch_orchestration_item($1, $2, $3, $4)", nowMs, lockTimeoutMs, min, max).
		Scan(&it.InstanceID, &it.Name, &it.Version, &it.ExecutionID, &it.History, &it.Messages,
			&it.LockToken, &it.AttemptCount, &it.KVSnapshot, &it.DBReturnMs)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("fetch_orchestration_item: %w", err)
	}
	return &it, nil
}

// Lease is an instance lease as stored, read with the database clock.
type Lease struct {
	LockedUntilMs int64 // 0 when the token holds no lease
	DBNowMs       int64 // database clock_timestamp() when read
}

// ReadLease reads the instance_locks row of token and the database clock.
func (c Client) ReadLease(ctx context.Context, q Querier, token string) (Lease, error) {
	var l Lease
	err := q.QueryRow(ctx, "SELECT coalesce((SELECT locked_until FROM "+c.schema+".instance_locks WHERE lock_token = $1), 0), "+
		"floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint", token).Scan(&l.LockedUntilMs, &l.DBNowMs)
	if err != nil {
		return l, fmt.Errorf("read lease: %w", err)
	}
	return l, nil
}

// DBNowMs reads the database clock in epoch milliseconds.
func DBNowMs(ctx context.Context, q Querier) (int64, error) {
	var ms int64
	err := q.QueryRow(ctx, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint").Scan(&ms)
	return ms, err
}

// Ack is what one turn commits; the zero value acks with no changes.
type Ack struct {
	ExecutionID         int64
	HistoryDelta        json.RawMessage // array of {event_id, event_type, event_data}
	WorkerItems         json.RawMessage
	OrchestratorItems   json.RawMessage
	Metadata            json.RawMessage
	CancelledActivities json.RawMessage
}

func orEmpty(raw json.RawMessage, empty string) string {
	if len(raw) == 0 {
		return empty
	}
	return string(raw)
}

// AckItem calls ack_orchestration_item.
func (c Client) AckItem(ctx context.Context, q Querier, token string, nowMs int64, a Ack) error {
	if a.ExecutionID == 0 {
		a.ExecutionID = 1
	}
	_, err := q.Exec(ctx, "SELECT "+c.schema+".ack_orchestration_item($1, $2, $3, $4::jsonb, $5::jsonb, $6::jsonb, $7::jsonb, $8::jsonb)",
		token, nowMs, a.ExecutionID, orEmpty(a.HistoryDelta, "[]"), orEmpty(a.WorkerItems, "[]"),
		orEmpty(a.OrchestratorItems, "[]"), orEmpty(a.Metadata, "{}"), orEmpty(a.CancelledActivities, "[]"))
	if err != nil {
		return fmt.Errorf("ack_orchestration_item: %w", err)
	}
	return nil
}

// Renew calls renew_orchestration_item_lock (extension in whole seconds).
func (c Client) Renew(ctx context.Context, q Querier, token string, nowMs, extendSecs int64) error {
	_, err := q.Exec(ctx, "SELECT "+c.schema+".renew_orchestration_item_lock($1, $2, $3)", token, nowMs, extendSecs)
	if err != nil {
		return fmt.Errorf("renew_orchestration_item_lock: %w", err)
	}
	return nil
}

// Abandon calls abandon_orchestration_item; delayMs <= 0 passes NULL.
func (c Client) Abandon(ctx context.Context, q Querier, token string, nowMs, delayMs int64, ignoreAttempt bool) (string, error) {
	var delay *int64
	if delayMs > 0 {
		delay = &delayMs
	}
	var instance string
	err := q.QueryRow(ctx, "SELECT "+c.schema+".abandon_orchestration_item($1, $2, $3, $4)", token, nowMs, delay, ignoreAttempt).Scan(&instance)
	if err != nil {
		return "", fmt.Errorf("abandon_orchestration_item: %w", err)
	}
	return instance, nil
}

// Enqueue calls enqueue_orchestrator_work.
func (c Client) Enqueue(ctx context.Context, q Querier, instance, workItem string, visibleAt time.Time) error {
	_, err := q.Exec(ctx, "SELECT "+c.schema+".enqueue_orchestrator_work($1, $2, $3)", instance, workItem, visibleAt)
	if err != nil {
		return fmt.Errorf("enqueue_orchestrator_work: %w", err)
	}
	return nil
}

// IsInvalidLockToken reports an ack refused because the lease is unknown
// or expired.
func IsInvalidLockToken(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && strings.Contains(pg.Message, "Invalid lock token")
}

// SQLState returns the SQLSTATE of a PostgreSQL error, or "".
func SQLState(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code
	}
	return ""
}

// StartWorkItem is a StartOrchestration work item in duroxide's JSON shape.
func StartWorkItem(instance, orchestration, version string, executionID int64) string {
	b, _ := json.Marshal(map[string]any{"StartOrchestration": map[string]any{
		"instance": instance, "orchestration": orchestration, "version": version,
		"input": "null", "execution_id": executionID,
	}})
	return string(b)
}

// ExternalEventWorkItem is an ExternalRaised work item carrying data, its
// fields in duroxide's declaration order (instance, name, data), as serde
// writes it. It is the one place the simulators build this JSON.
func ExternalEventWorkItem(instance, name, data string) string {
	type externalRaised struct {
		Instance string `json:"instance"`
		Name     string `json:"name"`
		Data     string `json:"data"`
	}
	b, _ := json.Marshal(struct {
		ExternalRaised externalRaised `json:"ExternalRaised"`
	}{externalRaised{instance, name, data}})
	return string(b)
}
