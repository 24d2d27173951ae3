package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/doctor"
	"github.com/duroxide-pg/migrations/internal/packfacts"
)

func TestDoctorExitCodes(t *testing.T) {
	t.Parallel()
	latest := dbs.New(t, migrations.Latest())
	code, out, errOut := runCmd(t, runDoctor, "--dsn", latest.DSN, "--schema", latest.Schema)
	require.Equal(t, ExitOK, code, out+errOut)
	require.Contains(t, out, "schema duroxide: OK")

	code, out, _ = runCmd(t, runDoctor, "--dsn", latest.DSN, "--schema", latest.Schema, "--json")
	require.Equal(t, ExitOK, code)
	var rep map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Equal(t, "ok", rep["status"])

	d19 := dbs.New(t, packfacts.LastContiguousPort())
	code, out, errOut = runCmd(t, runDoctor, "--dsn", d19.DSN, "--schema", d19.Schema)
	require.Equal(t, 1, code)
	require.Contains(t, out, "WARNING")
	require.Contains(t, errOut, "fetch_orchestration_item")

	sqlExec(t, latest, "CREATE OR REPLACE FUNCTION "+latest.Qualify("fetch_orchestration_item")+
		`(p_now_ms bigint, p_lock_timeout_ms bigint, p_min_version_packed bigint DEFAULT NULL, p_max_version_packed bigint DEFAULT NULL)
		RETURNS TABLE(out_instance_id text, out_orchestration_name text, out_orchestration_version text, out_execution_id bigint,
		out_history jsonb, out_messages jsonb, out_lock_token text, out_attempt_count integer, out_kv_snapshot jsonb)
		LANGUAGE plpgsql AS $$ BEGIN RETURN; END $$`)
	code, out, errOut = runCmd(t, runDoctor, "--dsn", latest.DSN, "--schema", latest.Schema)
	require.Equal(t, 2, code)
	require.Contains(t, out, "CRITICAL")
	require.Contains(t, errOut, "critical")
}

func TestDoctorResetAttempts(t *testing.T) {
	t.Parallel()
	d := dbs.New(t, migrations.Latest())
	q := d.Qualify("orchestrator_queue")
	sqlExec(t, d, "INSERT INTO "+q+" (instance_id, work_item, visible_at, created_at, attempt_count) VALUES ('a', '{}', now(), now(), 99), ('b', '{}', now(), now(), 99)")
	base := []string{"--dsn", d.DSN, "--schema", d.Schema}

	code, _, _ := runCmd(t, runDoctor, base...)
	require.Equal(t, 1, code, "trapped messages are a warning")

	code, out, errOut := runCmd(t, runDoctor, append(base, "--reset-attempts", "a")...)
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, "dry run")
	code, _, _ = runCmd(t, runDoctor, base...)
	require.Equal(t, 1, code, "a dry run changes nothing")

	code, out, errOut = runCmd(t, runDoctor, append(base, "--reset-attempts", "a", "b", "--apply")...)
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, "reset attempt_count to 0 on 2 message(s)")
	code, out, _ = runCmd(t, runDoctor, base...)
	require.Equal(t, ExitOK, code, out)
}

func TestDoctorListsTheWorstTrappedInstancesAndSaysHowManyThereAre(t *testing.T) {
	t.Parallel()
	d := dbs.New(t, migrations.Latest())
	// 25 trapped instances, inst-25 the worst (attempt_count 35).
	sqlExec(t, d, "INSERT INTO "+d.Qualify("orchestrator_queue")+" (instance_id, work_item, visible_at, created_at, attempt_count) "+
		"SELECT 'inst-' || lpad(i::text, 2, '0'), '{}', now(), now(), 10 + i FROM generate_series(1, 25) i")
	base := []string{"--dsn", d.DSN, "--schema", d.Schema}

	code, out, _ := runCmd(t, runDoctor, base...)
	require.Equal(t, 1, code)
	require.Contains(t, out, "trapped messages (attempt_count > 10), the worst 20 of 25 instances (--list-limit 0 lists every one):")
	require.Contains(t, out, "inst-25")
	require.NotContains(t, out, "inst-05", "the five least trapped are not listed")

	var r doctor.Report
	code, out, _ = runCmd(t, runDoctor, append(base, "--json", "--list-limit", "0")...)
	require.Equal(t, 1, code)
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.Equal(t, 25, r.TrappedInstances)
	require.Len(t, r.Trapped, 25, "--list-limit 0: every trapped instance")
	require.Equal(t, "inst-25", r.Trapped[0].InstanceID, "the worst first")

	code, out, _ = runCmd(t, runDoctor, append(base, "--json", "--list-limit", "3")...)
	require.Equal(t, 1, code)
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.Equal(t, 25, r.TrappedInstances)
	require.Len(t, r.Trapped, 3)

	code, _, errOut := runCmd(t, runDoctor, append(base, "--list-limit", "-1")...)
	require.Equal(t, ExitUsage, code)
	require.Contains(t, errOut, "--list-limit")
}

