package axis

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStepRoundsUpToOneTwoOrFiveTimesAPowerOfTen(t *testing.T) {
	require.Equal(t, 1.0, Step(0))
	require.Equal(t, 1.0, Step(-3))
	require.Equal(t, 1.0, Step(1))
	require.Equal(t, 20.0, Step(13))
	require.Equal(t, 50.0, Step(41))
	require.Equal(t, 100.0, Step(51))
	require.Equal(t, 100.0, Step(100))
	require.InDelta(t, 0.5, Step(0.31), 1e-9)
}
