// Package migrations is the pack: its goose migrations (sql/*.sql),
// embedded so that the harness, the tests and any Go program can apply
// them without reading the file system, and the facts read from them
// (Pack, Latest, FetchFix, PortOf, FixOf, ...): which file ports which
// upstream version and which fix replaces which function.
package migrations

import (
	"embed"
	"io/fs"
)

//go:embed sql/*.sql
var embedded embed.FS

// FS holds every migration file (NNNN_name.sql) at its root.
var FS = func() fs.FS {
	sub, err := fs.Sub(embedded, "sql")
	if err != nil {
		panic("migrations: the embedded sql directory: " + err.Error())
	}
	return sub
}()
