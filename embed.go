// Package migrations is the pack: its goose migrations (sql/*.sql),
// embedded so that the harness, the tests and any Go program can apply
// them without reading the file system, and the facts read from them
// (Pack, Latest, PortOf, FixOf, ...): which file ports which
// upstream version and which fix replaces which function.
package migrations

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"sort"
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

// Digest is the SHA-256 of the migrations in fsys (FS for the embedded
// pack): every NNNN_name.sql at its root, in name order, each as its name,
// a newline, its length, a newline and its bytes. Two copies of the pack
// have the same digest exactly when they hold the same files.
func Digest(fsys fs.FS) (digest string, files int, err error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return "", 0, fmt.Errorf("digest of the migrations: %w", err)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return "", 0, fmt.Errorf("digest of the migrations: %w", err)
		}
		fmt.Fprintf(h, "%s\n%d\n", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), len(names), nil
}
