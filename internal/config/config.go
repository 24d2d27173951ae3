// Package config reads goose.yaml, the pack's own settings file (goose
// itself reads no YAML): where the migrations are, the target schema, the
// version table, and named environments with their DSNs.
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// defaultFile is the settings file looked for in the working directory.
const defaultFile = "goose.yaml"

// Config is the content of goose.yaml.
type Config struct {
	// MigrationsDir, relative to the file, holds the SQL migrations (the
	// stock goose CLI's directory). The harness applies the copy built
	// into it, always; when this directory exists and differs from that
	// copy, the commands that apply or write migrations refuse (an edited
	// checkout needs the harness rebuilt: go run does it).
	MigrationsDir string `yaml:"migrations_dir"`
	// Schema is the target schema.
	Schema string `yaml:"schema"`
	// VersionTable is goose's bookkeeping table inside the schema.
	VersionTable string `yaml:"version_table"`
	// Environments name DSNs: `dsn` literally (with ${VAR} expanded) or
	// `dsn_env`, the variable holding it.
	Environments map[string]Environment `yaml:"environments"`

	dir string // directory of the file, for relative paths
}

// Environment is one named database.
type Environment struct {
	DSN    string `yaml:"dsn"`
	DSNEnv string `yaml:"dsn_env"`
	Schema string `yaml:"schema"`
}

// Load reads path. A missing file at the default path is not an error: the
// zero Config (all defaults) is returned.
func Load(path string) (*Config, error) {
	explicit := path != ""
	if !explicit {
		path = defaultFile
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		return &Config{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var c Config
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	c.dir = filepath.Dir(path)
	return &c, nil
}

// MigrationsFS returns the migrations directory as a file system when the
// file names one that exists, else nil (use the embedded pack).
func (c *Config) MigrationsFS() fs.FS {
	if c.MigrationsDir == "" {
		return nil
	}
	dir := c.MigrationsDir
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(c.dir, dir)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil
	}
	return os.DirFS(dir)
}

// DSN resolves environment name to its DSN and schema override.
func (c *Config) DSN(name string) (dsn, schema string, err error) {
	env, ok := c.Environments[name]
	if !ok {
		names := make([]string, 0, len(c.Environments))
		for n := range c.Environments {
			names = append(names, n)
		}
		sort.Strings(names)
		return "", "", fmt.Errorf("no environment %q in goose.yaml (have: %s)", name, strings.Join(names, ", "))
	}
	switch {
	case env.DSNEnv != "":
		dsn = os.Getenv(env.DSNEnv)
		if dsn == "" {
			return "", "", fmt.Errorf("environment %q takes its DSN from $%s, which is not set", name, env.DSNEnv)
		}
	case env.DSN != "":
		dsn = os.ExpandEnv(env.DSN)
	default:
		return "", "", fmt.Errorf("environment %q has neither dsn nor dsn_env", name)
	}
	return dsn, env.Schema, nil
}
