package repro

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/sim/worker"
)

// TestWorkerVerdictJudgesTheFunctionNotTheLoad: at the fix, an ack refused
// after its lease was lost and a lease taken over in its delivery are a
// starved worker's, reported; an ack refused while its lease was valid and
// a lease dead at return are the function's, judged.
func TestWorkerVerdictJudgesTheFunctionNotTheLoad(t *testing.T) {
	runs := func() []workerRun {
		return []workerRun{
			{Version: 24, Summary: worker.Summary{Fetches: 300, RefusedAcks: 4, DeadAtReturn: 2}, Conservation: "ok"},
			{Version: 31, Summary: worker.Summary{Fetches: 300}, Conservation: "ok"},
		}
	}
	require.True(t, judgeWorker(runs(), 31).OK)

	r := runs()
	r[1].Summary.RefusedAcks, r[1].Summary.LostInDelivery = 7, 3
	v := judgeWorker(r, 31)
	require.True(t, v.OK, "refused after the lease was lost, taken over in delivery: reported")
	var reported int
	for _, c := range v.Checks {
		if c.Version == 31 && c.Advisory {
			reported++
		}
	}
	require.Equal(t, 2, reported)

	r = runs()
	r[1].Summary.RefusedAcks, r[1].Summary.RefusedWhileValidAcks = 7, 1
	require.False(t, judgeWorker(r, 31).Fixed, "one ack refused while its lease was valid")
	r = runs()
	r[1].Summary.DeadAtReturn = 1
	require.False(t, judgeWorker(r, 31).Fixed, "one lease dead at return")
}
