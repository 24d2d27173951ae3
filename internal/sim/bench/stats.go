package bench

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
)

// Sample is what one cell run (one scenario, one N, one side, one round)
// measured. Figures that could not be measured (no empty fetch happened, no
// CPU reading on this backend, not a figure of this scenario) are nil, null
// in JSON.
type Sample struct {
	ElapsedS     float64 `json:"elapsed_s"`
	Cycles       int     `json:"cycles"`
	Fetches      int     `json:"fetches"`
	EmptyFetches int     `json:"empty_fetches"`
	FetchErrors  int     `json:"fetch_errors"`

	// CyclesPerS is completed fetch+ack cycles per second: acks of a normal
	// turn that succeeded, over the run's elapsed time.
	CyclesPerS *float64 `json:"cycles_per_s"`
	// FetchP50Ms and FetchP99Ms are the latency of the fetch calls that
	// returned a row; EmptyFetchP99Ms that of the calls that returned none.
	FetchP50Ms      *float64 `json:"fetch_p50_ms"`
	FetchP99Ms      *float64 `json:"fetch_p99_ms"`
	EmptyFetchP99Ms *float64 `json:"empty_fetch_p99_ms"`
	// AckP50Ms is the latency of the first ack of each batch.
	AckP50Ms *float64 `json:"ack_p50_ms"`
	// DeadOnArrival counts leases already expired, by the caller's clock,
	// when the row reached it; AckFailures first acks (of a turn or a poison
	// batch) that failed; MaxAttemptCount is the highest attempt_count a
	// fetch returned.
	DeadOnArrival   *float64 `json:"dead_on_arrival"`
	AckFailures     *float64 `json:"ack_failures"`
	MaxAttemptCount *float64 `json:"max_attempt_count"`
	// ServerCPUS is the CPU time (user + system) the PostgreSQL server's
	// processes used during the run; CPUMsPerCycle that per completed cycle.
	ServerCPUS    *float64 `json:"server_cpu_s"`
	CPUMsPerCycle *float64 `json:"server_cpu_ms_per_cycle"`
	// WallMs is the migrate scenario's figure: the wall time of Up.
	WallMs *float64 `json:"wall_ms"`
}

func fp(v float64) *float64 { return &v }

func usToMs(us int64) float64 { return math.Round(float64(us)/10) / 100 }

