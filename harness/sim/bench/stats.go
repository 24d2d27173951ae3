package bench

import (
	"math"
	"sort"
	"time"

	"github.com/duroxide-pg/migrations/harness/sim/dispatch"
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

// SampleFromEvents reduces the events of a dispatch run that lasted
// elapsed.
func SampleFromEvents(events []dispatch.Event, elapsed time.Duration) Sample {
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

// Median is the median of the non-nil values (the mean of the two middle
// ones for an even count); nil when there is none.
func Median(values []*float64) *float64 {
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

// Ratio is num/den; nil when either is missing or den is 0 (a ratio over
// nothing: the report then says which side was 0).
func Ratio(num, den *float64) *float64 {
	if num == nil || den == nil || *den == 0 {
		return nil
	}
	return fp(*num / *den)
}

// figureDef is one figure of a sample.
type figureDef struct {
	Key   string
	Label string
	Unit  string
	get   func(*Sample) *float64
}

// figures are the figures reported for every cell, in order.
var figures = []figureDef{
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

func figureByKey(key string) figureDef {
	for _, f := range figures {
		if f.Key == key {
			return f
		}
	}
	panic("bench: no figure " + key)
}

// Figure is one figure of a cell: the median over the rounds of each side
// and the ratios. Field names are stable.
type Figure struct {
	Key  string   `json:"key"`
	Unit string   `json:"unit,omitempty"`
	V19  *float64 `json:"v19"`
	V20  *float64 `json:"v20"`
	// Ratio is V20/V19.
	Ratio *float64 `json:"ratio_20_19"`
	// Baseline is the bare single-statement queue's median (queue-only
	// cells only) and RatioToBaseline V20/Baseline.
	Baseline        *float64 `json:"baseline,omitempty"`
	RatioToBaseline *float64 `json:"ratio_20_baseline,omitempty"`
}

// Sides of a cell.
const (
	SideV19      = "v19"
	SideV20      = "v20"
	SideBaseline = "baseline"
)

// RoundSample is one round of one side of a cell.
type RoundSample struct {
	Round  int    `json:"round"`
	Side   string `json:"side"`
	Sample Sample `json:"sample"`
}

// computeFigures fills c.Figures from c.Rounds: every figure some side
// measured, medians over the rounds, and the ratios.
func (c *Cell) computeFigures() {
	c.Figures = nil
	for _, def := range figures {
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
		f := Figure{Key: def.Key, Unit: def.Unit, V19: Median(bySide[SideV19]), V20: Median(bySide[SideV20])}
		f.Ratio = Ratio(f.V20, f.V19)
		if len(bySide[SideBaseline]) > 0 {
			f.Baseline = Median(bySide[SideBaseline])
			f.RatioToBaseline = Ratio(f.V20, f.Baseline)
		}
		c.Figures = append(c.Figures, f)
	}
}

// Figure returns the cell's figure key, or nil.
func (c *Cell) Figure(key string) *Figure {
	for i := range c.Figures {
		if c.Figures[i].Key == key {
			return &c.Figures[i]
		}
	}
	return nil
}

// maxOver is the largest value of figure key over the rounds of side.
func (c *Cell) maxOver(side, key string) *float64 {
	def := figureByKey(key)
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
