package bench

import (
	"fmt"
	"slices"
	"strings"
)

// Bounds of the scale targets (issue 15).
const (
	// scaleKBound: the fetch at the largest K within this factor of the
	// same call at the smallest K, on the after side.
	scaleKBound = 2.0
	// scaleNoiseBound: "never slower than before" allows this ratio, the
	// round-to-round noise of a shared 2-core machine at the smallest K.
	scaleNoiseBound = 1.2
	// scaleFlatBound: fetch and cycle cost at the most completed instances
	// within this factor of the fewest, on the after side.
	scaleFlatBound = 1.5
)

// scaleTargets are the targets of the scale scenario (none when it did not
// run): per seeding, the one-row and the empty fetch at the largest K
// within scaleKBound of the smallest K (after); per blocked cell, after
// never slower than before; fetch and cycle cost flat over the completed
// instances (after).
func scaleTargets(r *Result) []Target {
	if len(r.Scale) == 0 {
		return nil
	}
	var out []Target
	for _, seeding := range []string{seedSpread, seedFanIn} {
		cells := blockedCells(r.Scale, seeding)
		if len(cells) < 2 {
			continue
		}
		lo, hi := cells[0], cells[len(cells)-1]
		for _, call := range []struct{ name, early, steady string }{
			{"one-row", "row_fetch_early_ms", "row_fetch_steady_ms"},
			{"empty", "empty_fetch_early_ms", "empty_fetch_steady_ms"},
		} {
			t := Target{Name: fmt.Sprintf("scale %s: %s fetch at K=%s within %gx of K=%s (after)", seeding, call.name, count(hi.Blocked), scaleKBound, count(lo.Blocked)),
				Want: fmt.Sprintf("<= %.2fx, early and steady", scaleKBound)}
			growth := growthTarget(&t, lo, hi, scaleKBound, []string{call.early, call.steady})
			if t.Measured && !t.Met {
				t.Reason = fmt.Sprintf("the fetch's cost grew %.1fx while K grew %gx: linear in K, as a fetch that walks every blocked message at the head of the queue",
					growth, float64(hi.Blocked)/float64(lo.Blocked))
			}
			out = append(out, t)
		}
	}
	for _, seeding := range []string{seedSpread, seedFanIn} {
		for _, c := range blockedCells(r.Scale, seeding) {
			out = append(out, notSlowerTarget(c))
		}
	}
	if done := completedCells(r.Scale); len(done) >= 2 {
		lo, hi := done[0], done[len(done)-1]
		t := Target{Name: fmt.Sprintf("scale: fetch and cycle cost flat from %s to %s completed instances (after)", count(lo.Completed), count(hi.Completed)),
			Want: fmt.Sprintf("<= %.2fx: cycle fetch, ack, cycle, empty fetch", scaleFlatBound)}
		growth := growthTarget(&t, lo, hi, scaleFlatBound,
			[]string{"cycle_fetch_early_ms", "cycle_fetch_steady_ms", "cycle_ack_steady_ms", "cycle_steady_ms", "empty_fetch_early_ms", "empty_fetch_steady_ms"})
		if t.Measured && !t.Met {
			t.Reason = fmt.Sprintf("a per-call cost grew %.1fx with the completed instances: some work of every call is proportional to them", growth)
		}
		out = append(out, t)
	}
	return out
}

// blockedCells are the blocked cells of seeding, K ascending.
func blockedCells(cells []ScaleCell, seeding string) []*ScaleCell {
	var out []*ScaleCell
	for i := range cells {
		if cells[i].Kind == scaleBlockedKind && cells[i].Seeding == seeding {
			out = append(out, &cells[i])
		}
	}
	slices.SortFunc(out, func(a, b *ScaleCell) int { return a.Blocked - b.Blocked })
	return out
}

// completedCells are the completed cells, C ascending.
func completedCells(cells []ScaleCell) []*ScaleCell {
	var out []*ScaleCell
	for i := range cells {
		if cells[i].Kind == scaleCompletedKind {
			out = append(out, &cells[i])
		}
	}
	slices.SortFunc(out, func(a, b *ScaleCell) int { return a.Completed - b.Completed })
	return out
}

// growthTarget fills t from the after side's figures keys at cell hi over
// the same at lo: met when every ratio is within bound. It returns the
// largest ratio.
func growthTarget(t *Target, lo, hi *ScaleCell, bound float64, keys []string) float64 {
	defs := scaleFigures()
	var got []string
	worst := 0.0
	t.Met = true
	for _, key := range keys {
		fl, fh := lo.Figure(key), hi.Figure(key)
		if fl == nil || fh == nil || fl.After == nil || fh.After == nil {
			continue
		}
		ratio := ratio(fh.After, fl.After)
		got = append(got, fmt.Sprintf("%s %s (%s vs %s ms)", labelIn(defs, key), ratioText(ratio, fh.After, fl.After), num(fh.After), num(fl.After)))
		t.Measured = true
		if ratio == nil {
			t.Met = false
			continue
		}
		worst = max(worst, *ratio)
		t.Met = t.Met && *ratio <= bound
	}
	if !t.Measured {
		t.Met, t.Got = false, "not measured"
		return 0
	}
	t.Got = strings.Join(got, "; ")
	return worst
}

// notSlowerTarget is "after never slower than before" at blocked cell c:
// every fetch figure's ratio after/before within scaleNoiseBound.
func notSlowerTarget(c *ScaleCell) Target {
	t := Target{Name: fmt.Sprintf("scale %s: after never slower than before", c.Name()),
		Want: fmt.Sprintf("after/before <= %.2fx (1x + noise), empty and one-row, early and steady", scaleNoiseBound)}
	defs := scaleFigures()
	var worst *Figure
	t.Met = true
	for _, key := range []string{"empty_fetch_early_ms", "empty_fetch_steady_ms", "row_fetch_early_ms", "row_fetch_steady_ms"} {
		f := c.Figure(key)
		if f == nil || f.Ratio == nil {
			continue
		}
		t.Measured = true
		if worst == nil || *f.Ratio > *worst.Ratio {
			worst = f
		}
		t.Met = t.Met && *f.Ratio <= scaleNoiseBound
	}
	if worst == nil {
		t.Met, t.Got = false, "not measured"
		return t
	}
	t.Got = fmt.Sprintf("worst %s: %.2fx (%s vs %s ms)", labelIn(defs, worst.Key), *worst.Ratio, num(worst.After), num(worst.Before))
	if !t.Met {
		t.Reason = fmt.Sprintf("%s: after %s ms against before %s ms", labelIn(defs, worst.Key), num(worst.After), num(worst.Before))
	}
	return t
}
