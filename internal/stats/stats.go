// Package stats holds the summary figures the benchmarks share.
package stats

import "slices"

// Median is the middle of v (the mean of the two middle values when v has
// an even length), 0 for an empty v. v is not changed.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
