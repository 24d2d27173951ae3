package sql

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
