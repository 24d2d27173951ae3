package migrations_test

// The real duroxide runtime (upstream.AddonPackage, driven by
// tools/upstream/runtime.js) on schemas of one throwaway database: built by
// the pack; made by the real provider, then adopted (baseline, migrate up),
// and untouched (the control); given upstream's candidate fix (port), and
// that with the amendment offered upstream, each before and after
// adoption. Every scenario must give its stated output on all of them, and
// the schemas holding the pack's fixes must log no line of the lease kind.

import (
	"context"
	"database/sql"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/baseline"
	"github.com/duroxide-pg/migrations/harness/ops/doctor"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// runtimeScenario is one end-to-end scenario and what the client must see.
type runtimeScenario struct {
	upstream.Scenario
	status, output, error string
	// extra are the scenario's own observations that must match exactly.
	extra upstream.Outcome
}

func runtimeScenarios() []runtimeScenario {
	return []runtimeScenario{
		{Scenario: upstream.Scenario{Name: "sequence"}, status: "Completed", output: `{"sum":14}`, extra: upstream.Outcome{
			"info": map[string]any{"name": "Sequence", "version": "1.0.0", "execution": 1.0, "status": "Completed", "output": `{"sum":14}`},
			"history": []any{"OrchestrationStarted", "ActivityScheduled", "ActivityCompleted", "ActivityScheduled",
				"ActivityCompleted", "ActivityScheduled", "ActivityCompleted", "OrchestrationCompleted"},
			"stats": map[string]any{"historyEventCount": 8.0, "queuePendingCount": 0.0, "kvUserKeyCount": 0.0},
		}},
		// 1² + ... + 500² = 41791750.
		{Scenario: upstream.Scenario{Name: "fanout", Count: 500}, status: "Completed", output: `{"count":500,"failed":0,"sum":41791750}`},
		{Scenario: upstream.Scenario{Name: "timer", DelayMs: 100}, status: "Completed", output: `{"timer":"null"}`, extra: upstream.Outcome{
			"history":     []any{"OrchestrationStarted", "TimerCreated", "TimerFired", "OrchestrationCompleted"},
			"deleted":     map[string]any{"instances": 1.0, "executions": 1.0, "events": true, "queueMessages": 0.0},
			"afterDelete": "NotFound",
		}},
		{Scenario: upstream.Scenario{Name: "event"}, status: "Completed", output: "approved by alice", extra: upstream.Outcome{"subscribed": true}},
		{Scenario: upstream.Scenario{Name: "raceEvent"}, status: "Completed", output: `{"winner":"event","value":"first"}`, extra: upstream.Outcome{"subscribed": true}},
		{Scenario: upstream.Scenario{Name: "raceTimer"}, status: "Completed", output: `{"winner":"timer","value":null}`},
		{Scenario: upstream.Scenario{Name: "counter", Turns: 5}, status: "Completed", output: "5", extra: upstream.Outcome{"clientValue": "5"}},
		{Scenario: upstream.Scenario{Name: "session"}, status: "Completed", output: "session-1/-/1,session-1/-/2,session-1/-/3"},
		{Scenario: upstream.Scenario{Name: "tagged", Tag: "gpu"}, status: "Completed", output: "-/gpu/1,-/gpu/2"},
		{Scenario: upstream.Scenario{Name: "suborchestration"}, status: "Completed", output: "child said 49", extra: upstream.Outcome{"treeSize": 2.0}},
		{Scenario: upstream.Scenario{Name: "continueAsNew"}, status: "Completed", output: "done at 3 in execution 3", extra: upstream.Outcome{
			"executions":           []any{1.0, 2.0, 3.0},
			"pruned":               map[string]any{"instances": 1.0, "executions": 2.0},
			"executionsAfterPrune": []any{3.0},
		}},
		{Scenario: upstream.Scenario{Name: "cancel"}, status: "Failed", error: "canceled: asked by the test", extra: upstream.Outcome{"subscribed": true}},
	}
}

// runtimeFinal is the client's view of the database once every scenario
// is done: 11 instances and the sub-orchestration's child, less the one the
// timer scenario deleted; one execution each after the prune; the
// cancelled one failed.
var runtimeFinal = map[string]any{
	"queueDepths": map[string]any{"orchestrator": 0.0, "worker": 0.0, "timer": 0.0},
	"system":      map[string]any{"totalInstances": 12.0, "totalExecutions": 12.0, "running": 0.0, "completed": 11.0, "failed": 1.0},
	"running":     0.0,
}

// e2eSchema is one schema the scenarios run on, and whether it must hold
// the pack's fixes (then it logs no line of the lease kind).
type e2eSchema struct {
	name  string
	fixed bool
	// setAside are the versions of _duroxide_migrations the addon does not
	// know, which the driver sets aside while the provider connects.
	setAside []int64
}

// runtimeSchemas builds, in one database: the pack's latest; a schema
// made by the real provider, then adopted (baseline, migrate up); the same
// untouched (the control); one that got upstream's candidate fix (port),
// before and after adoption; and one that got the candidate with the
// amendment offered upstream, before and after adoption.
func runtimeSchemas(t *testing.T, p *upstream.Provider) (src *dbconn.Source, schemas []e2eSchema) {
	t.Helper()
	ctx := context.Background()
	db := dbs.New(t, 0)
	up := func(schema string) {
		r, err := migrate.Open(ctx, db.Source.Config(), migrate.Options{Schema: schema})
		require.NoError(t, err, schema)
		defer r.Close()
		_, err = r.Up(ctx)
		require.NoError(t, err, "migrate up %s", schema)
		v, err := r.Version(ctx)
		require.NoError(t, err)
		require.Equal(t, migrations.Latest(), v, "%s: migrate up reaches the pack's latest version", schema)
	}
	conn, err := sql.Open("pgx", db.DSN)
	require.NoError(t, err)
	defer conn.Close()
	adopt := func(schema string) {
		_, err = baseline.Run(ctx, conn, baseline.Options{Schema: schema})
		require.NoError(t, err, "baseline %s", schema)
		up(schema)
	}
	provider := func(schema string, extra ...func(context.Context, *dbconn.Source, string) error) {
		require.NoError(t, p.Migrate(ctx, db.Source, schema))
		for _, apply := range extra {
			require.NoError(t, apply(ctx, db.Source, schema))
		}
	}
	up("e2e_pack")
	provider("e2e_adopted")
	adopt("e2e_adopted")
	provider("e2e_control")
	provider("e2e_candidate", upstream.ApplyCandidate)
	provider("e2e_candidate_adopted", upstream.ApplyCandidate)
	adopt("e2e_candidate_adopted")
	provider("e2e_amended", upstream.ApplyCandidate, upstream.ApplyAmendment)
	provider("e2e_amended_adopted", upstream.ApplyCandidate, upstream.ApplyAmendment)
	adopt("e2e_amended_adopted")
	// Upgrades over a database the pack fixed (upgrade_test.go), each
	// ended by one migrate up: a released line (the pack at 21 on 1..19,
	// then the runner's 20, 21 and 23), and upstream's in-flight migrations
	// applied by the runner after adoption.
	require.NoError(t, migrate.To(ctx, db.Source.Config(), "e2e_released_upgrade", orchFixedStop()))
	provider("e2e_released_upgrade")
	up("e2e_released_upgrade")
	upgraded := func(schema string, files ...string) {
		provider(schema)
		adopt(schema)
		for _, f := range files {
			require.NoError(t, upstream.ApplyInFlight(ctx, db.Source, schema, f))
		}
		up(schema)
	}
	// Two files a schema: upstream's branches number them 22 and 24 twice,
	// so each schema takes one of each.
	upgraded("e2e_upgraded_candidate_batched", upstream.InFlightCandidate, upstream.InFlightBatchedFetch)
	upgraded("e2e_upgraded_ack_plan", upstream.InFlightContinuedAck, upstream.InFlightWorkerPlan)
	return db.Source, []e2eSchema{
		{name: "e2e_pack", fixed: true},
		{name: "e2e_adopted", fixed: true},
		{name: "e2e_control"},
		{name: "e2e_candidate", setAside: []int64{24}},
		{name: "e2e_candidate_adopted", fixed: true, setAside: []int64{24}},
		{name: "e2e_amended", setAside: []int64{24, 27}},
		{name: "e2e_amended_adopted", fixed: true, setAside: []int64{24, 27}},
		{name: "e2e_released_upgrade", fixed: true},
		{name: "e2e_upgraded_candidate_batched", fixed: true, setAside: []int64{22, 24}},
		{name: "e2e_upgraded_ack_plan", fixed: true, setAside: []int64{22, 24}},
	}
}

func TestRealRuntimeScenarios(t *testing.T) {
	p := upstream.Require(t)
	src, schemas := runtimeSchemas(t, p)
	scenarios := runtimeScenarios()
	var list []upstream.Scenario
	for _, s := range scenarios {
		list = append(list, s.Scenario)
	}
	// One runtime process per schema, all at once: most of a run is the
	// scenarios' timers and polls, which overlap.
	results := map[string]*upstream.RuntimeResult{}
	errs := make([]error, len(schemas))
	runs := make([]*upstream.RuntimeResult, len(schemas))
	var wg sync.WaitGroup
	for i, schema := range schemas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runs[i], errs[i] = p.RunRuntime(context.Background(), src, upstream.RuntimeRun{
				Schema: schema.name,
				Runtime: upstream.RuntimeOptions{OrchestrationConcurrency: 4, WorkerConcurrency: 8,
					WorkerTagFilter: "defaultAnd", WorkerTagFilterTags: []string{"gpu"}},
				Scenarios:  list,
				Prefix:     "e2e-",
				Wait:       90 * time.Second,
				FinalState: true,
			})
		}()
	}
	wg.Wait()
	for i, schema := range schemas {
		require.NoError(t, errs[i], schema.name)
		res := runs[i]
		results[schema.name] = res
		t.Logf("%s: %d turns in %d ms; WARN/ERROR by kind: %v", schema.name, res.Turns, res.RunMs, res.Tally())
	}
	for _, schema := range schemas {
		res := results[schema.name]
		t.Run(schema.name, func(t *testing.T) {
			for _, s := range scenarios {
				got := res.Results[s.Name]
				require.NotNil(t, got, "scenario %s has a result", s.Name)
				require.Equal(t, s.status, got.Status(), "%s: status (%v)", s.Name, got)
				require.Equal(t, s.output, got.Output(), "%s: output", s.Name)
				require.Equal(t, s.error, got.Error(), "%s: error", s.Name)
				for k, want := range s.extra {
					require.Equal(t, want, got[k], "%s: %s", s.Name, k)
				}
			}
			require.Equal(t, runtimeFinal, res.Final, "the client's view once every scenario is done")
			require.Equal(t, schema.setAside, res.SetAside, "the versions set aside while the provider connected")
		})
	}
	// Every scenario gives the same outcome, field by field, on every schema.
	for _, schema := range schemas[1:] {
		require.Equal(t, results[schemas[0].name].Results, results[schema.name].Results, "%s against %s", schema.name, schemas[0].name)
	}
	conn, err := sql.Open("pgx", src.DSN())
	require.NoError(t, err)
	defer conn.Close()
	for _, schema := range schemas {
		res := results[schema.name]
		if schema.fixed {
			require.Empty(t, lineTexts(res.LeaseLines()), "%s: no WARN or ERROR of the lease kind", schema.name)
			for _, l := range res.Logs {
				require.NotEqual(t, "ERROR", l.Level, "%s: no ERROR line: %s", schema.name, l.Text())
			}
		} else {
			t.Logf("%s (not the pack's fix): %d \"Invalid lock token\" lines, %d of the lease kind (reported, not required)",
				schema.name, res.InvalidLockTokens(), len(res.LeaseLines()))
		}
		// The real provider's runner, run at every connection, applied
		// nothing over the pack: its fixes are what the runtime ran on; and
		// the versions set aside are back.
		fs, err := doctor.Functions(context.Background(), conn, schema.name)
		require.NoError(t, err)
		require.Equal(t, schema.fixed, doctor.AllFixed(fs), "%s: every fixed function has its fix after the runs: %+v", schema.name, fs)
		var top int64
		require.NoError(t, conn.QueryRow("SELECT max(version) FROM "+schema.name+"._duroxide_migrations").Scan(&top))
		require.Equal(t, max(int64(upstream.AddonNewest), slices.Max(append([]int64{0}, schema.setAside...))), top, "%s: _duroxide_migrations as before the runs", schema.name)
	}
}

func lineTexts(lines []upstream.LogLine) []string {
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		out = append(out, l.Text())
	}
	return out
}
