package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
)

// scaleShape is what seedScale creates in a schema.
type scaleShape struct {
	// Leased instances hold a live lease (an instance_locks row whose
	// locked_until is a day ahead of the caller's clock); Blocked visible,
	// unclaimed messages are spread round-robin over them, the oldest in
	// the queue.
	Leased, Blocked int
	// Ready instances (running, small history, nothing queued) are the
	// claimable ones: readyMessages queues one message for each, behind
	// the blocked messages.
	Ready int
	// Completed instances (status Completed) with CompletedHistory events
	// each and nothing queued.
	Completed, CompletedHistory int
	// Large is 1 for one running instance with LargeHistory events of
	// about EventBytes bytes, nothing queued (bigMessage queues one).
	Large, LargeHistory, EventBytes int
}

// shapeOf is the seeding of cell c.
func shapeOf(c *ScaleCell) scaleShape {
	s := scaleShape{Leased: c.LeasedInstances, Blocked: c.Blocked, Ready: c.Claimable,
		Completed: c.Completed, CompletedHistory: c.CompletedHistory}
	if c.LargeHistory > 0 {
		s.Large, s.LargeHistory, s.EventBytes = 1, c.LargeHistory, c.EventBytes
	}
	return s
}

// Instance ids of the seeding: leased "scale-blk-<i>", ready
// "scale-ready-<i>", completed "scale-done-<i>" (1-based).
const (
	leasedPrefix    = "scale-blk-"
	readyPrefix     = "scale-ready-"
	completedPrefix = "scale-done-"
	largePrefix     = "scale-big-"
)

// runningHistory is the number of history events of each leased and ready
// instance.
const runningHistory = 3

// workItemSQL builds, in SQL, the ExternalRaised work item
// orch.ExternalEventWorkItem(instance, dispatch.EventName, data) builds in
// Go, byte for byte (compact, keys in serde's order; to_json quotes and
// escapes the strings).
func workItemSQL(instance, data string) string {
	return fmt.Sprintf(`'{"ExternalRaised":{"instance":' || to_json((%s)::text)::text || ',"name":"%s","data":' || to_json((%s)::text)::text || '}}'`,
		instance, dispatch.EventName, data)
}

// historyEventSQL builds, in SQL, history event e of instance id at
// epoch-ms ts: OrchestrationStarted first, OrchestrationCompleted last for
// a completed instance, ActivityCompleted between, in duroxide's Event
// JSON shape (common fields, then the variant's).
func historyEventSQL(id, e, n, done, ts, pad string) string {
	common := fmt.Sprintf("'event_id', %s, 'source_event_id', NULL, 'instance_id', %s, 'execution_id', 1, 'timestamp_ms', %s, 'duroxide_version', '%s'",
		e, id, ts, dispatch.DuroxideVersion)
	return fmt.Sprintf("CASE WHEN %[2]s = 1 THEN json_build_object(%[1]s, 'type', 'OrchestrationStarted', 'name', '%[6]s', 'version', '%[7]s', "+
		"'input', 'null', 'parent_instance', NULL, 'parent_id', NULL)"+
		" WHEN %[4]s AND %[2]s = %[3]s THEN json_build_object(%[1]s, 'type', 'OrchestrationCompleted', 'output', '\"ok\"')"+
		" ELSE json_build_object(%[1]s, 'type', 'ActivityCompleted', 'result', '\"' || repeat('x', %[8]s) || '\"') END::text",
		common, e, n, done, ts, dispatch.OrchestrationName, dispatch.OrchestrationVersion, pad)
}

