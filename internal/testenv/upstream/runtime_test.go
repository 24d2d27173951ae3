package upstream

import "testing"

func TestLeaseKindReadsWordsNotQuotedSQL(t *testing.T) {
	cases := []struct {
		name string
		line LogLine
		want bool
	}{
		{"the seed's symptom", LogLine{Level: "WARN", Target: "duroxide::runtime",
			Message: "ack failed", Fields: map[string]string{"error": "Invalid lock token"}}, true},
		{"an expired lock in the message", LogLine{Level: "WARN", Message: "lock expired before ack"}, true},
		{"a lost lease", LogLine{Level: "ERROR", Message: "lease lost for instance"}, true},
		{"a slow statement in a schema named released", LogLine{Level: "WARN", Target: "sqlx::query",
			Message: "slow statement: execution time exceeded alert threshold",
			Fields: map[string]string{
				"db.statement": "SELECT e2e_released_upgrade.ack_orchestration_item($1, $2)",
				"summary":      "SELECT e2e_released_upgrade.ack_orchestration_item($1, …",
				"elapsed":      "1.013094291s"}}, false},
		{"a slow statement quoting a lease function", LogLine{Level: "WARN", Target: "sqlx::query",
			Message: "slow statement: execution time exceeded alert threshold",
			Fields:  map[string]string{"db.statement": "SELECT s.renew_orchestration_lock($1) -- lock token lease"}}, false},
		{"an application failure", LogLine{Level: "WARN", Target: "duroxide::runtime",
			Message: "Orchestration failed (application error)", Fields: map[string]string{"error": "released"}}, false},
	}
	for _, c := range cases {
		if got := c.line.Lease(); got != c.want {
			t.Errorf("%s: Lease() = %v, want %v (%s)", c.name, got, c.want, c.line.Text())
		}
	}
}
