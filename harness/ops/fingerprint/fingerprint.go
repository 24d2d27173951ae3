// Package fingerprint recognises function definitions: which text a
// database holds for each duroxide-pg function (upstream's own, at which
// upstream version; the pack's port of it; or the pack's fix), by the md5
// of its source. Upstream's fingerprints are data (upstream/vNNNN.json, read
// off schemas made by upstream's own runner); the pack's come from the
// pack's files themselves (migrations.Pack), so nothing here is written by hand.
package fingerprint

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"

	migrations "github.com/duroxide-pg/migrations"
)

// query computes, for every function of schema $1, its identity (name and
// identity arguments, as upstream's fingerprint query prints them), the md5 of
// its source, and the md5 of its source with the schema's name replaced by
// @schema@ where it qualifies a table ("<schema>.") and where it is a string
// literal ("'<schema>'", as in the key of upstream's candidate fix).
// Upstream's texts name their schema in those two ways only (the pack's
// never do), so this is the fingerprint of upstream's query, which replaces
// every occurrence of the name, except that it also holds for a schema named
// duroxide, whose name the reference's plain replace also finds inside
// column names such as duroxide_version_major.
const query = `
SELECT coalesce(jsonb_agg(jsonb_build_object(
         'name', p.proname,
         'identity', p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
         'raw', md5(p.prosrc),
         'normalized', md5(replace(replace(p.prosrc, n.nspname || '.', '@schema@.'), quote_literal(n.nspname), '''@schema@''')))
       ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)), '[]')::text
FROM pg_proc p
JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = $1::text`

// Function is one installed function and its fingerprints.
type Function struct {
	Name       string `json:"name"`
	Identity   string `json:"identity"`
	Raw        string `json:"raw"`
	Normalized string `json:"normalized"`
}

// Matches reports whether fp is one of f's fingerprints (an empty fp, a
// function a version does not have, matches nothing).
func (f Function) Matches(fp string) bool { return fp != "" && (fp == f.Raw || fp == f.Normalized) }

// Querier is what Take reads through.
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Take reads the functions of schema, keyed by identity.
func Take(ctx context.Context, q Querier, schema string) (map[string]Function, error) {
	var raw string
	if err := q.QueryRowContext(ctx, query, schema).Scan(&raw); err != nil {
		return nil, fmt.Errorf("fingerprint the functions of schema %s: %w", schema, err)
	}
	var list []Function
	if err := json.Unmarshal([]byte(raw), &list); err != nil {
		return nil, fmt.Errorf("fingerprints of schema %s: %w", schema, err)
	}
	out := make(map[string]Function, len(list))
	for _, f := range list {
		out[f.Identity] = f
	}
	return out, nil
}

//go:embed upstream/*.json
var upstreamFS embed.FS

var upstreamFile = regexp.MustCompile(`^v(\d{4})\.json$`)

// Upstream is upstream's fingerprint map (identity -> fingerprint) at one
// upstream version, as its own runner leaves the texts.
func Upstream(version int64) (map[string]string, error) {
	raw, err := upstreamFS.ReadFile(fmt.Sprintf("upstream/v%04d.json", version))
	if err != nil {
		return nil, fmt.Errorf("no upstream fingerprints for version %d: %w", version, err)
	}
	out := map[string]string{}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("upstream fingerprints v%04d: %w", version, err)
	}
	return out, nil
}

// Unreleased is an upstream migration no release carries yet that the pack
// knows (upstream/unreleased.json): upstream's candidate fix of its issue
// #21, and that candidate with the amendment this project offers upstream.
// Each changes one function; a database that duroxide-pg's runner gave it
// records (Version, File) in _duroxide_migrations.
type Unreleased struct {
	Version int64  `json:"version"`
	File    string `json:"file"`
	// Source says where the migration comes from.
	Source string `json:"source"`
	// Note says, for people, what a database holding it has and lacks.
	Note string `json:"note"`
	// Function is the identity of the function it changes.
	Function string `json:"function"`
	// Fingerprints are the function's known texts, by whose they are:
	// "upstream" (upstream's own), "port" (the port the pack's tests use),
	// "ours" (this project's).
	Fingerprints map[string]string `json:"fingerprints"`
}

// Holds reports whether f is the function this migration defines, with one
// of its known texts.
func (u Unreleased) Holds(f Function) bool {
	if f.Identity != u.Function {
		return false
	}
	for _, fp := range u.Fingerprints {
		if f.Matches(fp) {
			return true
		}
	}
	return false
}

// UnreleasedMigrations lists the unreleased upstream migrations the pack
// knows, by version.
func UnreleasedMigrations() []Unreleased {
	raw, err := upstreamFS.ReadFile("upstream/unreleased.json")
	if err != nil {
		panic("fingerprint: the embedded upstream/unreleased.json: " + err.Error())
	}
	var out []Unreleased
	if err := json.Unmarshal(raw, &out); err != nil {
		panic("fingerprint: upstream/unreleased.json: " + err.Error())
	}
	slices.SortFunc(out, func(a, b Unreleased) int { return int(a.Version - b.Version) })
	return out
}

// UnreleasedFile returns the unreleased migration a database records as
// (version, file) in _duroxide_migrations. Upstream's branches number
// their files independently (two claim 22, two 24): the file name, not
// the version, says which one a database holds.
func UnreleasedFile(version int64, file string) (Unreleased, bool) {
	for _, u := range UnreleasedMigrations() {
		if u.Version == version && u.File == file {
			return u, true
		}
	}
	return Unreleased{}, false
}