// seedScale EMPTIES the orchestration tables of schema and creates shape
// in it, each table with one INSERT ... SELECT generate_series (100k
// messages take a second or two), then VACUUM ANALYZE. Every instance has
// an instances row and a current executions row pinned at
// dispatch.DuroxideVersion, so the runtime's version filter is evaluated.
// It returns the number of messages that are unclaimed, visible and behind
// a live lease, by the database's count.
func seedScale(ctx context.Context, src *dbconn.Source, schema string, s scaleShape) (int, error) {
	conn, err := src.Connect(ctx)
	if err != nil {
		return 0, fmt.Errorf("seed scale %s: connect: %w", schema, err)
	}
	defer conn.Close(context.Background())
	q := func(t string) string { return pgx.Identifier{schema, t}.Sanitize() }
	tables := []string{"instances", "executions", "history", "orchestrator_queue", "instance_locks", "kv_store"}
	quoted := make([]string, len(tables))
	for i, t := range tables {
		quoted[i] = q(t)
	}
	nowMs := time.Now().UnixMilli()
	major, minor, patch := pinnedVersion()
	done := fmt.Sprintf("starts_with(i.instance_id, '%s')", completedPrefix)
	large := fmt.Sprintf("starts_with(i.instance_id, '%s')", largePrefix)
	stmts := []struct {
		what string
		sql  string
		args []any
	}{
		{"empty the tables", "TRUNCATE " + strings.Join(quoted, ", "), nil},
		{"instances", "INSERT INTO " + q("instances") + " (instance_id, orchestration_name, orchestration_version, current_execution_id, created_at, updated_at) " +
			"SELECT id, $4::text, $5::text, 1, now(), now() FROM (" +
			"SELECT '" + leasedPrefix + "' || g AS id FROM generate_series(1, $1::int) g UNION ALL " +
			"SELECT '" + readyPrefix + "' || g FROM generate_series(1, $2::int) g UNION ALL " +
			"SELECT '" + completedPrefix + "' || g FROM generate_series(1, $3::int) g UNION ALL " +
			"SELECT '" + largePrefix + "' || g FROM generate_series(1, $6::int) g) s",
			[]any{s.Leased, s.Ready, s.Completed, dispatch.OrchestrationName, dispatch.OrchestrationVersion, s.Large}},
		{"executions", "INSERT INTO " + q("executions") + " (instance_id, execution_id, status, started_at, completed_at, " +
			"duroxide_version_major, duroxide_version_minor, duroxide_version_patch) " +
			"SELECT i.instance_id, 1, CASE WHEN " + done + " THEN 'Completed' ELSE 'Running' END, now(), " +
			"CASE WHEN " + done + " THEN now() END, $1::int, $2::int, $3::int FROM " + q("instances") + " i",
			[]any{major, minor, patch}},
		{"history", "INSERT INTO " + q("history") + " (instance_id, execution_id, event_id, event_type, event_data, created_at) " +
			"SELECT i.instance_id, 1, e, 'Event', " + historyEventSQL("i.instance_id", "e", "n.n", done, "$3::bigint", "n.pad") + ", now() " +
			"FROM " + q("instances") + " i " +
			"CROSS JOIN LATERAL (SELECT CASE WHEN " + done + " THEN $1::int WHEN " + large + " THEN $4::int ELSE $2::int END AS n, " +
			"CASE WHEN " + large + " THEN greatest($5::int - 200, 0) ELSE 0 END AS pad) n " +
			"CROSS JOIN LATERAL generate_series(1, n.n) e",
			[]any{s.CompletedHistory, runningHistory, nowMs, s.LargeHistory, s.EventBytes}},
		{"instance_locks", "INSERT INTO " + q("instance_locks") + " (instance_id, lock_token, locked_until, locked_at) " +
			"SELECT '" + leasedPrefix + "' || g, 'scale-lease-' || g, $2::bigint + 86400000, $2::bigint FROM generate_series(1, $1::int) g",
			[]any{s.Leased, nowMs}},
		{"blocked messages", "INSERT INTO " + q("orchestrator_queue") + " (instance_id, work_item, visible_at, created_at) " +
			"SELECT b.id, " + workItemSQL("b.id", "'b-' || b.g") + ", to_timestamp(($3::bigint - 3600000 + b.g) / 1000.0), now() " +
			"FROM (SELECT g, '" + leasedPrefix + "' || (1 + (g - 1) % $2::int) AS id FROM generate_series(1, $1::int) g) b",
			[]any{s.Blocked, max(s.Leased, 1), nowMs}},
	}
	for _, st := range stmts {
		if _, err := conn.Exec(ctx, st.sql, st.args...); err != nil {
			return 0, fmt.Errorf("seed scale %s: %s: %w", schema, st.what, err)
		}
	}
	if _, err := conn.Exec(ctx, "VACUUM ANALYZE "+strings.Join(quoted, ", ")); err != nil {
		return 0, fmt.Errorf("seed scale %s: vacuum: %w", schema, err)
	}
	return countBlocked(ctx, conn, schema, time.Now().UnixMilli())
}

