// Package axis is the arithmetic of the reports' scales: the steps of a
// chart's grid (package bench) and the widths of a histogram's bins
// (package repro) are numbers a reader can count in.
package axis

import "math"

// Step rounds x up to 1, 2 or 5 times a power of ten (1 for x <= 0), so
// that grid lines and bin edges fall on round numbers.
func Step(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}
