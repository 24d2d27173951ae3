package migrateload

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/duroxide-pg/migrations/internal/reportfile"
)

// ReportFile and JSONFile are the files WriteReport writes.
const (
	ReportFile = "migrate-load.md"
	JSONFile   = "migrate-load.json"
)

// The targets (Targets): no write waits longer than MaxWaitMs at the
// largest backlog, and the longest wait does not grow with the backlog:
// at the largest it is within GrowthFactor of the smallest's, or within
// NoiseMs of it (a few milliseconds either way are the machine's, not the
// migration's).
const (
	MaxWaitMs    = 1000
	GrowthFactor = 2
	NoiseMs      = 20
)

// Table is the reports as a Markdown table, a row per start state, size
// and queue.
func Table(reps []*Report) string {
	var b strings.Builder
	b.WriteString("| start state | backlog: messages (instances), work items | writers | `migrate up` | queue | writes (failed) | longest wait | longest while migrating | p99 | p50 |\n" +
		"|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range reps {
		for _, w := range r.Writers {
			fmt.Fprintf(&b, "| %s, to %d | %d (%d), %d | %d/s each | %.2f s | %s | %d (%d) | %.0f ms | %.0f ms | %.1f ms | %.1f ms |\n",
				r.Start, r.To, r.Messages, r.Instances, r.WorkItems, r.Rate, r.MigrateMs/1000, w.Queue, w.Writes, w.Failed, w.MaxMs, w.DuringMaxMs, w.P99Ms, w.P50Ms)
		}
	}
	return b.String()
}

// Target is one target, judged on one start state and queue.
type Target struct {
	Start, Queue string
	// What the target is, what it wants and what was measured.
	What, Want, Got string
	Met             bool
}

// Targets judges reps: for each start state and queue, the longest wait
// at the largest backlog measured (at most MaxWaitMs), and, when more than
// one backlog was measured, its growth from the smallest to the largest.
func Targets(reps []*Report) []Target {
	type key struct{ start, queue string }
	type sized struct {
		n  int     // the backlog
		ms float64 // the longest wait
	}
	bySize := map[key][]sized{}
	var order []key
	for _, r := range reps {
		for _, w := range r.Writers {
			k := key{r.Start, w.Queue}
			if _, ok := bySize[k]; !ok {
				order = append(order, k)
			}
			bySize[k] = append(bySize[k], sized{r.Messages, w.MaxMs})
		}
	}
	var out []Target
	for _, k := range order {
		sizes := bySize[k]
		slices.SortStableFunc(sizes, func(a, b sized) int { return a.n - b.n })
		small, large := sizes[0], sizes[len(sizes)-1]
		out = append(out, Target{Start: k.start, Queue: k.queue,
			What: fmt.Sprintf("longest wait at %d", large.n), Want: fmt.Sprintf("<= %d ms", MaxWaitMs),
			Got: fmt.Sprintf("%.0f ms", large.ms), Met: large.ms <= MaxWaitMs})
		if len(sizes) > 1 && small.n < large.n {
			out = append(out, Target{Start: k.start, Queue: k.queue,
				What: fmt.Sprintf("longest wait from %d to %d", small.n, large.n),
				Want: fmt.Sprintf("does not grow: <= %dx, or +%d ms", GrowthFactor, NoiseMs),
				Got:  fmt.Sprintf("%.0f ms -> %.0f ms", small.ms, large.ms),
				Met:  large.ms <= GrowthFactor*small.ms || large.ms-small.ms <= NoiseMs})
		}
	}
	return out
}

// TargetTable is the targets as a Markdown table.
func TargetTable(ts []Target) string {
	var b strings.Builder
	b.WriteString("| start state | queue | target | want | got | |\n|---|---|---|---|---|---|\n")
	for _, t := range ts {
		verdict := "met"
		if !t.Met {
			verdict = "missed"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", t.Start, t.Queue, t.What, t.Want, t.Got, verdict)
	}
	return b.String()
}

// WriteReport writes the reports into dir as Markdown (ReportFile) and
// JSON (JSONFile); server names the PostgreSQL they ran on.
func WriteReport(dir, server string, reps []*Report) error {
	md := fmt.Sprintf("# `migrate up` under the writers' load\n\n%s; %s; `harness-lab bench --scenarios migrate-load`. "+
		"Each start state at each backlog: a schema in the start state with N messages in orchestrator_queue and N work items in worker_queue, "+
		"a writer on each queue (enqueue_orchestrator_work, enqueue_worker_work) at a steady rate, "+
		"`migrate up` to the pack's latest in the middle of it. A write's latency counts from the moment it was due, so a write held up "+
		"by the migration also delays the ones behind it and each counts its own wait.\n\n## Targets\n\n"+
		"No write waits longer than %d ms on either queue at the largest backlog, and the longest wait does not grow with the backlog "+
		"(at the largest within %dx of the smallest's, or within %d ms of it).\n\n%s\n## Measured\n\n%s",
		time.Now().UTC().Format("2006-01-02"), server, MaxWaitMs, GrowthFactor, NoiseMs, TargetTable(Targets(reps)), Table(reps))
	return reportfile.Write(dir, ReportFile, md, JSONFile, reps)
}
