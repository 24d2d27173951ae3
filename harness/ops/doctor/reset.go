package doctor

import (
	"context"
	"database/sql"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// ResetRow is one instance's orchestrator messages targeted by ResetAttempts.
type ResetRow struct {
	InstanceID      string `json:"instance_id"`
	Messages        int64  `json:"messages"`
	MaxAttemptCount int64  `json:"max_attempt_count"`
}

// ResetAttempts sets attempt_count = 0 on every orchestrator_queue message
// of the instances (with apply), or only reports what it would reset. It
// returns one row per instance with messages, as they were before; the
// instances without any message are returned as missing.
func ResetAttempts(ctx context.Context, db *sql.DB, schema string, instances []string, apply bool) (rows []ResetRow, missing []string, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = tx.Rollback() }()
	table := pgx.Identifier{schema, "orchestrator_queue"}.Sanitize()
	// FOR UPDATE: what is reported is what is reset.
	rs, err := tx.QueryContext(ctx, `
SELECT instance_id, count(*), max(attempt_count)
FROM (SELECT instance_id, attempt_count FROM `+table+` WHERE instance_id = ANY($1) FOR UPDATE) m
GROUP BY instance_id ORDER BY instance_id`, instances)
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", table, err)
	}
	found := map[string]bool{}
	for rs.Next() {
		var r ResetRow
		if err := rs.Scan(&r.InstanceID, &r.Messages, &r.MaxAttemptCount); err != nil {
			rs.Close()
			return nil, nil, err
		}
		found[r.InstanceID] = true
		rows = append(rows, r)
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return nil, nil, err
	}
	for _, id := range instances {
		if !found[id] && !slices.Contains(missing, id) {
			missing = append(missing, id)
		}
	}
	if !apply {
		return rows, missing, nil
	}
	if _, err := tx.ExecContext(ctx, "UPDATE "+table+" SET attempt_count = 0 WHERE instance_id = ANY($1) AND attempt_count <> 0", instances); err != nil {
		return nil, nil, fmt.Errorf("reset attempt_count: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, nil, err
	}
	return rows, missing, nil
}