func TestDoctorReportsAndResetsTrappedWorkerItems(t *testing.T) {
	t.Parallel()
	d := dbs.New(t, migrations.Latest())
	// Instance w: two activities the runtime would poison, one fine; x: one
	// fine activity.
	sqlExec(t, d, "INSERT INTO "+d.Qualify("worker_queue")+" (work_item, visible_at, created_at, instance_id, execution_id, activity_id, attempt_count) VALUES "+
		"('{}', now(), now(), 'w', 1, 1, 40), ('{}', now(), now(), 'w', 1, 2, 12), ('{}', now(), now(), 'w', 1, 3, 1), ('{}', now(), now(), 'x', 1, 1, 2)")
	base := []string{"--dsn", d.DSN, "--schema", d.Schema}

	var r doctor.Report
	code, out, _ := runCmd(t, runDoctor, append(base, "--json")...)
	require.Equal(t, 1, code, "trapped worker items are a warning")
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.EqualValues(t, 2, r.WorkerTrappedItems)
	require.EqualValues(t, 1, r.WorkerTrappedInstances)
	require.EqualValues(t, 40, r.WorkerMaxAttemptCount)
	require.Contains(t, out, "2 worker item(s) of 1 instance(s) were fetched more than 10 times (worst: w, 40 attempts)")
	code, out, _ = runCmd(t, runDoctor, append(base, "--format", "prometheus")...)
	require.Equal(t, 1, code)
	require.Contains(t, out, `duroxide_doctor_worker_trapped_items{schema="duroxide",max_attempts="10"} 2`)
	require.Contains(t, out, `duroxide_doctor_worker_max_attempt_count{schema="duroxide"} 40`)

	code, out, errOut := runCmd(t, runDoctor, append(base, "--reset-attempts", "w", "nobody")...)
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, "dry run: would reset attempt_count to 0 on 0 message(s) and 3 worker item(s)")
	require.Contains(t, out, "no orchestrator message or worker item for: nobody")
	code, out, errOut = runCmd(t, runDoctor, append(base, "--reset-attempts", "w", "--apply")...)
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, "reset attempt_count to 0 on 0 message(s) and 3 worker item(s)")
	code, out, _ = runCmd(t, runDoctor, base...)
	require.Equal(t, ExitOK, code, out)
	var left int
	conn := d.Conn(t, "")
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT count(*) FROM "+d.Qualify("worker_queue")+" WHERE attempt_count > 0").Scan(&left))
	require.Equal(t, 1, left, "x's item is not touched")
}

func TestDoctorBadInput(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--reset-attempts"},
		{"inst"},
		{"--apply", "--dsn", "postgres://x@127.0.0.1/db"},
		{"--max-attempts", "0", "--dsn", "postgres://x@127.0.0.1/db"},
	} {
		code, _, errOut := runCmd(t, runDoctor, args...)
		require.Equal(t, ExitUsage, code, "%v", args)
		require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
	}
}

func TestDoctorExitCodesTellACriticalDatabaseFromABrokenCheck(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCmd(t, runDoctor, "--json", "--dsn", "postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=2")
	require.Equal(t, exitCritical, code, "a database that cannot be reached is critical")
	require.Contains(t, errOut, "critical")
	require.Contains(t, out, `"status":"critical"`)
	require.NotContains(t, out+errOut, "hunter2", "passwords are never printed")

	code, _, errOut = runCmd(t, runDoctor, "--dsn", "postgres://u@%zz/db")
	require.Equal(t, ExitUsage, code, "a malformed DSN is bad input: %s", errOut)
	require.NotEqual(t, exitCritical, ExitUsage, "monitoring can tell them apart")
}

