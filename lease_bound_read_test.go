package migrations

import (
	"strings"
	"testing"
	"testing/fstest"
)

// leaseFix is a fix whose header says bound and whose Up body declares
// constant (either "" for none).
func leaseFix(bound, constant string) string {
	header := "-- 0002_x.sql\n-- Fixes: renew_session_lock\n"
	if bound != "" {
		header += "-- Lease bound: " + bound + " ms\n"
	}
	body := "DECLARE\n"
	if constant != "" {
		body += "    c_lease_bound_ms CONSTANT bigint := " + constant + ";\n"
	}
	return header + "-- +goose Up\nCREATE OR REPLACE FUNCTION renew_session_lock()\nRETURNS void\nLANGUAGE plpgsql\nAS $fn$\n" +
		body + "BEGIN\nEND;\n$fn$;\n-- +goose Down\nCREATE OR REPLACE FUNCTION renew_session_lock()\nRETURNS void\nLANGUAGE plpgsql\nAS $fn$\nBEGIN\nEND;\n$fn$;\n"
}

// The "-- Lease bound:" line is read into LeaseBoundMs, and every body the
// Up installs must declare c_lease_bound_ms with its value: a file whose
// line and bodies disagree, or where one has it and not the other, is
// refused by name (the Down's bodies, the previous fix's, have none).
func TestTheLeaseBoundLineIsReadAndHeldToTheBodies(t *testing.T) {
	got, err := read(fstest.MapFS{"0002_x.sql": {Data: []byte(leaseFix("30000", "30000"))}})
	if err != nil || len(got) != 1 || got[0].LeaseBoundMs != 30000 {
		t.Fatalf("a fix with a bound of 30000 ms: %v, %+v", err, got)
	}
	none, err := read(fstest.MapFS{"0002_x.sql": {Data: []byte(leaseFix("", ""))}})
	if err != nil || none[0].LeaseBoundMs != 0 {
		t.Fatalf("a fix without a bound: %v, %+v", err, none)
	}
	for name, c := range map[string]struct{ text, want string }{
		"bodies disagree": {leaseFix("30000", "45000"), "declares c_lease_bound_ms := 45000"},
		"no constant":     {leaseFix("30000", ""), "declares no c_lease_bound_ms"},
		"no line":         {leaseFix("", "30000"), "has no -- Lease bound: line"},
		"two lines":       {strings.Replace(leaseFix("30000", "30000"), "-- Lease bound: 30000 ms\n", "-- Lease bound: 30000 ms\n-- Lease bound: 30000 ms\n", 1), "2 -- Lease bound: lines"},
		"a zero bound":    {leaseFix("0", "0"), "a positive number"},
		"a port's line":   {"-- Lease bound: 30000 ms\n-- +goose Up\nINSERT INTO _duroxide_migrations (version, name)\n    VALUES (2, '0002_x.sql');\n-- +goose Down\n", "a port writes upstream's leases"},
	} {
		_, err := read(fstest.MapFS{"0002_x.sql": {Data: []byte(c.text)}})
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "0002_x.sql") {
			t.Errorf("%s: got %v, want an error naming the file and saying %q", name, err, c.want)
		}
	}
}
