package repro

import (
	"context"
	"fmt"
	"sort"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/dbconn"
)

// The shape every scenario repro (organic, worker) shares: a simulation
// run at each schema version, one after the other, with the same seed and
// settings, then judged: the versions below the fix must show the bug, the
// fix must be clean.

// Versions are the schema versions the orchestration repros compare: the
// version before the pack's fix of fetch_orchestration_item, and that fix
// (read from sql/).
func Versions() (bug, fix int) { return ints(migrations.FetchFix()) }

// WorkerVersions are the schema versions the worker repros compare: the
// version before the pack's fixes of the worker queue, and the last of them
// (read from sql/).
func WorkerVersions() (bug, fix int) { return ints(migrations.WorkerFix()) }

func ints(a, b int64) (int, int) { return int(a), int(b) }

// Run is a scenario at one schema version: the summary S of its simulation
// and the events E it recorded.
type Run[S, E any] struct {
	Version int    `json:"version"`
	Schema  string `json:"schema"`
	Summary S      `json:"summary"`
	// Segments is how many runs of the configured duration the version
	// took (the organic scenario runs a version below the fix again, up
	// to MaxBugSegments, until it shows the bug); 0 when not counted.
	Segments int `json:"segments,omitempty"`
	// Conservation is "ok" when every message (or item) was consumed
	// exactly once or is still queued, else what went wrong.
	Conservation string `json:"conservation"`
	// Histogram of the remaining lease at return.
	Histogram Histogram `json:"remaining_lease_histogram"`
	// Events is every provider call of the run (not serialised: tens of
	// thousands of rows).
	Events []E `json:"-"`
}

// Check is one verdict criterion.
type Check struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	Want    string `json:"want"`
	Got     string `json:"got"`
	Pass    bool   `json:"pass"`
	// Advisory checks are reported but do not decide Reproduced or Fixed.
	Advisory bool `json:"advisory,omitempty"`
}

// Verdict says whether the runs show the bug before the fix and its
// absence with it.
type Verdict struct {
	// Reproduced: every criterion of the versions below the fix passed.
	Reproduced bool `json:"reproduced"`
	// Fixed: every criterion of the fix version passed.
	Fixed bool `json:"fixed"`
	// OK: both (and both sides were run).
	OK     bool    `json:"ok"`
	Checks []Check `json:"checks"`
}

// Result is what a scenario repro returns: its settings Set, the
// calibration Cal of its lock timeout (nil when the timeout was given), a
// run per version and the verdict V. It serialises to stable snake_case
// JSON.
type Result[Set, Cal, S, E, V any] struct {
	Settings    Set         `json:"settings"`
	Calibration *Cal        `json:"calibration,omitempty"`
	Runs        []Run[S, E] `json:"runs"`
	Verdict     V           `json:"verdict"`
}

// Run returns the run of version, or nil.
func (r *Result[Set, Cal, S, E, V]) Run(version int) *Run[S, E] {
	for i := range r.Runs {
		if r.Runs[i].Version == version {
			return &r.Runs[i]
		}
	}
	return nil
}

