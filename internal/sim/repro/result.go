package repro

import (
	"context"
	"fmt"
	"slices"

	"github.com/duroxide-pg/migrations/internal/packfacts"

	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/dbconn"
)

// The shape every scenario repro (organic, worker) shares: a simulation
// run at each schema version, one after the other, with the same seed and
// settings, then judged: the versions below the fix must show the bug, the
// fix must be clean.

// WorkerVersions are the schema versions the worker repros compare: the
// version before the pack's fixes of the worker queue, and the last of them
// (read from sql/).
func WorkerVersions() (bug, fix int64, err error) { return packfacts.WorkerFix() }

// versionsRun are the oldest and the newest version of runs (0 for none):
// the versions a result compared, read from the result rather than from
// the pack.
func versionsRun[S, E any](runs []SchemaRun[S, E]) (oldest, newest int64) {
	for i, r := range runs {
		if i == 0 || r.Version < oldest {
			oldest = r.Version
		}
		newest = max(newest, r.Version)
	}
	return oldest, newest
}

// SchemaRun is a scenario on one schema (a pack version, or a side of a
// comparison of sides): the summary S of its simulation and the events E
// it recorded.
type SchemaRun[S, E any] struct {
	// Version is the pack's version of the schema, 0 on a side.
	Version int64 `json:"version,omitempty"`
	// Side and Made name the side the run is of (SideUpstream, ...), and
	// what built its schema; empty on a run at a pack version.
	Side    string `json:"side,omitempty"`
	Made    string `json:"made,omitempty"`
	Schema  string `json:"schema"`
	Summary S      `json:"summary"`
	// Segments is how many runs of the configured duration the version
	// took (the organic scenario runs a side again on the same queue, up
	// to MaxSegments, until it can be judged); 0 when not counted.
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

// Label names the run in tables: its side, or "vN".
func (r SchemaRun[S, E]) Label() string { return runLabel(r.Version, r.Side) }

func runLabel(version int64, side string) string {
	if side != "" {
		return side
	}
	return fmt.Sprintf("v%d", version)
}

// Check is one verdict criterion, of the run at Version or of Side.
type Check struct {
	Version int64  `json:"version,omitempty"`
	Side    string `json:"side,omitempty"`
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
type Result[Set, Cal, S, E any, V verdict] struct {
	Settings    Set               `json:"settings"`
	Calibration *Cal              `json:"calibration,omitempty"`
	Runs        []SchemaRun[S, E] `json:"runs"`
	Verdict     V                 `json:"verdict"`
}

// OK is the verdict: the bug shown below the fix, and the fix clean.
func (r Result[Set, Cal, S, E, V]) OK() bool { return r.Verdict.passed() }

// verdict is a scenario's verdict type: Verdict, or a type embedding it.
type verdict interface{ passed() bool }

func (v Verdict) passed() bool { return v.OK }

// Run returns the run of version, or nil.
func (r *Result[Set, Cal, S, E, V]) Run(version int64) *SchemaRun[S, E] {
	for i := range r.Runs {
		if r.Runs[i].Version == version {
			return &r.Runs[i]
		}
	}
	return nil
}

// Side returns the run of side key, or nil.
func (r *Result[Set, Cal, S, E, V]) Side(key string) *SchemaRun[S, E] {
	for i := range r.Runs {
		if r.Runs[i].Side == key {
			return &r.Runs[i]
		}
	}
	return nil
}

// runEach runs the scenario at each of versions, in order, on its schema
// of schemas, and collects the runs.
func runEach[S, E any](versions []int64, schemas map[int64]string, run func(version int64, schema string) (SchemaRun[S, E], error)) ([]SchemaRun[S, E], error) {
	var out []SchemaRun[S, E]
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
func shareHistogramAxis[S, E any](runs []SchemaRun[S, E], timeoutMs int64, remaining func([]E) ([]int64, int)) {
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

// role is what a run must show: the bug, the fix, or neither (its checks
// are reported, not judged).
type role int

const (
	bugRole role = iota
	fixRole
	reportedRole
)

// judgement collects the checks of a verdict: those of a run of bugRole
// decide Reproduced, those of fixRole Fixed, advisory ones and those of
// reportedRole neither.
type judgement struct {
	checks                       []Check
	sawBug, sawFix, bugOK, fixOK bool
}

func newJudgement() *judgement { return &judgement{bugOK: true, fixOK: true} }

// versionRole is the role of a run at version when fix is the first fixed
// version.
func versionRole(version, fix int64) role {
	if version < fix {
		return bugRole
	}
	return fixRole
}

// saw notes that a run of r was judged.
func (j *judgement) saw(r role) {
	switch r {
	case bugRole:
		j.sawBug = true
	case fixRole:
		j.sawFix = true
	}
}

// add records check c of a run of role r.
func (j *judgement) add(r role, c Check) {
	if r == reportedRole {
		c.Advisory = true
	}
	j.checks = append(j.checks, c)
	switch {
	case c.Advisory:
	case r == bugRole:
		j.bugOK = j.bugOK && c.Pass
	default:
		j.fixOK = j.fixOK && c.Pass
	}
}

// run notes that a run of role r (at version, or of side) is judged and
// returns what adds its checks.
func (j *judgement) run(r role, version int64, side string) func(name, want, got string, pass, advisory bool) {
	j.saw(r)
	return func(name, want, got string, pass, advisory bool) {
		j.add(r, Check{Version: version, Side: side, Name: name, Want: want, Got: got, Pass: pass, Advisory: advisory})
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
func prepare(ctx context.Context, src *dbconn.Source, scenario string, schemas map[int64]string) (map[int64]string, error) {
	out := map[int64]string{}
	for v, schema := range schemas {
		if err := migrate.To(ctx, src.Config(), schema, int64(v)); err != nil {
			return nil, fmt.Errorf("%s: %w", scenario, err)
		}
		out[v] = schema
	}
	return out, nil
}

// schemasOf names a schema per version of the pair: prefix_vN.
func schemasOf(prefix string, bug, fix int64) map[int64]string {
	return map[int64]string{bug: fmt.Sprintf("%s_v%d", prefix, bug), fix: fmt.Sprintf("%s_v%d", prefix, fix)}
}

// checkSchemas returns the versions of schemas (version -> schema name) in
// ascending order, after checking that each schema is at its version;
// scenario names the caller in errors, prepare the function that migrates
// them.
func checkSchemas(ctx context.Context, src *dbconn.Source, schemas map[int64]string, scenario, prepare string) ([]int64, error) {
	if len(schemas) == 0 {
		return nil, fmt.Errorf("%s: no schema to run against", scenario)
	}
	versions := make([]int64, 0, len(schemas))
	for v := range schemas {
		versions = append(versions, v)
	}
	slices.Sort(versions)
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
