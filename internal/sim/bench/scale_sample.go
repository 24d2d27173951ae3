package bench

import "sort"

// PostgreSQL plans the queries of a PL/pgSQL function with the call's
// parameter values (custom plans) for the first 5 executions on a session,
// then may switch to a cached generic plan, which changes the fetch's cost
// by up to 10x at large K (scale-research: upstream's fetch at K = 100k
// spread went from ~30-60 ms to ~700 ms). So every scale figure is taken
// on one fresh session and reported twice: early, the median of calls 2-5
// (custom plans; call 1 also compiles the function), and steady, the median
// of calls 7 on (whatever plan the session settled on: what a pooled
// connection of a long-running dispatcher runs).
const (
	earlyFirstCall  = 2
	earlyLastCall   = 5
	steadyFirstCall = 7
)

// scaleSample is what one scale cell run (one side, one round) measured.
// Nil figures were not measured (not a figure of this kind of cell, no CPU
// reading on this backend).
type scaleSample struct {
	// EmptyCalls empty fetches were made (nothing claimable), of which
	// EmptyRowsReturned returned a row (should be 0); RowCalls one-row
	// fetches (claimable instances behind the blocked ones), of which
	// RowRowsReturned returned one (should be all).
	EmptyCalls        int `json:"empty_calls"`
	EmptyRowsReturned int `json:"empty_rows_returned"`
	RowCalls          int `json:"row_calls"`
	RowRowsReturned   int `json:"row_rows_returned"`
	// CycleCalls fetch+ack cycles were tried, CycleAcks acked (completed
	// cells).
	CycleCalls int `json:"cycle_calls"`
	CycleAcks  int `json:"cycle_acks"`
	// LargeCalls fetches of the large-history instance, each rolled back,
	// of which LargeRowsReturned returned it (completed cells).
	LargeCalls        int `json:"large_history_calls"`
	LargeRowsReturned int `json:"large_history_rows_returned"`

	EmptyEarlyMs  *float64 `json:"empty_fetch_early_ms"`
	EmptySteadyMs *float64 `json:"empty_fetch_steady_ms"`
	RowEarlyMs    *float64 `json:"row_fetch_early_ms"`
	RowSteadyMs   *float64 `json:"row_fetch_steady_ms"`
	// CPUMsPerPoll is the server CPU of the empty-fetch session's calls
	// over their number.
	CPUMsPerPoll *float64 `json:"server_cpu_ms_per_poll"`

	// Completed cells: the cycle's fetch (a row), its ack, and the whole
	// cycle, early and steady; CPUMsPerCycle the server CPU per cycle.
	CycleFetchEarlyMs  *float64 `json:"cycle_fetch_early_ms"`
	CycleFetchSteadyMs *float64 `json:"cycle_fetch_steady_ms"`
	CycleAckSteadyMs   *float64 `json:"cycle_ack_steady_ms"`
	CycleSteadyMs      *float64 `json:"cycle_steady_ms"`
	CPUMsPerCycle      *float64 `json:"server_cpu_ms_per_cycle"`
	LargeEarlyMs       *float64 `json:"large_history_fetch_early_ms"`
	LargeSteadyMs      *float64 `json:"large_history_fetch_steady_ms"`

	// Idle cell: polls completed per second (all dispatchers), their
	// latency, and the server CPU seconds per second of run.
	ElapsedS  float64  `json:"elapsed_s,omitempty"`
	Polls     int      `json:"polls,omitempty"`
	PollsPerS *float64 `json:"polls_per_s"`
	PollP50Ms *float64 `json:"poll_p50_ms"`
	CPUSPerS  *float64 `json:"server_cpu_s_per_s"`
	// CPUMsPerIdlePoll is the server CPU over the polls completed: what
	// one idle poll costs under the dispatchers' own contention.
	CPUMsPerIdlePoll *float64 `json:"server_cpu_ms_per_idle_poll"`
}

// scaleFigures are the figures of the scale cells, in report order (a
// cell shows those some side measured).
func scaleFigures() []figureDef[scaleSample] {
	return []figureDef[scaleSample]{
		{"empty_fetch_early_ms", "empty fetch, early (calls 2-5)", "ms", func(s *scaleSample) *float64 { return s.EmptyEarlyMs }},
		{"empty_fetch_steady_ms", "empty fetch, steady (calls 7+)", "ms", func(s *scaleSample) *float64 { return s.EmptySteadyMs }},
		{"row_fetch_early_ms", "one-row fetch, early", "ms", func(s *scaleSample) *float64 { return s.RowEarlyMs }},
		{"row_fetch_steady_ms", "one-row fetch, steady", "ms", func(s *scaleSample) *float64 { return s.RowSteadyMs }},
		{"server_cpu_ms_per_poll", "server CPU per empty poll", "ms", func(s *scaleSample) *float64 { return s.CPUMsPerPoll }},
		{"cycle_fetch_early_ms", "cycle: fetch, early", "ms", func(s *scaleSample) *float64 { return s.CycleFetchEarlyMs }},
		{"cycle_fetch_steady_ms", "cycle: fetch, steady", "ms", func(s *scaleSample) *float64 { return s.CycleFetchSteadyMs }},
		{"cycle_ack_steady_ms", "cycle: ack, steady", "ms", func(s *scaleSample) *float64 { return s.CycleAckSteadyMs }},
		{"cycle_steady_ms", "cycle: fetch+ack, steady", "ms", func(s *scaleSample) *float64 { return s.CycleSteadyMs }},
		{"server_cpu_ms_per_cycle", "server CPU per cycle", "ms", func(s *scaleSample) *float64 { return s.CPUMsPerCycle }},
		{"large_history_fetch_early_ms", "large-history fetch, early", "ms", func(s *scaleSample) *float64 { return s.LargeEarlyMs }},
		{"large_history_fetch_steady_ms", "large-history fetch, steady", "ms", func(s *scaleSample) *float64 { return s.LargeSteadyMs }},
		{"polls_per_s", "polls completed/s", "1/s", func(s *scaleSample) *float64 { return s.PollsPerS }},
		{"poll_p50_ms", "poll latency p50", "ms", func(s *scaleSample) *float64 { return s.PollP50Ms }},
		{"server_cpu_s_per_s", "server CPU per second", "s/s", func(s *scaleSample) *float64 { return s.CPUSPerS }},
		{"server_cpu_ms_per_idle_poll", "server CPU per completed poll", "ms", func(s *scaleSample) *float64 { return s.CPUMsPerIdlePoll }},
	}
}

// phases splits the latencies (µs) of calls 1..n of one session into the
// early figure (median of calls earlyFirstCall..earlyLastCall) and the
// steady one (median of calls steadyFirstCall..n), in ms; nil where the
// session made too few calls.
func phases(us []int64) (early, steady *float64) {
	return medianMs(callRange(us, earlyFirstCall, earlyLastCall)), medianMs(callRange(us, steadyFirstCall, len(us)))
}

// callRange is the latencies of calls first..last (1-based, inclusive).
func callRange(us []int64, first, last int) []int64 {
	if first > len(us) || last < first {
		return nil
	}
	return us[first-1 : min(last, len(us))]
}

// medianMs is the median of latencies in µs, in ms; nil for none.
func medianMs(us []int64) *float64 {
	if len(us) == 0 {
		return nil
	}
	s := make([]float64, len(us))
	for i, v := range us {
		s[i] = float64(v)
	}
	sort.Float64s(s)
	n := len(s)
	m := s[n/2]
	if n%2 == 0 {
		m = (s[n/2-1] + s[n/2]) / 2
	}
	return fp(m / 1000)
}
