package bench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/settings"
	"github.com/duroxide-pg/migrations/internal/sim/simconfig"
	"github.com/duroxide-pg/migrations/internal/sim/worker"
)

// The worker scenario: the worker queue's fetch+ack cycle before the pack's
// worker fixes and after them (migrations.WorkerFix), with and without sessions,
// at each of Config.WorkerDispatchers workers (package worker, one runtime,
// no activity time, no clock skew, the backlog kept at Config.WorkerItems
// items). Rounds alternate before, after, like the other scenarios.

// WorkerSample is what one worker cell run measured.
type WorkerSample struct {
	ElapsedS  float64 `json:"elapsed_s"`
	Completed int     `json:"completed"`
	Fetches   int     `json:"fetches"`
	// CyclesPerS is completed fetch+ack cycles per second; the latencies
	// are of the whole cycle (fetch start to ack end), of the fetches that
	// returned a row, and of the acks, in ms.
	CyclesPerS  *float64 `json:"cycles_per_s"`
	CycleP50Ms  *float64 `json:"cycle_p50_ms"`
	CycleP99Ms  *float64 `json:"cycle_p99_ms"`
	FetchP50Ms  *float64 `json:"fetch_p50_ms"`
	FetchP99Ms  *float64 `json:"fetch_p99_ms"`
	AckP50Ms    *float64 `json:"ack_p50_ms"`
	RefusedAcks *float64 `json:"refused_acks"`
	Errors      *float64 `json:"errors"`
}

// workerFigures are the figures reported for every worker cell, in order.
func workerFigures() []figureDef[WorkerSample] {
	return []figureDef[WorkerSample]{
		{"cycles_per_s", "completed cycles/s", "1/s", func(s *WorkerSample) *float64 { return s.CyclesPerS }},
		{"cycle_p50_ms", "cycle latency p50", "ms", func(s *WorkerSample) *float64 { return s.CycleP50Ms }},
		{"cycle_p99_ms", "cycle latency p99", "ms", func(s *WorkerSample) *float64 { return s.CycleP99Ms }},
		{"fetch_p50_ms", "fetch latency p50", "ms", func(s *WorkerSample) *float64 { return s.FetchP50Ms }},
		{"fetch_p99_ms", "fetch latency p99", "ms", func(s *WorkerSample) *float64 { return s.FetchP99Ms }},
		{"ack_p50_ms", "ack latency p50", "ms", func(s *WorkerSample) *float64 { return s.AckP50Ms }},
		{"refused_acks", "refused acks", "", func(s *WorkerSample) *float64 { return s.RefusedAcks }},
		{"errors", "errors", "", func(s *WorkerSample) *float64 { return s.Errors }},
	}
}

// workerRound is one round of one side of a worker cell.
type workerRound = Round[WorkerSample]

// WorkerCell is the worker scenario at one worker count, with or without
// sessions.
type WorkerCell struct {
	Workers       int     `json:"workers"`
	Sessions      int     `json:"sessions"`
	Items         int     `json:"items"`
	LockTimeoutMs int64   `json:"lock_timeout_ms"`
	DurationS     float64 `json:"duration_s"`
	Comparison[WorkerSample]
}

// Name is the cell's short name ("worker N=8", "worker+sessions N=8").
func (c *WorkerCell) Name() string {
	if c.Sessions > 0 {
		return fmt.Sprintf("worker+sessions N=%d", c.Workers)
	}
	return fmt.Sprintf("worker N=%d", c.Workers)
}

// workerCellConfig is the simulation of one worker cell.
func workerCellConfig(cfg Config, schema string, n, sessions int) worker.Config {
	return worker.Config{
		Common:   simconfig.Common{Schema: schema, LockTimeout: cfg.WorkerLockTimeout, PollInterval: cfg.PollInterval, Duration: cfg.Duration},
		Runtimes: 1, Slots: n, Items: cfg.WorkerItems, Sessions: sessions, Refill: true, NoLeaseRead: true}
}

// workerSessions is the number of sessions of a worker cell with sessions:
// two per worker, so that every worker has sessions of its own to fetch.
func workerSessions(n int) int { return 2 * n }

// runWorkerCell seeds schema and runs one worker cell on it.
func runWorkerCell(ctx context.Context, src *dbconn.Source, wcfg worker.Config) (WorkerSample, error) {
	if _, err := worker.Seed(ctx, src, wcfg); err != nil {
		return WorkerSample{}, err
	}
	log, err := worker.Run(ctx, src, wcfg)
	if err != nil {
		return WorkerSample{}, err
	}
	s := worker.Summarize(log.Events(), log.Elapsed())
	out := WorkerSample{ElapsedS: s.ElapsedS, Completed: s.Completed, Fetches: s.Fetches,
		CyclesPerS: fp(s.CompletedPerS), RefusedAcks: fp(float64(s.RefusedAcks)), Errors: fp(float64(s.OtherErrors))}
	if s.Completed > 0 {
		out.CycleP50Ms, out.CycleP99Ms, out.AckP50Ms = fp(s.CycleP50Ms), fp(s.CycleP99Ms), fp(s.AckP50Ms)
	}
	if s.Fetches > 0 {
		out.FetchP50Ms, out.FetchP99Ms = fp(s.FetchP50Ms), fp(s.FetchP99Ms)
	}
	return out, nil
}