// runEach runs the scenario at each of versions, in order, on its schema
// of schemas, and collects the runs.
func runEach[S, E any](versions []int, schemas map[int]string, run func(version int, schema string) (Run[S, E], error)) ([]Run[S, E], error) {
	var out []Run[S, E]
	for _, v := range versions {
		r, err := run(v, schemas[v])
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// quiet is progress, or a function that drops the lines when it is nil.
func quiet(progress func(string)) func(string) {
	if progress == nil {
		return func(string) {}
	}
	return progress
}

// conservation is a run's Conservation: "ok", or what the check found.
func conservation(err error) string {
	if err != nil {
		return err.Error()
	}
	return "ok"
}

// shareHistogramAxis recomputes the runs' histograms (from their events,
// through remaining) on one common axis, so they compare at a glance. Runs
// without events keep theirs.
func shareHistogramAxis[S, E any](runs []Run[S, E], timeoutMs int64, remaining func([]E) ([]int64, int)) {
	var all []int64
	for _, r := range runs {
		v, _ := remaining(r.Events)
		all = append(all, v...)
	}
	lo, hi, w := histRange(all, timeoutMs)
	for i := range runs {
		if runs[i].Events == nil {
			continue
		}
		v, lost := remaining(runs[i].Events)
		runs[i].Histogram = buildHistogram(v, lost, lo, hi, w)
	}
}

// judgement collects the checks of a verdict: those of a version below fix
// decide Reproduced, those of fix and above Fixed, advisory ones neither.
type judgement struct {
	fix                          int
	checks                       []Check
	sawBug, sawFix, bugOK, fixOK bool
}

func newJudgement(fix int) *judgement { return &judgement{fix: fix, bugOK: true, fixOK: true} }

// buggy reports whether version is below the fix, and notes that a run of
// that side was seen.
func (j *judgement) buggy(version int) bool {
	if version < j.fix {
		j.sawBug = true
		return true
	}
	j.sawFix = true
	return false
}

func (j *judgement) add(version int, name, want, got string, pass, advisory bool) {
	j.checks = append(j.checks, Check{Version: version, Name: name, Want: want, Got: got, Pass: pass, Advisory: advisory})
	switch {
	case advisory:
	case version < j.fix:
		j.bugOK = j.bugOK && pass
	default:
		j.fixOK = j.fixOK && pass
	}
}

func (j *judgement) verdict() Verdict {
	v := Verdict{Reproduced: j.sawBug && j.bugOK, Fixed: j.sawFix && j.fixOK, Checks: j.checks}
	v.OK = v.Reproduced && v.Fixed
	return v
}

// prepare migrates each schema of schemas (version -> schema name) in the
// database of src to its version and returns them, as RunOrganic and
// runWorker take them; scenario names the caller in errors.
func prepare(ctx context.Context, src *dbconn.Source, scenario string, schemas map[int]string) (map[int]string, error) {
	out := map[int]string{}
	for v, schema := range schemas {
		if err := migrate.To(ctx, src.Config(), schema, int64(v)); err != nil {
			return nil, fmt.Errorf("%s: %w", scenario, err)
		}
		out[v] = schema
	}
	return out, nil
}

// schemasOf names a schema per version of the pair: prefix_vN.
func schemasOf(prefix string, bug, fix int) map[int]string {
	return map[int]string{bug: fmt.Sprintf("%s_v%d", prefix, bug), fix: fmt.Sprintf("%s_v%d", prefix, fix)}
}

// checkSchemas returns the versions of schemas (version -> schema name) in
// ascending order, after checking that each schema is at its version;
// scenario names the caller in errors, prepare the function that migrates
// them.
func checkSchemas(ctx context.Context, src *dbconn.Source, schemas map[int]string, scenario, prepare string) ([]int, error) {
	if len(schemas) == 0 {
		return nil, fmt.Errorf("%s: no schema to run against", scenario)
	}
	versions := make([]int, 0, len(schemas))
	for v := range schemas {
		versions = append(versions, v)
	}
	sort.Ints(versions)
	for _, v := range versions {
		got, err := schemaVersion(ctx, src, schemas[v])
		if err != nil {
			return nil, fmt.Errorf("%s: schema %s: %w", scenario, schemas[v], err)
		}
		if got != int64(v) {
			return nil, fmt.Errorf("%s: schema %s is at version %d, not %d (%s migrates it)", scenario, schemas[v], got, v, prepare)
		}
	}
	return versions, nil
}

// schemaVersion reads schema's goose version without writing (a missing
// schema is version 0, and is not created).
func schemaVersion(ctx context.Context, src *dbconn.Source, schema string) (int64, error) {
	return migrate.CurrentVersion(ctx, src.Config(), schema)
}
