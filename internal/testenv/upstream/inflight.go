package upstream

import (
	"context"
	"embed"
	"fmt"
	"slices"
	"strings"

	"github.com/duroxide-pg/migrations/internal/dbconn"
)

// The migrations upstream has in flight on its branches (none released;
// ../shared/spec/upstream-in-flight.md), as our ports of them in
// upstream's format (inflight/, written from the published facts, not
// upstream's text): the start states of the tests of what a duroxide-pg
// upgrade does to a database the pack fixed. Their numbers collide across
// branches (two 0022, two 0024): each is named by its file, and applied as
// upstream's runner applies a file, recording its own row.

// The in-flight migrations, by upstream's file name.
const (
	// InFlightCandidate is upstream's candidate fix of the seed (its port
	// lives in candidate/, CandidateFile).
	InFlightCandidate = CandidateFile
	// InFlightContinuedAck redefines ack_orchestration_item: a
	// continued-as-new execution records its completion time, and the
	// executions it left without one are backfilled.
	InFlightContinuedAck = "0024_continue_as_new_completed_at.sql"
	// InFlightWorkerPlan redefines fetch_work_item with a second
	// visibility bound on the database clock, for its cached plan.
	InFlightWorkerPlan = "0022_fix_fetch_work_item_generic_plan.sql"
	// InFlightBatchedFetch adds fetch_work_items, the batched worker fetch,
	// and its indexes.
	InFlightBatchedFetch = "0022_add_batched_worker_fetch.sql"
)

//go:embed inflight
var inflightFS embed.FS

// InFlight lists the in-flight migrations this package can apply.
func InFlight() []string {
	out := []string{InFlightCandidate}
	entries, _ := inflightFS.ReadDir("inflight")
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".sql") {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out[1:])
	return out
}

// InFlightPort is our port of the in-flight migration file.
func InFlightPort(file string) (string, error) {
	if file == InFlightCandidate {
		return CandidatePort(), nil
	}
	b, err := inflightFS.ReadFile("inflight/" + file)
	if err != nil {
		return "", fmt.Errorf("no port of upstream's in-flight migration %s: %w", file, err)
	}
	return string(b), nil
}

// ApplyInFlight gives schema (made by upstream's runner) our port of the
// in-flight migration file, the way upstream's runner applies a file: the
// schema then is what a duroxide-pg release carrying the file would leave.
func ApplyInFlight(ctx context.Context, src *dbconn.Source, schema, file string) error {
	text, err := InFlightPort(file)
	if err != nil {
		return err
	}
	conn, err := src.Connect(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := ApplyMigration(ctx, conn, schema, file, text); err != nil {
		return fmt.Errorf("upstream's in-flight %s (port) into schema %s: %w", file, schema, err)
	}
	return nil
}