// countBlocked counts the messages of schema that are unclaimed, visible
// by the database clock and whose instance holds a lease live at nowMs.
func countBlocked(ctx context.Context, conn *pgx.Conn, schema string, nowMs int64) (int, error) {
	q := func(t string) string { return pgx.Identifier{schema, t}.Sanitize() }
	var n int
	err := conn.QueryRow(ctx, "SELECT count(*) FROM "+q("orchestrator_queue")+" m JOIN "+q("instance_locks")+" l USING (instance_id) "+
		"WHERE m.lock_token IS NULL AND m.visible_at <= now() AND l.locked_until > $1", nowMs).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count blocked messages in %s: %w", schema, err)
	}
	return n, nil
}

// readyMessages queues one visible message for each of the first n ready
// instances, a minute old, so behind every blocked message (an hour old).
func readyMessages(ctx context.Context, conn *pgx.Conn, schema string, n int) error {
	q := pgx.Identifier{schema, "orchestrator_queue"}.Sanitize()
	_, err := conn.Exec(ctx, "INSERT INTO "+q+" (instance_id, work_item, visible_at, created_at) "+
		"SELECT r.id, "+workItemSQL("r.id", "'r-' || r.g")+", to_timestamp(($2::bigint - 60000 + r.g) / 1000.0), now() "+
		"FROM (SELECT g, '"+readyPrefix+"' || g AS id FROM generate_series(1, $1::int) g) r", n, time.Now().UnixMilli())
	if err != nil {
		return fmt.Errorf("queue the ready messages in %s: %w", schema, err)
	}
	return nil
}

// bigMessage queues one visible message for the large-history instance.
func bigMessage(ctx context.Context, conn *pgx.Conn, schema string) error {
	q := pgx.Identifier{schema, "orchestrator_queue"}.Sanitize()
	_, err := conn.Exec(ctx, "INSERT INTO "+q+" (instance_id, work_item, visible_at, created_at) "+
		"SELECT b.id, "+workItemSQL("b.id", "'big'")+", to_timestamp(($1::bigint - 60000) / 1000.0), now() "+
		"FROM (SELECT '"+largePrefix+"1' AS id) b", time.Now().UnixMilli())
	if err != nil {
		return fmt.Errorf("queue the large-history message in %s: %w", schema, err)
	}
	return nil
}

// clearReady deletes every queued message of the ready and large-history
// instances (and their leases), leaving only the blocked messages.
func clearReady(ctx context.Context, conn *pgx.Conn, schema string) error {
	for _, t := range []string{"orchestrator_queue", "instance_locks"} {
		if _, err := conn.Exec(ctx, "DELETE FROM "+pgx.Identifier{schema, t}.Sanitize()+
			" WHERE starts_with(instance_id, $1) OR starts_with(instance_id, $2)", readyPrefix, largePrefix); err != nil {
			return fmt.Errorf("clear the ready instances of %s.%s: %w", schema, t, err)
		}
	}
	return nil
}

// pinnedVersion is dispatch.DuroxideVersion as the executions row's
// major, minor, patch (inside the runtime filter the fetches pass).
func pinnedVersion() (major, minor, patch int) {
	var v [3]int
	if _, err := fmt.Sscanf(dispatch.DuroxideVersion, "%d.%d.%d", &v[0], &v[1], &v[2]); err != nil {
		panic("bench: dispatch.DuroxideVersion is not major.minor.patch: " + dispatch.DuroxideVersion)
	}
	return v[0], v[1], v[2]
}
