package migrations

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestASQLFileThePackCannotClassifyIsRefusedByName(t *testing.T) {
	port := "-- +goose Up\nINSERT INTO _duroxide_migrations (version, name)\n    VALUES (1, '0001_initial_schema.sql');\n-- +goose Down\n"
	good := fstest.MapFS{"0001_initial_schema.sql": {Data: []byte(port)}, "README.md": {Data: []byte("# not SQL")}}
	got, err := read(good)
	if err != nil || len(got) != 1 {
		t.Fatalf("a pack of one port and a README: %v, %d migrations", err, len(got))
	}
	for _, name := range []string{"28_extra.sql", "0028_Extra.sql", "extra.sql", "00028_extra.sql"} {
		bad := fstest.MapFS{"0001_initial_schema.sql": good["0001_initial_schema.sql"], name: {Data: []byte(port)}}
		if _, err := read(bad); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s (goose would run it): got %v, want an error naming the file", name, err)
		}
	}
}

func TestACostsLineIsReadFromAFixAndRefusedOnAPort(t *testing.T) {
	fix := "-- 0002_x.sql\n-- Fixes: fetch_orchestration_item\n-- Costs: ack_worker, enqueue_orchestrator_work\n-- +goose Up\n-- +goose Down\n"
	port := "-- Costs: ack_worker\n-- +goose Up\nINSERT INTO _duroxide_migrations (version, name)\n    VALUES (1, '0001_initial_schema.sql');\n-- +goose Down\n"
	got, err := read(fstest.MapFS{"0002_x.sql": {Data: []byte(fix)}})
	if err != nil || len(got) != 1 {
		t.Fatalf("a fix with a Costs line: %v, %d migrations", err, len(got))
	}
	if c := strings.Join(got[0].Costs, ","); c != "ack_worker,enqueue_orchestrator_work" {
		t.Errorf("Costs = %q", c)
	}
	if _, err := read(fstest.MapFS{"0001_initial_schema.sql": {Data: []byte(port)}}); err == nil || !strings.Contains(err.Error(), "-- Costs:") {
		t.Errorf("a port with a Costs line: got %v, want it refused", err)
	}
}

// The four paragraphs an operator schedules by are read apart, each up to
// the next label, a blank comment line or the end of the header: the Up's
// Locks and Duration, the Down's "Down locks" and "Down duration".
func TestTheDownParagraphsAreReadApartFromTheUps(t *testing.T) {
	fix := "-- 0002_x.sql\n-- Fixes: fetch_orchestration_item\n--\n" +
		"-- Locks: EXCLUSIVE on orchestrator_queue, to\n-- commit.\n" +
		"-- Duration: milliseconds.\n" +
		"-- Down locks: ACCESS EXCLUSIVE on instance_locks\n-- (DROP INDEX).\n" +
		"-- Down duration: grows with\n-- nothing.\n--\n-- Down restores it.\n" +
		"-- +goose Up\nSELECT 1;\n-- +goose Down\nSELECT 2;\n"
	got, err := read(fstest.MapFS{"0002_x.sql": {Data: []byte(fix)}})
	if err != nil || len(got) != 1 {
		t.Fatalf("a fix with Down paragraphs: %v, %d migrations", err, len(got))
	}
	m := got[0]
	for name, pair := range map[string][2]string{
		"Locks":         {m.Locks, "EXCLUSIVE on orchestrator_queue, to commit."},
		"Duration":      {m.Duration, "milliseconds."},
		"Down locks":    {m.DownLocks, "ACCESS EXCLUSIVE on instance_locks (DROP INDEX)."},
		"Down duration": {m.DownDuration, "grows with nothing."},
	} {
		if pair[0] != pair[1] {
			t.Errorf("%s = %q, want %q", name, pair[0], pair[1])
		}
	}
	none, err := read(fstest.MapFS{"0002_x.sql": {Data: []byte("-- Fixes: f\n-- Locks: no table lock.\n-- +goose Up\n-- +goose Down\n")}})
	if err != nil || none[0].DownLocks != "" || none[0].DownDuration != "" {
		t.Errorf("a header without Down paragraphs: %v, %+v", err, none)
	}
}
