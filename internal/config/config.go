// Package config reads goose.yaml, the harness's settings file at the top
// of the checkout: where the migrations are, the target schema, the
// version table, and named environments with their DSNs (goose's own CLI
// reads no YAML; the file keeps the name the project's layout gives it).
// harness.yaml, the name one release gave it, is still read, with a
// notice.
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

// DefaultFile is the settings file looked for in the working directory.
const DefaultFile = "goose.yaml"

// oldFile is the name one release gave DefaultFile, read when DefaultFile
// is absent.
const oldFile = "harness.yaml"

// Config is the content of the settings file.
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

	dir  string // directory of the file, for relative paths
	name string // the file's name, for messages ("" when none was read)
	// deprecation says the file goes by its old name ("" when not).
	deprecation string
}

// Environment is one named database.
type Environment struct {
	DSN    string `yaml:"dsn"`
	DSNEnv string `yaml:"dsn_env"`
	Schema string `yaml:"schema"`
}

// Load reads path, or without one DefaultFile in the working directory, or
// its old name there. A missing file at the default path is not an error:
// the zero Config (all defaults) is returned. Both names in the working
// directory are an error: which settings apply would be a guess.
func Load(path string) (*Config, error) {
	explicit := path != ""
	if !explicit {
		path = DefaultFile
		_, errNew := os.Stat(DefaultFile)
		_, errOld := os.Stat(oldFile)
		switch {
		case errNew == nil && errOld == nil:
			return nil, fmt.Errorf("both %s and %s are here: %s is the settings file, %s the name one release gave it; keep one", DefaultFile, oldFile, DefaultFile, oldFile)
		case errors.Is(errNew, fs.ErrNotExist) && errOld == nil:
			path = oldFile
		}
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
	c.dir, c.name = filepath.Dir(path), filepath.Base(path)
	if c.name == oldFile {
		c.deprecation = fmt.Sprintf("%s: the name one release gave the settings file, still read; rename it %s", path, DefaultFile)
	}
	return &c, nil
}

// Name is the settings file's name for messages: the file read, or
// DefaultFile when none was.
func (c *Config) Name() string {
	if c.name == "" {
		return DefaultFile
	}
	return c.name
}

// Deprecation is a line to show when the file goes by its old name, else
// "".
func (c *Config) Deprecation() string { return c.deprecation }

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
		return "", "", fmt.Errorf("no environment %q in %s (have: %s)", name, c.Name(), strings.Join(names, ", "))
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