func TestDoctorWritesPrometheusTextForTheTextfileCollector(t *testing.T) {
	t.Parallel()
	latest := dbs.New(t, migrations.Latest())
	code, out, errOut := runCmd(t, runDoctor, "--dsn", latest.DSN, "--schema", latest.Schema, "--format", "prometheus")
	require.Equal(t, ExitOK, code, errOut)
	require.Contains(t, out, "# TYPE duroxide_doctor_status gauge\n")
	require.Contains(t, out, `duroxide_doctor_status{schema="duroxide"} 0`)
	// One line per function, naming the fix in force: the newest that
	// serves upstream 19's behaviour (20's, for the ack, is served by the
	// same fix). A function only an unreleased upstream migration adds is
	// absent here, and not listed.
	lines := 0
	for _, fn := range fixedFunctions() {
		fix, _, ok := migrations.FixFor(fn, 19, migrations.Latest())
		if !ok {
			require.NotContains(t, out, `function="`+fn+`"`)
			continue
		}
		lines++
		require.Contains(t, out, `duroxide_doctor_function_fixed{schema="duroxide",function="`+fn+`",fixed_by="`+fix.File+`",verdict="fixed"} 1`)
	}
	require.Equal(t, lines, strings.Count(out, "duroxide_doctor_function_fixed{"), "each function once")
	require.Contains(t, out, `duroxide_doctor_fixes_replaced{schema="duroxide"} 0`)
	require.Contains(t, out, `duroxide_doctor_max_attempt_count{schema="duroxide"} 0`)

	d19 := dbs.New(t, packfacts.LastContiguousPort())
	code, out, _ = runCmd(t, runDoctor, "--dsn", d19.DSN, "--schema", d19.Schema, "--format", "prometheus")
	require.Equal(t, ExitFailure, code, "a warning exits 1 in every format")
	require.Contains(t, out, `duroxide_doctor_status{schema="duroxide"} 1`)
	require.Contains(t, out, `duroxide_doctor_check{schema="duroxide",check="fetch_orchestration_item"} 1`)

	code, out, _ = runCmd(t, runDoctor, "--format", "prometheus", "--dsn", "postgres://u@127.0.0.1:1/db?connect_timeout=2")
	require.Equal(t, exitCritical, code)
	require.Contains(t, out, `duroxide_doctor_status{schema="duroxide"} 2`, "an unreachable database still writes a status for the alert")

	code, _, errOut = runCmd(t, runDoctor, "--format", "yaml", "--dsn", latest.DSN)
	require.Equal(t, ExitUsage, code, errOut)

	// Bad input still writes the status a textfile collector reads: a
	// cron job with a typo must not leave the metrics file empty.
	for _, args := range [][]string{
		{"--format", "prometheus", "--env", "no-such-environment", "--config", "/nonexistent/goose.yaml"},
		{"--format=prometheus", "--dsn", latest.DSN, "--schema", "s", "--max-attempts", "0"},
		{"--format", "prometheus", "--dsn", latest.DSN, "--no-such-flag"},
		{"--dsn", "postgres://[::1", "--format", "prometheus", "--schema", "app"},
	} {
		code, out, errOut := runCmd(t, runDoctor, args...)
		require.Equal(t, ExitUsage, code, "%v: %s", args, errOut)
		require.Regexp(t, `duroxide_doctor_status\{schema="(duroxide|s|app)"\} 2\n`, out, "%v", args)
	}
	code, out, _ = runCmd(t, runDoctor, "--format", "json", "--max-attempts", "0", "--dsn", latest.DSN)
	require.Equal(t, ExitUsage, code)
	require.Empty(t, out, "only the prometheus format writes on bad input")
}

func TestDoctorWatchRewritesOneLineUntilStopped(t *testing.T) {
	t.Parallel()
	latest := dbs.New(t, migrations.Latest())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	env := &Env{Program: "harness", Stdout: &out, Stderr: &errOut}
	done := make(chan int)
	go func() {
		done <- report(env, runDoctor(ctx, env, []string{"--dsn", latest.DSN, "--schema", latest.Schema, "--watch", "100ms"}))
	}()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "(check 3,") }, 20*time.Second, 20*time.Millisecond,
		"three checks, one per interval")
	cancel() // Ctrl-C
	require.Equal(t, ExitOK, <-done, errOut.String())
	got := out.String()
	require.True(t, strings.HasSuffix(got, "\n"), "the line is ended when it stops")
	require.Zero(t, strings.Count(strings.TrimSuffix(got, "\n"), "\n"), "one line, rewritten in place: %q", got)
	require.GreaterOrEqual(t, strings.Count(got, "\r"), 3)
	fixed := 0
	for _, fn := range fixedFunctions() {
		if _, _, ok := migrations.FixFor(fn, 19, migrations.Latest()); ok {
			fixed++ // the others only an unreleased upstream migration adds: absent here
		}
	}
	require.Contains(t, got, fmt.Sprintf("OK  fixed %d/%d, max attempt_count 0, trapped 0", fixed, fixed), "every function a fix fixes, once")

	for _, args := range [][]string{{"--watch", "10ms"}, {"--watch", "1s", "--json"}, {"--watch", "1s", "--format", "prometheus"}} {
		code, _, errOut := runCmd(t, runDoctor, append(args, "--dsn", latest.DSN)...)
		require.Equal(t, ExitUsage, code, "%v: %s", args, errOut)
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fixedFunctions are the functions the pack's fixes fix, each once.
func fixedFunctions() []string {
	var out []string
	for _, m := range migrations.Fixes() {
		for _, fn := range m.Fixes {
			if !slices.Contains(out, fn) {
				out = append(out, fn)
			}
		}
	}
	return out
}
