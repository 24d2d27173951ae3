package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestTheSettingsFileAndItsOldName(t *testing.T) {
	t.Run("none: the defaults, named goose.yaml in messages", func(t *testing.T) {
		t.Chdir(t.TempDir())
		c, err := Load("")
		if err != nil {
			t.Fatal(err)
		}
		if c.Schema != "" || c.Deprecation() != "" || c.Name() != DefaultFile {
			t.Errorf("Load with no file: %+v, deprecation %q, name %q", c, c.Deprecation(), c.Name())
		}
	})
	t.Run("goose.yaml", func(t *testing.T) {
		t.Chdir(t.TempDir())
		write(t, "goose.yaml", "schema: fromnew\n")
		c, err := Load("")
		if err != nil {
			t.Fatal(err)
		}
		if c.Schema != "fromnew" || c.Deprecation() != "" || c.Name() != "goose.yaml" {
			t.Errorf("goose.yaml: schema %q, deprecation %q, name %q", c.Schema, c.Deprecation(), c.Name())
		}
	})
	t.Run("harness.yaml alone: read, with a deprecation line", func(t *testing.T) {
		t.Chdir(t.TempDir())
		write(t, "harness.yaml", "schema: fromold\n")
		c, err := Load("")
		if err != nil {
			t.Fatal(err)
		}
		if c.Schema != "fromold" || c.Name() != "harness.yaml" {
			t.Errorf("harness.yaml: schema %q, name %q", c.Schema, c.Name())
		}
		if !strings.Contains(c.Deprecation(), "rename it goose.yaml") {
			t.Errorf("deprecation %q", c.Deprecation())
		}
		if _, _, err := c.DSN("nowhere"); err == nil || !strings.Contains(err.Error(), `no environment "nowhere" in harness.yaml`) {
			t.Errorf("an unknown environment names the file read: %v", err)
		}
	})
	t.Run("both: refused, nothing guessed", func(t *testing.T) {
		t.Chdir(t.TempDir())
		write(t, "goose.yaml", "schema: fromnew\n")
		write(t, "harness.yaml", "schema: fromold\n")
		if _, err := Load(""); err == nil || !strings.Contains(err.Error(), "keep one") {
			t.Errorf("both files: %v", err)
		}
	})
	t.Run("--config names the old name: read, with a deprecation line", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "harness.yaml")
		write(t, path, "schema: explicit\n")
		c, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		if c.Schema != "explicit" || c.Deprecation() == "" {
			t.Errorf("explicit harness.yaml: schema %q, deprecation %q", c.Schema, c.Deprecation())
		}
	})
	t.Run("--config names a file that is not there", func(t *testing.T) {
		if _, err := Load(filepath.Join(t.TempDir(), "goose.yaml")); err == nil {
			t.Error("a missing explicit file is an error")
		}
	})
}