// percentileMs is the nearest-rank p-th percentile of latencies in µs, in
// ms; nil for no values.
func percentileMs(us []int64, p float64) *float64 {
	if len(us) == 0 {
		return nil
	}
	s := append([]int64(nil), us...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return fp(usToMs(dispatch.Percentile(s, p)))
}

// sampleFromEvents reduces the events of a dispatch run that lasted
// elapsed.
func sampleFromEvents(events []dispatch.Event, elapsed time.Duration) Sample {
	var rowLat, emptyLat, ackLat []int64
	s := Sample{ElapsedS: elapsed.Seconds()}
	dead, ackFail, maxAttempt := 0, 0, 0
	for _, e := range events {
		switch e.Kind {
		case dispatch.KindFetch:
			switch {
			case e.HasRow():
				s.Fetches++
				rowLat = append(rowLat, e.LatencyUs)
				maxAttempt = max(maxAttempt, int(e.AttemptCount))
				if e.DeadOnArrival() {
					dead++
				}
			case e.Outcome == dispatch.OutcomeEmpty:
				s.EmptyFetches++
				emptyLat = append(emptyLat, e.LatencyUs)
			default:
				s.FetchErrors++
			}
		case dispatch.KindAck, dispatch.KindPoison:
			ackLat = append(ackLat, e.LatencyUs)
			if e.Outcome != dispatch.OutcomeOK {
				ackFail++
			} else if e.Kind == dispatch.KindAck && e.Detail == "" {
				s.Cycles++
			}
		}
	}
	s.finish(rowLat, emptyLat, dead, ackFail, maxAttempt)
	s.AckP50Ms = percentileMs(ackLat, 50)
	return s
}

func (s *Sample) finish(rowLat, emptyLat []int64, dead, ackFail, maxAttempt int) {
	if s.ElapsedS > 0 {
		s.CyclesPerS = fp(float64(s.Cycles) / s.ElapsedS)
	}
	s.FetchP50Ms = percentileMs(rowLat, 50)
	s.FetchP99Ms = percentileMs(rowLat, 99)
	s.EmptyFetchP99Ms = percentileMs(emptyLat, 99)
	s.DeadOnArrival = fp(float64(dead))
	s.AckFailures = fp(float64(ackFail))
	s.MaxAttemptCount = fp(float64(maxAttempt))
}

// setCPU records the server CPU seconds of the run (cpu < 0: unknown).
func (s *Sample) setCPU(cpu float64) {
	if cpu < 0 {
		return
	}
	s.ServerCPUS = fp(cpu)
	if s.Cycles > 0 {
		s.CPUMsPerCycle = fp(1000 * cpu / float64(s.Cycles))
	}
}

// median is the median of the non-nil values (the mean of the two middle
// ones for an even count); nil when there is none.
func median(values []*float64) *float64 {
	var v []float64
	for _, p := range values {
		if p != nil && !math.IsNaN(*p) {
			v = append(v, *p)
		}
	}
	if len(v) == 0 {
		return nil
	}
	sort.Float64s(v)
	n := len(v)
	if n%2 == 1 {
		return fp(v[n/2])
	}
	return fp((v[n/2-1] + v[n/2]) / 2)
}

// ratio is num/den; nil when either is missing or den is 0 (a ratio over
// nothing: the report then says which side was 0).
func ratio(num, den *float64) *float64 {
	if num == nil || den == nil || *den == 0 {
		return nil
	}
	return fp(*num / *den)
}

// figureDef is one figure of a sample type S: its JSON key, its label in
// the reports, its unit, and how to read it from a sample.
type figureDef[S any] struct {
	Key   string
	Label string
	Unit  string
	get   func(*S) *float64
}

// dispatchFigures are the figures reported for every dispatcher cell, in
// order.
func dispatchFigures() []figureDef[Sample] {
	return []figureDef[Sample]{
		{"cycles_per_s", "completed cycles/s", "1/s", func(s *Sample) *float64 { return s.CyclesPerS }},
		{"fetch_p50_ms", "fetch latency p50", "ms", func(s *Sample) *float64 { return s.FetchP50Ms }},
		{"fetch_p99_ms", "fetch latency p99", "ms", func(s *Sample) *float64 { return s.FetchP99Ms }},
		{"empty_fetch_p99_ms", "empty-fetch p99", "ms", func(s *Sample) *float64 { return s.EmptyFetchP99Ms }},
		{"ack_p50_ms", "ack latency p50", "ms", func(s *Sample) *float64 { return s.AckP50Ms }},
		{"dead_on_arrival", "dead-on-arrival leases", "", func(s *Sample) *float64 { return s.DeadOnArrival }},
		{"ack_failures", "ack failures", "", func(s *Sample) *float64 { return s.AckFailures }},
		{"max_attempt_count", "max attempt_count", "", func(s *Sample) *float64 { return s.MaxAttemptCount }},
		{"server_cpu_s", "server CPU", "s", func(s *Sample) *float64 { return s.ServerCPUS }},
		{"server_cpu_ms_per_cycle", "server CPU per cycle", "ms", func(s *Sample) *float64 { return s.CPUMsPerCycle }},
		{"wall_ms", "wall time of Up", "ms", func(s *Sample) *float64 { return s.WallMs }},
	}
}

// defByKey returns the figure of defs with key; it panics on a key no
// figure has (a typo in this package).
func defByKey[S any](defs []figureDef[S], key string) figureDef[S] {
	for _, f := range defs {
		if f.Key == key {
			return f
		}
	}
	panic("bench: no figure " + key)
}

// labelIn is the label of figure key in defs (the key itself when none has
// it).
func labelIn[S any](defs []figureDef[S], key string) string {
	for _, f := range defs {
		if f.Key == key {
			return f.Label
		}
	}
	return key
}

// Figure is one figure of a cell: the median over the rounds of each side
// and the ratios. Field names are stable.
type Figure struct {
	Key  string `json:"key"`
	Unit string `json:"unit,omitempty"`
	// Before and After are the medians of the sides before and after the
	// fix (the cell's BeforeVersion and AfterVersion).
	Before *float64 `json:"before"`
	After  *float64 `json:"after"`
	// Ratio is After/Before.
	Ratio *float64 `json:"ratio_after_before"`
	// Bare is the bare single-statement queue's median (queue-only
	// cells only) and RatioToBare After/Bare.
	Bare        *float64 `json:"bare,omitempty"`
	RatioToBare *float64 `json:"ratio_after_bare,omitempty"`
}

// Sides of a cell: the schema before the fix, the schema with it, and (in
// queue-only cells) the bare queue.
const (
	sideBefore = "before"
	sideAfter  = "after"
	sideBare   = "bare"
)

// Round is one round of one side of a cell, with the sample S it measured.
type Round[S any] struct {
	Round  int    `json:"round"`
	Side   string `json:"side"`
	Sample S      `json:"sample"`
}

// roundSample is one round of one side of a dispatcher cell.
type roundSample = Round[Sample]

// Comparison is what every cell holds, whatever it measures: the versions
// its two sides run, every round of every side, and the figures (medians,
// ratios) computed from them.
type Comparison[S any] struct {
	// BeforeVersion and AfterVersion are the schema versions of the sides
	// before and after the fix (for a migrate cell, the version Up goes to).
	BeforeVersion int64      `json:"before_version"`
	AfterVersion  int64      `json:"after_version"`
	Rounds        []Round[S] `json:"rounds"`
	Figures       []Figure   `json:"figures"`
}

// Version is the schema version of side (0 for the bare).
func (c *Comparison[S]) Version(side string) int64 {
	switch side {
	case sideBefore:
		return c.BeforeVersion
	case sideAfter:
		return c.AfterVersion
	}
	return 0
}

// Figure returns the cell's figure key, or nil.
func (c *Comparison[S]) Figure(key string) *Figure {
	for i := range c.Figures {
		if c.Figures[i].Key == key {
			return &c.Figures[i]
		}
	}
	return nil
}

func (c *Comparison[S]) record(round int, side string, s S) {
	c.Rounds = append(c.Rounds, Round[S]{Round: round, Side: side, Sample: s})
}

// runRound runs the two sides of cell name in round, before then after,
// and records their samples; note announces each run.
func (c *Comparison[S]) runRound(round int, name string, note func(round int, label string), run func(side string) (S, error)) error {
	for _, side := range []string{sideBefore, sideAfter} {
		v := c.Version(side)
		note(round, fmt.Sprintf("%s v%d", name, v))
		s, err := run(side)
		if err != nil {
			return fmt.Errorf("bench: %s v%d round %d: %w", name, v, round, err)
		}
		c.record(round, side, s)
	}
	return nil
}

// computeFigures fills c.Figures from c.Rounds: every figure of defs some
// side measured, medians over the rounds, and the ratios.
func (c *Comparison[S]) computeFigures(defs []figureDef[S]) {
	c.Figures = nil
	for _, def := range defs {
		bySide := map[string][]*float64{}
		any := false
		for i := range c.Rounds {
			v := def.get(&c.Rounds[i].Sample)
			bySide[c.Rounds[i].Side] = append(bySide[c.Rounds[i].Side], v)
			any = any || v != nil
		}
		if !any {
			continue
		}
		f := Figure{Key: def.Key, Unit: def.Unit, Before: median(bySide[sideBefore]), After: median(bySide[sideAfter])}
		f.Ratio = ratio(f.After, f.Before)
		if len(bySide[sideBare]) > 0 {
			f.Bare = median(bySide[sideBare])
			f.RatioToBare = ratio(f.After, f.Bare)
		}
		c.Figures = append(c.Figures, f)
	}
}

// computeFigures fills c.Figures from c.Rounds.
func (c *Cell) computeFigures() { c.Comparison.computeFigures(dispatchFigures()) }

// maxOver is the largest value of figure key over the rounds of side.
func (c *Cell) maxOver(side, key string) *float64 {
	def := defByKey(dispatchFigures(), key)
	var out *float64
	for i := range c.Rounds {
		if c.Rounds[i].Side != side {
			continue
		}
		if v := def.get(&c.Rounds[i].Sample); v != nil && (out == nil || *v > *out) {
			out = fp(*v)
		}
	}
	return out
}
