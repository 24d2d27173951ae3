package callcost

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSummarizeTakesMediansAndOrdersTheParts(t *testing.T) {
	r := Result{Samples: []Sample{
		{Us: 10, FirstMs: 2, Parts: []Part{{"f", 6}, {"g", 4}}},
		{Us: 30, FirstMs: 4, Parts: []Part{{"f", 20}, {"g", 10}}},
		{Us: 20, FirstMs: 3, Parts: []Part{{"f", 8}}}, // g took no time in this round
	}}
	summarize(&r)
	require.Equal(t, 20.0, r.Us)
	require.Equal(t, 3.0, r.FirstMs)
	require.InDelta(t, 0.5, r.Spread, 1e-9) // (30-10)/2/20
	require.Equal(t, []Part{{"f", 8}, {"g", 4}}, r.Parts)
}

func TestAccountingSubtractsEachVariantFromTheLatest(t *testing.T) {
	sides := Sides{Upstream: Side{Name: "up"}, Latest: Side{Name: "pack"}}.all()
	us := []float64{10, 30, 25, 12}
	var results []Result
	for i, s := range sides {
		results = append(results, Result{Cell: "enqueue", Side: s.Name, Us: us[i], FirstMs: float64(i)})
	}
	row := "| enqueue | 10.0 | 30.0 | +20.0 | +5.0 | +18.0 | +1.00 |"
	require.True(t, strings.Contains(Accounting(results, "pack"), row), Accounting(results, "pack"))
	require.Contains(t, Table(results), "| enqueue | pack | 30.0 | ±0% | 3.00x |")
}
