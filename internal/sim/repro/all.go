package repro

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/duroxide-pg/migrations/internal/reportfile"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// Kinds are the repros, in the order `harness-lab repro all` runs them and
// their report shows them.
func Kinds() []string {
	return []string{"minimal", "organic", "worker-minimal", "worker", "runtime", "upgrade"}
}

// OrganicRepro makes the organic scenario's sides in the database of src
// (MakeSides, prefix organic; upstream's and the pack's must be among
// them) and runs it (RunOrganic).
func OrganicRepro(ctx context.Context, src *dbconn.Source, p *upstream.Provider, cfg OrganicConfig, sides []string, progress func(string)) (OrganicResult, error) {
	made, err := onSides(ctx, src, p, "organic repro", "organic", sides, func(side Side) (Side, error) { return side, nil })
	if err != nil {
		return OrganicResult{}, err
	}
	res, err := RunOrganic(ctx, src, made, cfg, progress)
	if err != nil {
		return res, fmt.Errorf("organic repro: %w", err)
	}
	return res, nil
}

// WorkerRepro prepares the worker scenario's schemas in the database of
// src (prepareWorker) and runs it (runWorker).
func WorkerRepro(ctx context.Context, src *dbconn.Source, cfg WorkerConfig, progress func(string)) (WorkerResult, error) {
	return prepareAndRun(ctx, src, "worker repro", prepareWorker, func(schemas map[int64]string) (WorkerResult, error) {
		return runWorker(ctx, src, schemas, cfg, progress)
	})
}

// prepareAndRun migrates a scenario's schemas with prepare, then runs it on
// them; what names the scenario in errors of the run.
func prepareAndRun[R any](ctx context.Context, src *dbconn.Source, what string, prepare func(context.Context, *dbconn.Source) (map[int64]string, error),
	run func(schemas map[int64]string) (R, error)) (R, error) {
	schemas, err := prepare(ctx, src)
	if err != nil {
		var zero R
		return zero, err
	}
	res, err := run(schemas)
	if err != nil {
		return res, fmt.Errorf("%s: %w", what, err)
	}
	return res, nil
}

// PrintOrganic writes what the organic repro is, then its table.
func PrintOrganic(w io.Writer, res OrganicResult) error {
	fmt.Fprint(w, "organic repro: simulated dispatchers on hot instances, no stale timestamps injected\n\n")
	return PrintTable(w, res)
}

// PrintWorker writes what the worker repro is, then its table.
func PrintWorker(w io.Writer, res WorkerResult) error {
	fmt.Fprint(w, "worker repro: simulated activity workers with sessions and tags, runtime clocks spread around the database's\n\n")
	return printWorkerTable(w, res)
}

// Report is what a run of several repros gave: the results of those that
// ran and their verdicts, by kind ("worker-minimal" as "worker_minimal").
// It serialises to stable snake_case JSON (`harness-lab repro --json`).
type Report struct {
	Minimal       MinimalResults       `json:"minimal,omitempty"`
	Organic       *OrganicResult       `json:"organic,omitempty"`
	WorkerMinimal WorkerMinimalResults `json:"worker_minimal,omitempty"`
	Worker        *WorkerResult        `json:"worker,omitempty"`
	Runtime       *RuntimeResult       `json:"runtime,omitempty"`
	RuntimePool   *RuntimePoolResult   `json:"runtime_pool,omitempty"`
	Upgrade       *UpgradeResult       `json:"upgrade,omitempty"`
	WorkerBatched WorkerBatchedResults `json:"worker_batched,omitempty"`
	Verdict       map[string]bool      `json:"verdict"`
}

// OK reports whether every repro that ran gave the verdict it should.
func (r Report) OK() bool {
	for _, ok := range r.Verdict {
		if !ok {
			return false
		}
	}
	return true
}

// WriteJSON writes r as indented JSON to path.
func (r Report) WriteJSON(path string) error {
	if err := reportfile.WriteJSON(path, r); err != nil {
		return fmt.Errorf("repro: write the report's JSON to %s: %w", path, err)
	}
	return nil
}

// Write writes dir/report.md, creating dir: the organic report (with its
// histogram, WriteReport) when that scenario ran, then the minimal
// scenario's table, the worker minimal scenarios' table and the worker
// scenario (with its histograms of remaining lease), for those that ran.
func (r Report) Write(dir string) error {
	if err := r.write(dir); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

func (r Report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, ReportFile)
	if r.Organic != nil {
		if err := WriteReport(dir, *r.Organic); err != nil {
			return err
		}
	} else if err := os.WriteFile(path, []byte(reportTitle), 0o644); err != nil {
		return err
	}
	var sections []string
	if len(r.Minimal) > 0 {
		sections = append(sections, minimalMarkdown(r.Minimal))
	}
	if len(r.WorkerMinimal) > 0 {
		sections = append(sections, WorkerMinimalMarkdown(r.WorkerMinimal))
	}
	if len(r.WorkerBatched) > 0 {
		sections = append(sections, workerBatchedMarkdown(r.WorkerBatched))
	}
	if r.Worker != nil {
		sections = append(sections, workerMarkdown(*r.Worker))
	}
	if r.Runtime != nil {
		sections = append(sections, runtimeMarkdown(*r.Runtime))
	}
	if r.RuntimePool != nil {
		sections = append(sections, runtimePoolMarkdown(*r.RuntimePool))
	}
	if r.Upgrade != nil {
		sections = append(sections, upgradeMarkdown(*r.Upgrade))
	}
	if len(sections) == 0 {
		return nil
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(f, "\n%s", strings.Join(sections, "\n")); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
