// Package eventlog is the log the simulators record their calls into (the
// dispatchers' and the activity workers'), safe for concurrent use, and the
// nearest-rank percentile their summaries use.
package eventlog

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"
)

// Log collects the events of a run, in the order they were recorded, and
// when the run started and stopped.
type Log[E any] struct {
	mu      sync.Mutex
	events  []E
	started time.Time
	stopped time.Time
}

// New returns an empty log.
func New[E any]() *Log[E] { return &Log[E]{} }

// Add records e.
func (l *Log[E]) Add(e E) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

// Len is the number of events recorded so far.
func (l *Log[E]) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.events)
}

// Events returns a copy of the events recorded so far.
func (l *Log[E]) Events() []E {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]E(nil), l.events...)
}

// Update lets f rewrite the recorded events in place, under the log's
// lock (for what is known only after the run, e.g. which fetch waited).
func (l *Log[E]) Update(f func([]E)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(l.events)
}

// MarkStart records that the run started now.
func (l *Log[E]) MarkStart() {
	l.mu.Lock()
	l.started = time.Now()
	l.mu.Unlock()
}

// MarkStop records that the run stopped now.
func (l *Log[E]) MarkStop() {
	l.mu.Lock()
	l.stopped = time.Now()
	l.mu.Unlock()
}

// Elapsed is how long the run lasted (so far, while it runs; 0 before).
func (l *Log[E]) Elapsed() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.started.IsZero():
		return 0
	case l.stopped.IsZero():
		return time.Since(l.started)
	default:
		return l.stopped.Sub(l.started)
	}
}

// ErrorTally counts the failed calls a summary has no count of its own
// for, and keeps the first as "kind: outcome". A summary embeds it untagged
// where its fields stand in the summary's JSON.
type ErrorTally struct {
	OtherErrors int    `json:"other_errors"`
	FirstError  string `json:"first_error,omitempty"`
}

// Note counts one failed call of kind with outcome.
func (t *ErrorTally) Note(kind, outcome string) {
	t.OtherErrors++
	if t.FirstError == "" {
		t.FirstError = kind + ": " + outcome
	}
}

// Percentile is the nearest-rank p-th percentile of sorted values (0 for
// none).
func Percentile(sorted []int64, p float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Leased is an event that may carry a lease: a fetch that returned a row.
type Leased interface {
	// HasRow reports a fetch that returned a row (a lease).
	HasRow() bool
	// Lease is the lease's remaining time at return (ms), and whether it
	// was lost before it could be read (the time is then unknown).
	Lease() (remainingMs int64, lost bool)
}

// Remaining returns the remaining lease at return (ms) of every fetch that
// returned a readable lease, and the number of leases lost before they
// could be read.
func Remaining[E Leased](events []E) (values []int64, lost int) {
	for _, e := range events {
		if !e.HasRow() {
			continue
		}
		if ms, gone := e.Lease(); gone {
			lost++
		} else {
			values = append(values, ms)
		}
	}
	return values, lost
}

// Tally is how often one id was produced, consumed, and is still pending.
type Tally struct {
	ID                          string
	Produced, Consumed, Pending int
}

// Conserved reports an id produced once and then either consumed once or
// still pending.
func (t Tally) Conserved() bool { return t.Produced == 1 && t.Consumed+t.Pending == 1 }

// Tallies counts every id that was produced, consumed or is pending, in id
// order: what a conservation check reads.
func Tallies(produced, consumed map[string]int, pending []string) []Tally {
	left := map[string]int{}
	for _, id := range pending {
		left[id]++
	}
	ids := map[string]bool{}
	for _, m := range []map[string]int{produced, consumed, left} {
		for id := range m {
			ids[id] = true
		}
	}
	out := make([]Tally, 0, len(ids))
	for id := range ids {
		out = append(out, Tally{ID: id, Produced: produced[id], Consumed: consumed[id], Pending: left[id]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Conservation checks that nothing was lost or delivered twice: every id
// produced was produced once and was consumed exactly once or is still
// pending, never both, and nothing else was consumed or is pending. noun
// names the ids in the error ("messages", "items"); at most ten problems
// are listed.
func Conservation(noun string, produced, consumed map[string]int, pending []string) error {
	var problems []string
	for _, t := range Tallies(produced, consumed, pending) {
		switch {
		case t.Conserved():
		case t.Produced == 0:
			if t.Consumed > 0 {
				problems = append(problems, fmt.Sprintf("%s consumed but never produced", t.ID))
			}
			if t.Pending > 0 {
				problems = append(problems, fmt.Sprintf("%s pending but never produced", t.ID))
			}
		default:
			if t.Produced > 1 {
				problems = append(problems, fmt.Sprintf("%s produced %d times", t.ID, t.Produced))
			}
			if t.Consumed+t.Pending != 1 {
				problems = append(problems, fmt.Sprintf("%s consumed %d times, pending %d times", t.ID, t.Consumed, t.Pending))
			}
		}
	}
	if len(problems) == 0 {
		return nil
	}
	sort.Strings(problems)
	if len(problems) > 10 {
		problems = append(problems[:10], fmt.Sprintf("… and %d more", len(problems)-10))
	}
	return fmt.Errorf("%s not conserved: %s", noun, strings.Join(problems, "; "))
}
