package stats

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMedian(t *testing.T) {
	require.Equal(t, 0.0, Median(nil))
	require.Equal(t, 2.0, Median([]float64{3, 1, 2}))
	require.Equal(t, 2.5, Median([]float64{4, 1, 3, 2}))
	v := []float64{3, 1, 2}
	Median(v)
	require.Equal(t, []float64{3, 1, 2}, v, "the input keeps its order")
}
