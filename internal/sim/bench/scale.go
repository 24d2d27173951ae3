package bench

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/duroxide-pg/migrations/internal/packfacts"
	"github.com/duroxide-pg/migrations/internal/sim/settings"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/dbconn"
)

// The scale scenario (issue 15): what one fetch_orchestration_item costs
// as the queue fills with messages nobody may take, and as completed
// instances pile up in the database.
//
//   - blocked cells: K unclaimed visible messages of instances that hold a
//     live lease at the head of the queue, "spread" over
//     Config.ScaleSpreadInstances instances or all on one "fan_in" instance
//     (a fan-in orchestration receiving activity completions while it runs
//     its turn). Figures: the empty fetch (nothing claimable behind them:
//     the idle poll) and the one-row fetch (Config.ScaleClaimable claimable
//     instances queued behind them), early and steady (see scaleCalls), and
//     the server CPU per empty poll.
//   - idle cell: Config.ScaleIdleDispatchers dispatchers polling the empty
//     fetch at the runtime's poll interval over the largest spread K:
//     server CPU per second.
//   - completed cells: Config.ScaleCompleted completed instances with
//     their histories and nothing queued, plus one small claimable
//     instance: its fetch+ack cycle (fetch and ack timed apart) and the
//     empty fetch.
//
// Before is the version just before the pack's first fix of the fetch
// (upstream's own function), after the pack's latest version (every fix):
// ScaleVersions. Each cell is seeded once per side, then its rounds run
// before, after, before, after, ... on fresh sessions; every call passes
// the runtime's version filter, as the runtime always does.

// Kinds of scale cells (also the JSON values).
const (
	scaleBlockedKind   = "blocked"
	scaleIdleKind      = "idle"
	scaleCompletedKind = "completed"
)

// Seedings of the blocked messages (also the JSON values).
const (
	seedSpread = "spread"
	seedFanIn  = "fan_in"
)

// ScaleVersions are the versions the scale scenario compares: the version
// just before the pack's first fix of fetch_orchestration_item, and the
// pack's latest (read from sql/), so that a later fix of the fetch's cost
// is the after side without a change here.
func ScaleVersions() (before, after int64, err error) {
	bug, _, err := packfacts.FetchFix()
	return bug, migrations.Latest(), err
}

// ScaleCell is one cell of the scale scenario: its shape, what seeding
// created on each side, every round of every side and the figures.
type ScaleCell struct {
	Kind string `json:"kind"`
	// Seeding is how the blocked messages are spread (blocked and idle
	// cells); Blocked is K, LeasedInstances the instances holding them.
	Seeding         string `json:"seeding,omitempty"`
	Blocked         int    `json:"blocked_messages"`
	LeasedInstances int    `json:"leased_instances"`
	// Claimable is the number of claimable instances queued behind the
	// blocked messages in the one-row fetch (completed cells: the one
	// cycled instance).
	Claimable int `json:"claimable_instances"`
	// Completed is the number of completed instances in the database,
	// each with CompletedHistory events.
	Completed        int `json:"completed_instances"`
	CompletedHistory int `json:"completed_history_events,omitempty"`
	// LargeHistory and EventBytes shape the large-history instance whose
	// fetch completed cells time (0: none).
	LargeHistory int `json:"large_history_events,omitempty"`
	EventBytes   int `json:"event_bytes,omitempty"`
	// Dispatchers polls at PollIntervalMs for DurationS (idle cell).
	Dispatchers    int     `json:"dispatchers,omitempty"`
	PollIntervalMs int64   `json:"poll_interval_ms,omitempty"`
	DurationS      float64 `json:"duration_s,omitempty"`
	// Calls is the number of calls per figure and session.
	Calls int `json:"calls,omitempty"`
	// SeededBlocked counts, per side, the messages seeding left unclaimed,
	// visible and behind a live lease (should be Blocked).
	SeededBlocked map[string]int `json:"seeded_blocked"`
	Comparison[scaleSample]
}

// Name is the cell's short name ("spread K=10k", "idle N=32 K=100k",
// "completed C=10k").
func (c *ScaleCell) Name() string {
	switch c.Kind {
	case scaleIdleKind:
		return fmt.Sprintf("idle N=%d K=%s", c.Dispatchers, count(c.Blocked))
	case scaleCompletedKind:
		return "completed C=" + count(c.Completed)
	}
	return fmt.Sprintf("%s K=%s", c.Seeding, count(c.Blocked))
}

