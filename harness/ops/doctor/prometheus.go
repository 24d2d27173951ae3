package doctor

import (
	"fmt"
	"io"
	"strings"
)

// severityValue is a severity as a gauge value: 0 ok, 1 warning, 2
// critical (the exit codes of `harness doctor`).
func severityValue(sev string) int {
	switch sev {
	case OK:
		return 0
	case Warning:
		return 1
	}
	return 2
}

// WritePrometheus writes r in the Prometheus text exposition format, for
// node_exporter's textfile collector: the overall status, one gauge per
// check (the worst severity of its findings), one per function the pack
// fixes (1 when it carries the fix), the fixes duroxide-pg's runner
// replaced, and the queue and clock figures.
func (r *Report) WritePrometheus(w io.Writer) error {
	var b strings.Builder
	gauge := func(name, help string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name)
	}
	schema := `schema="` + escapeLabel(r.Schema) + `"`

	gauge("duroxide_doctor_status", "Overall result of harness doctor: 0 ok, 1 warning, 2 critical.")
	fmt.Fprintf(&b, "duroxide_doctor_status{%s} %d\n", schema, severityValue(r.Status))

	gauge("duroxide_doctor_check", "Result of one doctor check: 0 ok, 1 warning, 2 critical.")
	worst := map[string]int{}
	var checks []string
	for _, f := range r.Findings {
		if _, seen := worst[f.Check]; !seen {
			checks = append(checks, f.Check)
		}
		worst[f.Check] = max(worst[f.Check], severityValue(f.Severity))
	}
	for _, c := range checks {
		fmt.Fprintf(&b, "duroxide_doctor_check{%s,check=\"%s\"} %d\n", schema, escapeLabel(c), worst[c])
	}

	gauge("duroxide_doctor_function_fixed", "1 when a function the pack fixes carries the fix, else 0; verdict says what it is instead.")
	for _, f := range r.Functions {
		fixed := 0
		if f.Verdict == Fixed {
			fixed = 1
		}
		fmt.Fprintf(&b, "duroxide_doctor_function_fixed{%s,function=\"%s\",fixed_by=\"%s\",verdict=\"%s\"} %d\n",
			schema, escapeLabel(f.Name), escapeLabel(f.FixedBy), escapeLabel(f.Verdict), fixed)
	}

	gauge("duroxide_doctor_fixes_replaced", "Functions whose fix goose records as applied but which hold another definition: duroxide-pg's runner replaced the fix; `harness migrate up` puts it back.")
	replaced := 0
	for _, f := range r.Functions {
		if f.Verdict == Replaced {
			replaced++
		}
	}
	fmt.Fprintf(&b, "duroxide_doctor_fixes_replaced{%s} %d\n", schema, replaced)

	gauge("duroxide_doctor_max_attempt_count", "Highest attempt_count of any orchestrator message.")
	fmt.Fprintf(&b, "duroxide_doctor_max_attempt_count{%s} %d\n", schema, r.MaxAttemptCount)
	gauge("duroxide_doctor_trapped_messages", "Orchestrator messages fetched more than max_attempts times.")
	fmt.Fprintf(&b, "duroxide_doctor_trapped_messages{%s,max_attempts=\"%d\"} %d\n", schema, r.MaxAttempts, r.TrappedMessages)
	gauge("duroxide_doctor_worker_trapped_items", "Worker items (activities) fetched more than max_attempts times.")
	fmt.Fprintf(&b, "duroxide_doctor_worker_trapped_items{%s,max_attempts=\"%d\"} %d\n", schema, r.MaxAttempts, r.WorkerTrappedItems)
	gauge("duroxide_doctor_worker_max_attempt_count", "Highest attempt_count of any worker item.")
	fmt.Fprintf(&b, "duroxide_doctor_worker_max_attempt_count{%s} %d\n", schema, r.WorkerMaxAttemptCount)
	gauge("duroxide_doctor_clock_skew_ms", "The database's clock minus this host's, in milliseconds.")
	fmt.Fprintf(&b, "duroxide_doctor_clock_skew_ms{%s} %d\n", schema, r.ClockSkewMs)
	if r.GooseVersion != nil {
		gauge("duroxide_doctor_goose_version", "Newest migration version goose records as applied.")
		fmt.Fprintf(&b, "duroxide_doctor_goose_version{%s} %d\n", schema, *r.GooseVersion)
	}
	if r.Heads != nil {
		gauge("duroxide_doctor_queue_heads_late_instances", "Instances with queued messages whose queue head is missing or later than their oldest message (fetch_orchestration_item cannot see them).")
		fmt.Fprintf(&b, "duroxide_doctor_queue_heads_late_instances{%s} %d\n", schema, r.Heads.LateInstances)
		gauge("duroxide_doctor_queue_heads_disabled_triggers", "Triggers keeping the queue heads that do not fire in an ordinary session.")
		fmt.Fprintf(&b, "duroxide_doctor_queue_heads_disabled_triggers{%s} %d\n", schema, len(r.Heads.DisabledTriggers))
	}
	gauge("duroxide_doctor_pack_latest_version", "Newest migration version of the pack this doctor knows.")
	fmt.Fprintf(&b, "duroxide_doctor_pack_latest_version{%s} %d\n", schema, r.PackLatest)
	_, err := io.WriteString(w, b.String())
	return err
}

// escapeLabel escapes a label value: backslash, double quote and newline.
func escapeLabel(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}
