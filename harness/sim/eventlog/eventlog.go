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

// Percentile is the nearest-rank p-th percentile of sorted values (0 for
// none).
func Percentile(sorted []int64, p float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Conservation checks that nothing was lost or delivered twice: every id
// produced was produced once and was consumed exactly once or is still
// pending, never both, and nothing else was consumed or is pending. noun
// names the ids in the error ("messages", "items"); at most ten problems
// are listed.
func Conservation(noun string, produced, consumed map[string]int, pending []string) error {
	left := map[string]int{}
	for _, id := range pending {
		left[id]++
	}
	var problems []string
	for id, n := range produced {
		if n > 1 {
			problems = append(problems, fmt.Sprintf("%s produced %d times", id, n))
		}
		if c, l := consumed[id], left[id]; c+l != 1 {
			problems = append(problems, fmt.Sprintf("%s consumed %d times, pending %d times", id, c, l))
		}
	}
	for id := range consumed {
		if produced[id] == 0 {
			problems = append(problems, fmt.Sprintf("%s consumed but never produced", id))
		}
	}
	for id := range left {
		if produced[id] == 0 {
			problems = append(problems, fmt.Sprintf("%s pending but never produced", id))
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