// workerBench runs the worker cells of one round: for each worker count,
// without then with sessions, before then after.
type workerBench struct {
	src     *dbconn.Source
	cfg     Config
	schemas map[string]string // by side
	cells   []WorkerCell
}

func newWorkerBench(ctx context.Context, src *dbconn.Source, cfg Config) (*workerBench, error) {
	bug, fix, err := WorkerVersions()
	if err != nil {
		return nil, err
	}
	wb := &workerBench{src: src, cfg: cfg, schemas: map[string]string{}}
	for side, v := range map[string]int64{sideBefore: bug, sideAfter: fix} {
		wb.schemas[side] = "bench_worker_" + side
		if err := migrateSchema(ctx, src, wb.schemas[side], v); err != nil {
			return nil, err
		}
	}
	for _, n := range cfg.WorkerDispatchers {
		for _, sessions := range []int{0, workerSessions(n)} {
			wb.cells = append(wb.cells, WorkerCell{Workers: n, Sessions: sessions, Items: cfg.WorkerItems,
				LockTimeoutMs: cfg.WorkerLockTimeout.Milliseconds(), DurationS: cfg.Duration.Seconds(),
				Comparison: Comparison[WorkerSample]{BeforeVersion: bug, AfterVersion: fix}})
		}
	}
	return wb, nil
}

func (wb *workerBench) round(ctx context.Context, round int, note func(round int, label string)) error {
	for i := range wb.cells {
		c := &wb.cells[i]
		err := c.runRound(round, c.Name(), note, func(side string) (WorkerSample, error) {
			return runWorkerCell(ctx, wb.src, workerCellConfig(wb.cfg, wb.schemas[side], c.Workers, c.Sessions))
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (wb *workerBench) finish() []WorkerCell {
	for i := range wb.cells {
		wb.cells[i].computeFigures(workerFigures())
	}
	return wb.cells
}

// workerSteps is the number of worker cell runs per round.
func (c Config) workerSteps() int { return 2 * 2 * len(c.WorkerDispatchers) }

// workerTableRows are the rows of the worker cells' table.
func workerTableRows(cells []WorkerCell) (header []string, rows [][]string) {
	defs := workerFigures()
	for i := range cells {
		c := &cells[i]
		name := fmt.Sprintf("%s (v%d, v%d)", c.Name(), c.BeforeVersion, c.AfterVersion)
		rows = append(rows, figureRows(name, c.Figures, func(key string) string { return labelIn(defs, key) }, false)...)
	}
	return figureHeader(false), rows
}

// printWorkerTable writes the worker cells' medians and ratios.
func printWorkerTable(w io.Writer, cells []WorkerCell) error {
	if len(cells) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nworker: fetch_work_item + ack_worker cycles, before (v%d) and after (v%d) the worker fixes, medians over the rounds\n\n",
		cells[0].BeforeVersion, cells[0].AfterVersion)
	header, rows := workerTableRows(cells)
	return printRows(w, header, rows)
}

// workerMarkdown renders the worker cells as a markdown section.
func workerMarkdown(cells []WorkerCell, s Settings) string {
	if len(cells) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "### worker\n\nThe worker queue before (v%d) and after (v%d) the pack's worker fixes: N simulated activity workers "+
		"(one connection each, no activity time, no clock skew) loop fetch_work_item then ack_worker with a completion; "+
		"a backlog of %d items kept full (each completed item replaced); lock timeout %d ms; \"+sessions\": half the items "+
		"bound to 2N sessions and the workers session-aware, each its own owner. The cycle is fetch start to ack end.\n\n",
		cells[0].BeforeVersion, cells[0].AfterVersion, s.WorkerItems, s.WorkerLockTimeout.Milliseconds())
	header, rows := workerTableRows(cells)
	writeMarkdownTable(&b, header, rows)
	b.WriteString("\n")
	return b.String()
}

// defaultWorkerLockTimeout is the worker scenario's lock timeout: long
// enough that no lease expires, so the figures are of speed alone.
const defaultWorkerLockTimeout = 5 * time.Second

// WorkerConfig is the worker scenario's part of Config: the worker counts
// (each run without and with sessions), the backlog and the lock timeout.
type WorkerConfig struct {
	WorkerDispatchers []int         `json:"worker_dispatchers"`
	WorkerItems       int           `json:"worker_items"`
	WorkerLockTimeout time.Duration `json:"-"`
}

// workerScenario runs WorkerConfig: activity workers on the worker queue's
// pair of versions (WorkerVersions).
type workerScenario struct{ noCells }

func (workerScenario) settings(c *Config, l *settings.List) {
	l.Ints(&c.WorkerDispatchers, "WorkerDispatchers", []int{1, 8}, 1)
	l.Int(&c.WorkerItems, "WorkerItems", 500, 0)
	l.Duration(&c.WorkerLockTimeout, "WorkerLockTimeout", defaultWorkerLockTimeout, 0)
}

func (workerScenario) name() string { return ScenarioWorker }

func (workerScenario) summary() string { return pairOf(WorkerVersions()) }

func (workerScenario) steps(c Config) int { return c.workerSteps() }

func (workerScenario) prepare(ctx context.Context, r *runState) error {
	wb, err := newWorkerBench(ctx, r.src, r.cfg)
	r.worker = wb
	return err
}

func (workerScenario) round(ctx context.Context, r *runState, round int) error {
	return r.worker.round(ctx, round, r.note)
}

func (workerScenario) after(_ context.Context, r *runState) error {
	r.res.Worker = r.worker.finish()
	return nil
}
