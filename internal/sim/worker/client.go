// Package worker simulates duroxide's activity workers against a
// duroxide-pg schema, calling the worker-queue functions the way
// duroxide-pg's provider does: typed calls
// of those functions, the worker loop (fetch, run the activity with lease
// renewals, ack), each runtime's session renewal and cleanup, an event log
// of every call, and its summary.
package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/duroxide-pg/migrations/internal/sim/orch"
)

// Querier is a *pgx.Conn, *pgxpool.Pool or pgx.Tx (orch's).
type Querier = orch.Querier

// Client calls the worker-queue functions of one schema.
type Client struct {
	schema string
}

// NewClient returns a client for schema.
func NewClient(schema string) Client { return Client{schema: pgx.Identifier{schema}.Sanitize()} }

// Tag modes of fetch_work_item (duroxide-pg's mapping of TagFilter).
const (
	ModeDefaultOnly = "default_only"
	modeTags        = "tags"
	modeDefaultAnd  = "default_and"
	modeAny         = "any"
)

// Filter is a fetcher's tag filter: a mode and its tag names (sorted, an
// empty array rather than NULL, as duroxide-pg passes them).
type Filter struct {
	Mode string   `json:"mode"`
	Tags []string `json:"tags,omitempty"`
}

// Session is a session-aware fetcher's configuration (nil: not session
// aware, both NULL).
type Session struct {
	OwnerID       string
	LockTimeoutMs int64
}

// Item describes one activity for Enqueue.
type Item struct {
	// ID is the item's unique id, carried in the work item's input.
	ID         string
	Instance   string
	ActivityID int64
	SessionID  string // "" = not session-bound
	Tag        string // "" = untagged
}

// WorkItem is the ActivityExecute work item of it, in duroxide's JSON shape
// (session_id and tag left out when empty).
func (it Item) WorkItem() string {
	a := map[string]any{"instance": it.Instance, "execution_id": 1, "id": it.ActivityID, "name": "SimActivity",
		"version": "1.0.0", "input": it.ID}
	if it.SessionID != "" {
		a["session_id"] = it.SessionID
	}
	if it.Tag != "" {
		a["tag"] = it.Tag
	}
	b, _ := json.Marshal(map[string]any{"ActivityExecute": a})
	return string(b)
}

// Completion is the ActivityCompleted work item acking it.
func (it Item) Completion() string {
	b, _ := json.Marshal(map[string]any{"ActivityCompleted": map[string]any{
		"instance": it.Instance, "execution_id": 1, "id": it.ActivityID, "result": "done:" + it.ID}})
	return string(b)
}

