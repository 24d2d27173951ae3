// Package upstream makes genuine upstream duroxide-pg databases: it runs the
// real provider (npm duroxide-linux-x64-gnu, the duroxide runtime's native
// Node.js addon, which contains duroxide-pg) so that upstream's own runner
// applies upstream's own migrations, with upstream's function texts, into a
// schema. Tests use it to adopt, check and fix databases exactly as
// production has them. RunRuntime runs the real duroxide runtime itself on
// a schema (tools/upstream/runtime.js, the project's driver of the addon).
package upstream

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/duroxide-pg/migrations/internal/dbconn"
)

// AddonPackage is the npm package, and the version, tools/upstream pins.
const AddonPackage = "duroxide-linux-x64-gnu@0.1.29"

// envAddon names the variable that points at the addon's .node file when it
// is not installed in tools/upstream.
const envAddon = "DUROXIDE_ADDON"

// envRequire, when set to 1, turns "the real provider is missing" from a
// reason to skip into a failure: CI and `make test` set it after installing
// the provider, so its tests can never be skipped there unnoticed.
const envRequire = "HARNESS_REQUIRE_UPSTREAM"

// errUnavailable marks a machine without node or without the addon.
var errUnavailable = errors.New("the real duroxide-pg provider is not available")

//go:embed provision.js
var provisionScript string

// Provider runs the real duroxide-pg provider.
type Provider struct {
	node  string
	addon string
}

// Find locates node and the addon: $DUROXIDE_ADDON, else
// tools/upstream/node_modules in the repository that holds the working
// directory. The error wraps errUnavailable and says how to install them.
func Find() (*Provider, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("%w: node is not on PATH (Debian: apt-get install nodejs npm)", errUnavailable)
	}
	addon := os.Getenv(envAddon)
	if addon == "" {
		dir, err := toolsDir()
		if err != nil {
			return nil, err
		}
		addon = filepath.Join(dir, "node_modules", "duroxide-linux-x64-gnu", "duroxide.linux-x64-gnu.node")
	}
	if _, err := os.Stat(addon); err != nil {
		return nil, fmt.Errorf("%w: %s is missing; install it with `npm ci --prefix tools/upstream` (or `make upstream`), or point %s at the addon's .node file",
			errUnavailable, addon, envAddon)
	}
	return &Provider{node: node, addon: addon}, nil
}

// toolsDir finds tools/upstream by walking up from the working directory.
func toolsDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("%w: %v", errUnavailable, err)
	}
	for {
		candidate := filepath.Join(dir, "tools", "upstream")
		if _, err := os.Stat(filepath.Join(candidate, "package.json")); err == nil {
			return candidate, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%w: no tools/upstream above %s; set %s", errUnavailable, dir, envAddon)
		}
		dir = parent
	}
}

// Addon is the path of the addon's .node file.
func (p *Provider) Addon() string { return p.addon }

// Migrate connects the real provider to the database of src with schema, which runs
// upstream's migration runner there: it creates the schema when missing and
// applies every upstream migration not yet recorded in its
// _duroxide_migrations table (0.1.29: 1..21 and 23).
func (p *Provider) Migrate(ctx context.Context, src *dbconn.Source, schema string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.node, "-", p.addon, src.DSN(), schema)
	cmd.Stdin = strings.NewReader(provisionScript)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("duroxide-pg (%s) migrating schema %s: %w: %s", AddonPackage, schema, err, strings.TrimSpace(out.String()))
	}
	return nil
}
