package doctor_test

import (
	"bytes"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/harness/ops/doctor"
)

func TestPrometheusOutputParsesAndCarriesEveryCheck(t *testing.T) {
	goose := int64(21)
	rep := &doctor.Report{
		Schema: `odd"schema`, Status: doctor.Warning, GooseVersion: &goose, PackLatest: 24,
		Functions: []doctor.FunctionCheck{
			{Name: "fetch_orchestration_item", FixedBy: "0020_fetch_lease_valid_at_return.sql", Verdict: doctor.Fixed},
			{Name: "ack_orchestration_item", FixedBy: "0021_ack_locks_its_lease.sql", Verdict: doctor.Unfixed},
			{Name: "fetch_work_item", FixedBy: "0031_worker_fetch_plans_with_its_bound.sql", Verdict: doctor.Replaced},
		},
		MaxAttempts: 10, MaxAttemptCount: 57, TrappedMessages: 3, ClockSkewMs: -12,
		Findings: []doctor.Finding{
			{Severity: doctor.OK, Check: "migrations"},
			{Severity: doctor.OK, Check: "fetch_orchestration_item"},
			{Severity: doctor.Warning, Check: "ack_orchestration_item"},
			{Severity: doctor.Warning, Check: "trapped"},
		},
	}
	var b bytes.Buffer
	require.NoError(t, rep.WritePrometheus(&b))
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(&b)
	require.NoError(t, err, "the output is valid Prometheus text format:\n%s", b.String())

	value := func(name string, labels map[string]string) float64 {
		t.Helper()
		f, ok := families[name]
		require.True(t, ok, "metric %s", name)
		for _, m := range f.GetMetric() {
			match := true
			for k, v := range labels {
				found := false
				for _, l := range m.GetLabel() {
					if l.GetName() == k && l.GetValue() == v {
						found = true
					}
				}
				match = match && found
			}
			if match {
				require.Equal(t, `odd"schema`, m.GetLabel()[0].GetValue(), "schema label, escaped and read back")
				return m.GetGauge().GetValue()
			}
		}
		t.Fatalf("no %s with %v", name, labels)
		return 0
	}
	require.Equal(t, 1.0, value("duroxide_doctor_status", nil), "warning")
	require.Equal(t, 0.0, value("duroxide_doctor_check", map[string]string{"check": "migrations"}))
	require.Equal(t, 1.0, value("duroxide_doctor_check", map[string]string{"check": "ack_orchestration_item"}))
	require.Equal(t, 1.0, value("duroxide_doctor_check", map[string]string{"check": "trapped"}))
	require.Equal(t, 1.0, value("duroxide_doctor_function_fixed", map[string]string{"function": "fetch_orchestration_item"}))
	require.Equal(t, 0.0, value("duroxide_doctor_function_fixed", map[string]string{"function": "ack_orchestration_item", "verdict": "unfixed"}))
	require.Equal(t, 0.0, value("duroxide_doctor_function_fixed", map[string]string{"function": "fetch_work_item", "verdict": "replaced"}))
	require.Equal(t, 1.0, value("duroxide_doctor_fixes_replaced", nil), "one fix duroxide-pg's runner replaced")
	require.Equal(t, 57.0, value("duroxide_doctor_max_attempt_count", nil))
	require.Equal(t, 3.0, value("duroxide_doctor_trapped_messages", map[string]string{"max_attempts": "10"}))
	require.Equal(t, -12.0, value("duroxide_doctor_clock_skew_ms", nil))
	require.Equal(t, 21.0, value("duroxide_doctor_goose_version", nil))
	require.Equal(t, 24.0, value("duroxide_doctor_pack_latest_version", nil))
}
