package reportfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteMakesTheDirectoryAndWritesBothFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	if err := Write(dir, "r.md", "# r\n", "r.json", map[string]int{"x": 1}); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "r.md"))
	if err != nil || string(md) != "# r\n" {
		t.Errorf("r.md: %q, %v", md, err)
	}
	js, err := os.ReadFile(filepath.Join(dir, "r.json"))
	if err != nil || string(js) != "{\n  \"x\": 1\n}\n" {
		t.Errorf("r.json: %q, %v", js, err)
	}
	if err := WriteJSON(filepath.Join(dir, "bad.json"), func() {}); err == nil {
		t.Error("a value JSON cannot encode is an error")
	}
}
