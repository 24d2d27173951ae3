package doctor

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ResetRow is one instance's queue rows targeted by ResetAttempts: its
// orchestrator messages and its worker items (activities), with their
// highest attempt_count before the reset.
type ResetRow struct {
	InstanceID            string `json:"instance_id"`
	Messages              int64  `json:"messages"`
	MaxAttemptCount       int64  `json:"max_attempt_count"`
	WorkerItems           int64  `json:"worker_items"`
	WorkerMaxAttemptCount int64  `json:"worker_max_attempt_count"`
}

// ResetAttempts sets attempt_count = 0 on every orchestrator_queue message
// and every worker_queue item of the instances (with apply), or only
// reports what it would reset. It returns one row per instance with
// messages or items, as they were before; the instances with neither are
// returned as missing. The rows are locked (FOR UPDATE) from the read to
// the reset: what is reported is what is reset.
func ResetAttempts(ctx context.Context, db *sql.DB, schema string, instances []string, apply bool) (rows []ResetRow, missing []string, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = tx.Rollback() }()
	orch := pgx.Identifier{schema, "orchestrator_queue"}.Sanitize()
	worker := pgx.Identifier{schema, "worker_queue"}.Sanitize()
	var workerColumns int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attname IN ('attempt_count', 'instance_id') AND NOT attisdropped`, worker).Scan(&workerColumns); err != nil {
		return nil, nil, fmt.Errorf("read worker_queue's columns: %w", err)
	}
	byInstance := map[string]*ResetRow{}
	row := func(id string) *ResetRow {
		if byInstance[id] == nil {
			byInstance[id] = &ResetRow{InstanceID: id}
		}
		return byInstance[id]
	}
	read := func(table string, set func(r *ResetRow, n, max int64)) error {
		rs, err := tx.QueryContext(ctx, `
SELECT instance_id, count(*), max(attempt_count)
FROM (SELECT instance_id, attempt_count FROM `+table+` WHERE instance_id = ANY($1) FOR UPDATE) m
GROUP BY instance_id`, instances)
		if err != nil {
			return fmt.Errorf("read %s: %w", table, err)
		}
		defer rs.Close()
		for rs.Next() {
			var id string
			var n, max int64
			if err := rs.Scan(&id, &n, &max); err != nil {
				return err
			}
			set(row(id), n, max)
		}
		return rs.Err()
	}
	if err := read(orch, func(r *ResetRow, n, max int64) { r.Messages, r.MaxAttemptCount = n, max }); err != nil {
		return nil, nil, err
	}
	if workerColumns == 2 {
		if err := read(worker, func(r *ResetRow, n, max int64) { r.WorkerItems, r.WorkerMaxAttemptCount = n, max }); err != nil {
			return nil, nil, err
		}
	}
	for _, id := range instances {
		if byInstance[id] == nil && !slices.Contains(missing, id) {
			missing = append(missing, id)
		}
	}
	for _, r := range byInstance {
		rows = append(rows, *r)
	}
	slices.SortFunc(rows, func(a, b ResetRow) int { return strings.Compare(a.InstanceID, b.InstanceID) })
	if !apply {
		return rows, missing, nil
	}
	tables := []string{orch}
	if workerColumns == 2 {
		tables = append(tables, worker)
	}
	for _, table := range tables {
		if _, err := tx.ExecContext(ctx, "UPDATE "+table+" SET attempt_count = 0 WHERE instance_id = ANY($1) AND attempt_count <> 0", instances); err != nil {
			return nil, nil, fmt.Errorf("reset attempt_count in %s: %w", table, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, nil, err
	}
	return rows, missing, nil
}
