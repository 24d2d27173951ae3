// Package sql embeds the pack's goose migrations so that the harness, the
// tests and any Go program can apply them without reading the file system.
package sql

import "embed"

// FS holds every migration file (NNNN_name.sql) at its root.
//
//go:embed *.sql
var FS embed.FS
