package migrations_test

// The real duroxide runtime (upstream.AddonPackage, driven by
// tools/upstream/runtime.js) on three schemas of one throwaway database:
// built by the pack, made by the real provider then adopted (baseline,
// migrate up), and made by the real provider untouched (the control).
// Every scenario must give its stated output on all three, and the two pack
// schemas must log no line of the lease kind.

import (
	"context"
	"database/sql"
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

// runtimeSchemas builds the three schemas in one database and names them:
// pack (the pack's latest), adopted (real provider, baseline, migrate up),
// control (real provider only).
func runtimeSchemas(t *testing.T, p *upstream.Provider) (src *dbconn.Source, schemas []string) {
	t.Helper()
	ctx := context.Background()
	db := dbs.New(t, 0)
	const pack, adopted, control = "e2e_pack", "e2e_adopted", "e2e_control"
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
	up(pack)
	require.NoError(t, p.Migrate(ctx, db.Source, adopted))
	conn, err := sql.Open("pgx", db.DSN)
	require.NoError(t, err)
	defer conn.Close()
	_, err = baseline.Run(ctx, conn, baseline.Options{Schema: adopted})
	require.NoError(t, err, "baseline %s", adopted)
	up(adopted)
	require.NoError(t, p.Migrate(ctx, db.Source, control))
	return db.Source, []string{pack, adopted, control}
}

func TestRealRuntimeScenarios(t *testing.T) {
	p := upstream.Require(t)
	src, schemas := runtimeSchemas(t, p)
	scenarios := runtimeScenarios()
	var list []upstream.Scenario
	for _, s := range scenarios {
		list = append(list, s.Scenario)
	}
	results := map[string]*upstream.RuntimeResult{}
	for _, schema := range schemas {
		res, err := p.RunRuntime(context.Background(), src, upstream.Run{
			Schema: schema,
			Runtime: upstream.RuntimeOptions{OrchestrationConcurrency: 4, WorkerConcurrency: 8,
				WorkerTagFilter: "defaultAnd", WorkerTagFilterTags: []string{"gpu"}},
			Scenarios:  list,
			Prefix:     "e2e-",
			Wait:       90 * time.Second,
			FinalState: true,
		})
		require.NoError(t, err, schema)
		results[schema] = res
		t.Logf("%s: %d turns in %d ms; WARN/ERROR by kind: %v", schema, res.Turns, res.RunMs, res.Tally())
	}
	for _, schema := range schemas {
		res := results[schema]
		t.Run(schema, func(t *testing.T) {
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
		})
	}
	// Every scenario gives the same outcome, field by field, on all three.
	for _, schema := range schemas[1:] {
		require.Equal(t, results[schemas[0]].Results, results[schema].Results, "%s against %s", schema, schemas[0])
	}
	for _, schema := range schemas[:2] {
		res := results[schema]
		require.Empty(t, lineTexts(res.LeaseLines()), "%s: no WARN or ERROR of the lease kind", schema)
		for _, l := range res.Logs {
			require.NotEqual(t, "ERROR", l.Level, "%s: no ERROR line: %s", schema, l.Text())
		}
	}
	// The real provider's runner, run at every connection, applied nothing
	// over the pack: its fixes are what the runtime ran on.
	conn, err := sql.Open("pgx", src.DSN())
	require.NoError(t, err)
	defer conn.Close()
	for i, schema := range schemas {
		fs, err := doctor.Functions(context.Background(), conn, schema)
		require.NoError(t, err)
		require.Equal(t, i < 2, doctor.AllFixed(fs), "%s: every fixed function has its fix after the runs: %+v", schema, fs)
	}
	control := results[schemas[2]]
	t.Logf("control (real provider, unfixed): %d \"Invalid lock token\" lines, %d of the lease kind (reported, not required)",
		control.InvalidLockTokens(), len(control.LeaseLines()))
}

func lineTexts(lines []upstream.LogLine) []string {
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		out = append(out, l.Text())
	}
	return out
}