// ParseItem reads an ActivityExecute work item back.
func ParseItem(workItem string) (Item, error) {
	var w struct {
		ActivityExecute *struct {
			Instance  string `json:"instance"`
			ID        int64  `json:"id"`
			Input     string `json:"input"`
			SessionID string `json:"session_id"`
			Tag       string `json:"tag"`
		}
	}
	if err := json.Unmarshal([]byte(workItem), &w); err != nil {
		return Item{}, fmt.Errorf("parse work item: %w", err)
	}
	if w.ActivityExecute == nil {
		return Item{}, fmt.Errorf("parse work item: not an ActivityExecute: %.80s", workItem)
	}
	a := w.ActivityExecute
	return Item{ID: a.Input, Instance: a.Instance, ActivityID: a.ID, SessionID: a.SessionID, Tag: a.Tag}, nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Enqueue calls enqueue_worker_work for it at nowMs.
func (c Client) Enqueue(ctx context.Context, q Querier, it Item, nowMs int64) error {
	_, err := q.Exec(ctx, "SELECT "+c.schema+".enqueue_worker_work($1, $2, $3, $4, $5, $6, $7)",
		it.WorkItem(), nowMs, nullable(it.Instance), int64(1), it.ActivityID, nullable(it.SessionID), nullable(it.Tag))
	if err != nil {
		return fmt.Errorf("enqueue_worker_work: %w", err)
	}
	return nil
}

// Fetched is one row of fetch_work_item.
type Fetched struct {
	WorkItem     string
	LockToken    string
	AttemptCount int32
	Item         Item
	// DBReturnMs is the database clock (epoch ms) when the function had
	// returned: read in the same statement, after the function.
	DBReturnMs int64
}

// Fetch calls fetch_work_item(now, timeout, owner, session timeout, tags,
// mode). It returns nil and the database clock at return when no row comes
// back.
func (c Client) Fetch(ctx context.Context, q Querier, nowMs, lockTimeoutMs int64, s *Session, f Filter) (*Fetched, int64, error) {
	var owner *string
	var sessionTimeout *int64
	if s != nil {
		owner, sessionTimeout = &s.OwnerID, &s.LockTimeoutMs
	}
	tags := f.Tags
	if tags == nil {
		tags = []string{}
	}
	// One row whatever the function returns, so that the clock at return is
	// read for an empty fetch too.
	var workItem, token *string
	var attempt *int32
	var dbReturn int64
	err := q.QueryRow(ctx, "SELECT f.out_work_item, f.out_lock_token, f.out_attempt_count, "+
		"floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint "+
		"FROM (SELECT 1) AS one LEFT JOIN LATERAL "+c.schema+".fetch_work_item($1, $2, $3, $4, $5, $6) AS f ON true",
		nowMs, lockTimeoutMs, owner, sessionTimeout, tags, f.Mode).Scan(&workItem, &token, &attempt, &dbReturn)
	if err != nil {
		return nil, 0, fmt.Errorf("fetch_work_item: %w", err)
	}
	if token == nil {
		return nil, dbReturn, nil
	}
	out := &Fetched{WorkItem: *workItem, LockToken: *token, DBReturnMs: dbReturn}
	if attempt != nil {
		out.AttemptCount = *attempt
	}
	it, err := ParseItem(out.WorkItem)
	if err != nil {
		return out, dbReturn, err
	}
	out.Item = it
	return out, dbReturn, nil
}

// Lease is an item lease as stored, read with the database clock.
type Lease struct {
	LockedUntilMs int64 // 0 when no row carries the token any more
	DBNowMs       int64 // database clock_timestamp() when read
}

// ReadLease reads the locked_until of the worker row carrying token, and
// the database clock.
func (c Client) ReadLease(ctx context.Context, q Querier, token string) (Lease, error) {
	var l Lease
	err := q.QueryRow(ctx, "SELECT coalesce((SELECT max(locked_until) FROM "+c.schema+".worker_queue WHERE lock_token = $1), 0), "+
		"floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint", token).Scan(&l.LockedUntilMs, &l.DBNowMs)
	if err != nil {
		return l, fmt.Errorf("read worker lease: %w", err)
	}
	return l, nil
}

// Ack calls ack_worker(token, instance, completion, now); an empty
// completion passes NULL for both instance and completion, as duroxide-pg
// does for a cancelled activity.
func (c Client) Ack(ctx context.Context, q Querier, token, instance, completion string, nowMs int64) error {
	var err error
	if completion == "" {
		_, err = q.Exec(ctx, "SELECT "+c.schema+".ack_worker($1, NULL, NULL, $2)", token, nowMs)
	} else {
		_, err = q.Exec(ctx, "SELECT "+c.schema+".ack_worker($1, $2, $3, $4)", token, instance, completion, nowMs)
	}
	if err != nil {
		return fmt.Errorf("ack_worker: %w", err)
	}
	return nil
}

// RenewItem calls renew_work_item_lock (extension in whole seconds).
func (c Client) RenewItem(ctx context.Context, q Querier, token string, nowMs, extendSecs int64) error {
	_, err := q.Exec(ctx, "SELECT "+c.schema+".renew_work_item_lock($1, $2, $3)", token, nowMs, extendSecs)
	if err != nil {
		return fmt.Errorf("renew_work_item_lock: %w", err)
	}
	return nil
}

// RenewSessions calls renew_session_lock and returns how many sessions it
// renewed.
func (c Client) RenewSessions(ctx context.Context, q Querier, owners []string, nowMs, extendMs, idleMs int64) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, "SELECT "+c.schema+".renew_session_lock($1, $2, $3, $4)", owners, nowMs, extendMs, idleMs).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("renew_session_lock: %w", err)
	}
	return n, nil
}

// CleanupSessions calls cleanup_orphaned_sessions and returns how many
// sessions it removed.
func (c Client) CleanupSessions(ctx context.Context, q Querier, nowMs int64) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, "SELECT "+c.schema+".cleanup_orphaned_sessions($1)", nowMs).Scan(&n); err != nil {
		return 0, fmt.Errorf("cleanup_orphaned_sessions: %w", err)
	}
	return n, nil
}

// IsNotFound reports an ack_worker refused because no live lease carries
// the token: 'Worker queue item not found or already processed'.
func IsNotFound(err error) bool { return pgMessageContains(err, "Worker queue item not found") }

// isRenewRefused reports a renew_work_item_lock refused: 'Lock token
// invalid, expired, or already acked'.
func isRenewRefused(err error) bool { return pgMessageContains(err, "Lock token invalid") }

func pgMessageContains(err error, s string) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && strings.Contains(pg.Message, s)
}

// sqlState returns the SQLSTATE of a PostgreSQL error, or "".
func sqlState(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code
	}
	return ""
}
