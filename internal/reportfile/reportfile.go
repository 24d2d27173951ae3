// Package reportfile writes what the benches and repros report: a Markdown
// file and the same figures as indented JSON, in a directory made if
// missing. One writer, so that every scenario's report has the same form.
package reportfile

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// WriteJSON writes v as indented JSON, with a final newline, to path.
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Write makes dir if missing and writes md into mdFile and v as JSON into
// jsonFile there.
func Write(dir, mdFile, md, jsonFile string, v any) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, mdFile), []byte(md), 0o644); err != nil {
		return err
	}
	return WriteJSON(filepath.Join(dir, jsonFile), v)
}