// FingerprintedVersions lists the upstream versions with fingerprints, ascending.
func FingerprintedVersions() []int64 {
	entries, _ := fs.ReadDir(upstreamFS, "upstream")
	var out []int64
	for _, e := range entries {
		if m := upstreamFile.FindStringSubmatch(e.Name()); m != nil {
			v, _ := strconv.ParseInt(m[1], 10, 64)
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out
}

// NameOf is the function name of an identity "name(args)".
func NameOf(identity string) string {
	name, _, _ := strings.Cut(identity, "(")
	return name
}

// PackTexts is the pack's own text of every function at upstream state
// upstream (the fingerprint of the body each function has after the
// pack's ports up to that upstream version, fixes left out), by name.
func PackTexts(upstream int64) map[string]string {
	out := map[string]string{}
	for _, m := range migrations.MustPack() {
		if !m.IsPort() || m.Upstream > upstream {
			continue
		}
		dropped := droppedFunctions(m.Up)
		for name := range dropped {
			delete(out, name)
		}
		for _, d := range m.Definitions {
			if !d.Down {
				out[d.Function] = d.Fingerprint()
			}
		}
	}
	return out
}

var dropFunctionRE = regexp.MustCompile(`(?m)^DROP FUNCTION (?:IF EXISTS )?([a-z_]+)\(`)

// droppedFunctions are the functions a section drops at its top level (a
// drop inside a function body is indented, and does not count).
func droppedFunctions(section string) map[string]bool {
	out := map[string]bool{}
	for _, m := range dropFunctionRE.FindAllStringSubmatch(section, -1) {
		out[m[1]] = true
	}
	return out
}

// Provenance says what one installed function definition is.
type Provenance struct {
	// Label names the definition for people: "upstream 20, 21, 23",
	// "pack, as upstream 19", "pack 0021 fix, upstream 20 behaviour".
	Label string `json:"definition"`
	// Fixed is true when it carries a fix of the pack.
	Fixed bool `json:"fixed"`
	// BehavesAs is the upstream version whose behaviour it has (0 when
	// not known).
	BehavesAs int64 `json:"behaves_as,omitempty"`
}

// GuardTable lists every definition of function name that the pack's fix
// migrations recognise (the rows of their guard tables), by fingerprint.
// It is empty for a function no fix migration touches.
func GuardTable(name string) map[string]Provenance {
	out := map[string]Provenance{}
	for _, m := range migrations.MustPack() {
		for _, k := range m.Known {
			if k.Function == name {
				out[k.Fingerprint] = Provenance{Label: k.Definition, Fixed: k.Fixed, BehavesAs: k.BehavesAs}
			}
		}
	}
	return out
}

// Identify says what f is, from the guard tables of the fix migrations
// first, then upstream's texts at every version and the pack's ports. ok is
// false for a definition nobody knows (a hand edit, a newer upstream).
func Identify(f Function) (Provenance, bool) {
	for fp, d := range GuardTable(f.Name) {
		if f.Matches(fp) {
			return d, true
		}
	}
	var upstream []int64
	for _, v := range FingerprintedVersions() {
		if fps, err := Upstream(v); err == nil && f.Matches(fps[f.Identity]) {
			upstream = append(upstream, v)
		}
	}
	if len(upstream) > 0 {
		return Provenance{Label: "upstream " + joinVersions(upstream), BehavesAs: upstream[0]}, true
	}
	var pack []int64
	for _, v := range migrations.UpstreamVersions() {
		if fp, ok := PackTexts(v)[f.Name]; ok && f.Matches(fp) {
			pack = append(pack, v)
		}
	}
	if len(pack) > 0 {
		return Provenance{Label: "pack, as upstream " + joinVersions(pack), BehavesAs: pack[0]}, true
	}
	return Provenance{}, false
}

// FixedFrom reports whether f is the definition of its function that a fix
// migration of goose version version or later installs: a database holding
// it has that fix (a later fix of the same function builds on the earlier
// one).
func FixedFrom(f Function, version int64) bool {
	for _, m := range migrations.Fixes() {
		if m.Version < version {
			continue
		}
		for _, d := range m.Definitions {
			if !d.Down && d.Function == f.Name && f.Matches(d.Fingerprint()) {
				return true
			}
		}
	}
	return false
}

// Allowed reports whether f is a definition a database at upstream state
// upstream may hold: upstream's own text at that version, the pack's text
// at that version, or a definition a fix migration knows with the same
// behaviour as upstream's at that version (the pack's fix of it, say).
func Allowed(f Function, upstream int64) bool {
	fps, err := Upstream(upstream)
	if err == nil && f.Matches(fps[f.Identity]) {
		return true
	}
	if f.Matches(PackTexts(upstream)[f.Name]) {
		return true
	}
	known := GuardTable(f.Name)
	want, ok := known[fps[f.Identity]]
	if !ok {
		return false
	}
	for fp, d := range known {
		if f.Matches(fp) && d.BehavesAs == want.BehavesAs {
			return true
		}
	}
	return false
}

func joinVersions(vs []int64) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.FormatInt(v, 10)
	}
	return strings.Join(s, ", ")
}