// count writes n as 1k, 10k, 1.5k, ... where that is exact.
func count(n int) string {
	switch {
	case n >= 1000000 && n%100000 == 0:
		return trimZero(float64(n)/1e6) + "M"
	case n >= 1000 && n%100 == 0:
		return trimZero(float64(n)/1e3) + "k"
	}
	return fmt.Sprint(n)
}

func trimZero(x float64) string {
	if x == float64(int(x)) {
		return fmt.Sprint(int(x))
	}
	return fmt.Sprintf("%.1f", x)
}

// ascending is a sorted copy of ns without duplicates.
func ascending(ns []int) []int {
	s := slices.Clone(ns)
	slices.Sort(s)
	return slices.Compact(s)
}

// scaleCells are the scale cells of cfg in run order: spread K ascending,
// the idle cell (over the largest spread K, whose seeding it reuses),
// fan-in K ascending, completed C ascending; no round run yet.
func scaleCells(cfg Config, before, after int64) []ScaleCell {
	cmp := func() Comparison[scaleSample] {
		return Comparison[scaleSample]{BeforeVersion: before, AfterVersion: after}
	}
	blocked := func(seeding string, k int) ScaleCell {
		leased := 1
		if seeding == seedSpread {
			leased = min(cfg.ScaleSpreadInstances, max(k, 1))
		}
		return ScaleCell{Kind: scaleBlockedKind, Seeding: seeding, Blocked: k, LeasedInstances: leased,
			Claimable: cfg.ScaleClaimable, Calls: cfg.ScaleCalls, Comparison: cmp()}
	}
	var out []ScaleCell
	ks := ascending(cfg.ScaleBlocked)
	for _, k := range ks {
		out = append(out, blocked(seedSpread, k))
	}
	if len(ks) > 0 && cfg.ScaleIdleDispatchers > 0 {
		idle := blocked(seedSpread, ks[len(ks)-1])
		idle.Kind, idle.Calls, idle.Claimable = scaleIdleKind, 0, 0
		idle.Dispatchers, idle.PollIntervalMs, idle.DurationS = cfg.ScaleIdleDispatchers, cfg.PollInterval.Milliseconds(), cfg.ScaleIdleDuration.Seconds()
		out = append(out, idle)
	}
	for _, k := range ks {
		out = append(out, blocked(seedFanIn, k))
	}
	for _, c := range ascending(cfg.ScaleCompleted) {
		out = append(out, ScaleCell{Kind: scaleCompletedKind, Completed: c, CompletedHistory: cfg.ScaleCompletedHistory,
			LargeHistory: cfg.ScaleLargeHistory, EventBytes: cfg.EventBytes, Claimable: 1, Calls: cfg.ScaleCalls, Comparison: cmp()})
	}
	return out
}

// validateScale rejects scale settings that cannot run.
func (c Config) validateScale() error {
	for _, k := range c.ScaleBlocked {
		if k < 1 {
			return fmt.Errorf("bench: scale: blocked message counts must be >= 1, got %d", k)
		}
	}
	for _, n := range c.ScaleCompleted {
		if n < 0 {
			return fmt.Errorf("bench: scale: completed instance counts must be >= 0, got %d", n)
		}
	}
	return nil
}

// runScale runs the scale scenario: it migrates one schema per side, then
// for each cell seeds both sides (the idle cell keeps the seeding of the
// cell before it) and runs its rounds, before then after in each.
func runScale(ctx context.Context, src *dbconn.Source, cfg Config, cpu *serverCPU, note func(round int, label string)) ([]ScaleCell, error) {
	before, after, err := ScaleVersions()
	if err != nil {
		return nil, err
	}
	schemas := map[string]string{sideBefore: "bench_scale_before", sideAfter: "bench_scale_after"}
	for side, v := range map[string]int64{sideBefore: before, sideAfter: after} {
		if err := migrateSchema(ctx, src, schemas[side], v); err != nil {
			return nil, err
		}
	}
	cells := scaleCells(cfg, before, after)
	var seeded map[string]int
	for i := range cells {
		c := &cells[i]
		if c.Kind != scaleIdleKind {
			seeded = map[string]int{}
			for _, side := range []string{sideBefore, sideAfter} {
				n, err := seedScale(ctx, src, schemas[side], shapeOf(c))
				if err != nil {
					return nil, fmt.Errorf("bench: %s: %w", c.Name(), err)
				}
				seeded[side] = n
			}
		}
		c.SeededBlocked = seeded
		for round := 1; round <= cfg.Rounds; round++ {
			err := c.runRound(round, "scale "+c.Name(), note, func(side string) (scaleSample, error) {
				return measureScale(ctx, src, schemas[side], c, cfg, cpu)
			})
			if err != nil {
				return nil, err
			}
		}
		c.computeFigures(scaleFigures())
	}
	return cells, nil
}

