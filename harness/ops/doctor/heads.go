package doctor

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	migrations "github.com/duroxide-pg/migrations"
)

// Heads is the state of the queue heads a fix of the pack adds (0027:
// orchestrator_queue_heads, kept by triggers on orchestrator_queue), whose
// invariant fetch_orchestration_item relies on: every instance with a queued
// message has a head no later than its oldest message. Triggers disabled by
// hand, a session with session_replication_role = replica, or a restore with
// triggers off break it silently, and a message then waits forever.
type Heads struct {
	// AddedBy is the migration that adds the heads.
	AddedBy string `json:"added_by"`
	// DisabledTriggers are the heads' triggers that do not fire in an
	// ordinary session (disabled, or replica only), or are missing.
	DisabledTriggers []string `json:"disabled_triggers"`
	// LateInstances counts the instances with queued messages whose head is
	// missing or later than their oldest message; Example names one.
	LateInstances int64  `json:"late_instances"`
	Example       string `json:"example,omitempty"`
}

// headsFix is the pack migration that adds a table named *_heads on its
// -- Adds: line, with its table and triggers (read from sql/).
func headsFix() (m migrations.Migration, table string, triggers []string, ok bool) {
	for _, f := range migrations.Fixes() {
		for _, a := range f.Adds {
			kind, name, _ := strings.Cut(a, " ")
			switch {
			case kind == "table" && strings.HasSuffix(name, "_heads"):
				table, ok = name, true
			case kind == "trigger":
				triggers = append(triggers, name)
			}
		}
		if ok {
			return f, table, triggers, true
		}
		triggers = nil
	}
	return m, "", nil, false
}

// checkHeads checks the heads' invariant in schema s when its table is
// there: Critical when a trigger does not fire or a head is late.
func checkHeads(ctx context.Context, q Querier, s string, r *Report, add func(sev, check, msg, action string)) error {
	fix, table, triggers, ok := headsFix()
	if !ok {
		return nil
	}
	qual := func(name string) string { return pgx.Identifier{s, name}.Sanitize() }
	var present bool
	if err := q.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", qual(table)).Scan(&present); err != nil {
		return err
	}
	if !present {
		return nil
	}
	h := &Heads{AddedBy: fix.File, DisabledTriggers: []string{}}
	for _, tg := range triggers {
		var enabled string
		err := q.QueryRowContext(ctx, `SELECT coalesce((SELECT tgenabled::text FROM pg_trigger
			WHERE tgrelid = to_regclass($1) AND tgname = $2), 'missing')`, qual("orchestrator_queue"), tg).Scan(&enabled)
		if err != nil {
			return fmt.Errorf("read the triggers of orchestrator_queue: %w", err)
		}
		// O: fires in ordinary sessions; A: always. D: disabled; R: replica only.
		if enabled != "O" && enabled != "A" {
			h.DisabledTriggers = append(h.DisabledTriggers, fmt.Sprintf("%s (%s)", tg, map[string]string{"D": "disabled", "R": "replica only", "missing": "missing"}[enabled]))
		}
	}
	var example *string
	err := q.QueryRowContext(ctx, `SELECT count(*), min(m.instance_id) FROM (
		SELECT DISTINCT ON (instance_id) instance_id, visible_at, id FROM `+qual("orchestrator_queue")+`
		ORDER BY instance_id, visible_at, id) m
		LEFT JOIN `+qual(table)+` h ON h.instance_id = m.instance_id
		WHERE h.instance_id IS NULL OR (h.visible_at, h.id) > (m.visible_at, m.id)`).Scan(&h.LateInstances, &example)
	if err != nil {
		return fmt.Errorf("read %s: %w", table, err)
	}
	if example != nil {
		h.Example = *example
	}
	r.Heads = h
	repair := fmt.Sprintf("rebuild the heads by re-applying %s's Up: `harness migrate down --to %d --schema %s`, then `harness migrate up --schema %s` (it re-creates the triggers and rebuilds every head; the queue's messages are kept)",
		fix.File, fix.Version-1, s, s)
	switch {
	case len(h.DisabledTriggers) > 0:
		add(Critical, "queue_heads", fmt.Sprintf("%d trigger(s) keeping %s do not fire: %s; messages queued meanwhile may never be fetched",
			len(h.DisabledTriggers), table, strings.Join(h.DisabledTriggers, ", ")), repair)
	case h.LateInstances > 0:
		add(Critical, "queue_heads", fmt.Sprintf("%d instance(s) with queued messages have no head, or one later than their oldest message, in %s (e.g. %s): fetch_orchestration_item will not see those messages",
			h.LateInstances, table, h.Example), repair)
	default:
		add(OK, "queue_heads", fmt.Sprintf("%s covers the queue: every instance with a message has a head no later than it", table), "")
	}
	return nil
}
