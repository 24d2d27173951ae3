package migrateload

import (
	"fmt"
	"strings"
	"time"

	"github.com/duroxide-pg/migrations/internal/reportfile"
)

// ReportFile and JSONFile are the files WriteReport writes.
const (
	ReportFile = "migrate-load.md"
	JSONFile   = "migrate-load.json"
)

// Table is the reports as a Markdown table, one row per start state.
func Table(reps []*Report) string {
	var b strings.Builder
	b.WriteString("| start state | messages (instances) | writer | `migrate up` | writes (failed) | write latency max | max while migrating | p99 | p50 |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range reps {
		fmt.Fprintf(&b, "| %s, to %d | %d (%d) | %d/s | %.2f s | %d (%d) | %.0f ms | %.0f ms | %.1f ms | %.1f ms |\n",
			r.Start, r.To, r.Messages, r.Instances, r.Rate, r.MigrateMs/1000, r.Writes, r.Failed, r.MaxMs, r.DuringMaxMs, r.P99Ms, r.P50Ms)
	}
	return b.String()
}

// WriteReport writes the reports into dir as Markdown (ReportFile) and
// JSON (JSONFile); server names the PostgreSQL they ran on.
func WriteReport(dir, server string, reps []*Report) error {
	md := fmt.Sprintf("# `migrate up` under a writer's load\n\n%s; %s; `harness-lab bench --scenarios migrate-load`. "+
		"Each row: a schema in its start state with a backlog in orchestrator_queue, one writer calling enqueue_orchestrator_work at a steady rate, "+
		"`migrate up` to the pack's latest in the middle of it. A write's latency counts from the moment it was due, so a write held up "+
		"by the migration also delays the ones behind it and each counts its own wait.\n\n%s",
		time.Now().UTC().Format("2006-01-02"), server, Table(reps))
	return reportfile.Write(dir, ReportFile, md, JSONFile, reps)
}