// ScaleConfig is the scale scenario's part of Config. ScaleBlocked are the
// K values (blocked messages), each seeded spread over
// ScaleSpreadInstances leased instances and all on one fan-in instance;
// ScaleClaimable the claimable instances queued behind them for the
// one-row fetch; ScaleCompleted the completed-instance counts, each with
// ScaleCompletedHistory history events; ScaleCalls the fetch calls per
// figure on one session (at least 7: calls 2-5 are the early figure, 7 on
// the steady one); ScaleIdleDispatchers idle dispatchers poll for
// ScaleIdleDuration at the largest K; ScaleLargeHistory is the history
// (events of about EventBytes) of the instance whose fetch the completed
// cells time against the small cycled one's, to split a fetch's cost
// between history load and candidate search.
type ScaleConfig struct {
	ScaleBlocked          []int         `json:"scale_blocked"`
	ScaleSpreadInstances  int           `json:"scale_spread_instances"`
	ScaleClaimable        int           `json:"scale_claimable"`
	ScaleCompleted        []int         `json:"scale_completed"`
	ScaleCompletedHistory int           `json:"scale_completed_history_events"`
	ScaleCalls            int           `json:"scale_calls"`
	ScaleIdleDispatchers  int           `json:"scale_idle_dispatchers"`
	ScaleIdleDuration     time.Duration `json:"-"`
	ScaleLargeHistory     int           `json:"scale_large_history_events"`
}

// scaleScenario runs ScaleConfig: the fetch's cost against the rows it
// skips (blocked messages, completed instances), in rounds of its own after
// the others'.
type scaleScenario struct{ noCells }

// settings: the counts and the idle polling have their flags; a figure
// needs steadyFirstCall calls to measure the steady-state plan.
func (scaleScenario) settings(c *Config, l *settings.List) {
	l.Ints(&c.ScaleBlocked, "ScaleBlocked", []int{1000, 10000, 100000}, 0).Flag("scale-blocked", "scale: blocked message counts K, comma-separated")
	l.Int(&c.ScaleSpreadInstances, "ScaleSpreadInstances", 500, 0)
	l.Int(&c.ScaleClaimable, "ScaleClaimable", 3, 0)
	l.Ints(&c.ScaleCompleted, "ScaleCompleted", []int{0, 10000, 100000}, 0).Flag("scale-completed", "scale: completed instance counts, comma-separated")
	l.Int(&c.ScaleCompletedHistory, "ScaleCompletedHistory", 10, 0)
	l.Int(&c.ScaleCalls, "ScaleCalls", 12, steadyFirstCall).Flag("scale-calls", fmt.Sprintf("scale: fetch calls per figure on one session (at least %d)", steadyFirstCall))
	l.Int(&c.ScaleIdleDispatchers, "ScaleIdleDispatchers", 32, 1).Flag("scale-idle-dispatchers", "scale: idle dispatchers polling at the largest K")
	l.Duration(&c.ScaleIdleDuration, "ScaleIdleDuration", 3*time.Second, MinDuration).Flag("scale-idle-duration", "scale: how long the idle dispatchers poll, per version and round")
	l.Int(&c.ScaleLargeHistory, "ScaleLargeHistory", 500, 0)
}

func (scaleScenario) name() string { return scale }

func (scaleScenario) summary() string { return pairOf(ScaleVersions()) }

func (scaleScenario) steps(c Config) int { return 2 * len(scaleCells(c, 0, 0)) }

// validate holds the counts when the scenario runs (the calls and the
// idle settings are held whatever runs, by their least in settings).
func (scaleScenario) validate(c Config, chosen bool) error {
	if !chosen {
		return nil
	}
	return c.validateScale()
}

func (scaleScenario) after(ctx context.Context, r *runState) error {
	var err error
	r.res.Scale, err = runScale(ctx, r.src, r.cfg, r.cpu, r.note)
	return err
}
