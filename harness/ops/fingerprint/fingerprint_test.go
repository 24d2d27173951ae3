package fingerprint_test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/fingerprint"
	"github.com/duroxide-pg/migrations/internal/packfacts"
)

// Every row of every guard table says what a fingerprint is; check each
// claim against the data it can be checked against: upstream's fingerprints
// per version, and the pack's own bodies.
func TestGuardRowsAreWhatTheySay(t *testing.T) {
	for _, m := range migrations.Fixes() {
		for _, k := range m.Known {
			// Unreleased versions collide (two branch files claim 24): the
			// migration a row means is the one of its function. The pack's
			// own texts of that behaviour, fixed or not, are checked below
			// against the pack's bodies.
			u, unreleased := unreleasedOf(k.Function, k.BehavesAs)
			switch {
			case unreleased && !k.Fixed && !strings.HasPrefix(k.Definition, "pack"):
				if !slices.Contains(slices.Collect(maps.Values(u.Fingerprints)), k.Fingerprint) {
					t.Errorf("%s: %s %s is labelled %q (upstream %d, unreleased), but it is not one of that migration's texts %v", m.File, k.Function, k.Fingerprint, k.Definition, k.BehavesAs, u.Fingerprints)
				}
			case strings.HasPrefix(k.Definition, "upstream "):
				fps, err := fingerprint.Upstream(k.BehavesAs)
				if err != nil {
					t.Fatal(err)
				}
				if !hasFingerprint(fps, k.Function, k.Fingerprint) {
					t.Errorf("%s: %s %s is labelled %q, but it is not upstream %d's text", m.File, k.Function, k.Fingerprint, k.Definition, k.BehavesAs)
				}
				if k.Fixed {
					t.Errorf("%s: upstream's %s cannot carry the pack's fix", m.File, k.Function)
				}
			case k.Fixed:
				if !fixedUpTo(m.Version, k) {
					t.Errorf("%s: %s %s is labelled a fix, but no body of a pack fix up to %s has it", m.File, k.Function, k.Fingerprint, m.File)
				}
			default:
				if fingerprint.PackTexts(k.BehavesAs)[k.Function] != k.Fingerprint && !anyPackBody(k) {
					t.Errorf("%s: %s %s is labelled %q, but no pack body has it", m.File, k.Function, k.Fingerprint, k.Definition)
				}
			}
		}
	}
}

// A fix must know upstream's definition of the function at every upstream
// version from its first port on, and every unreleased upstream text of it
// the pack knows, or it would refuse a production database.
func TestEveryFixKnowsUpstreamsDefinitionAtEveryVersionFrom19(t *testing.T) {
	for _, m := range migrations.Fixes() {
		for _, fn := range m.Fixes {
			known := fingerprint.GuardTable(fn)
			for _, v := range fingerprint.FingerprintedVersions() {
				if v < 19 {
					continue
				}
				fps, err := fingerprint.Upstream(v)
				if err != nil {
					t.Fatal(err)
				}
				for id, fp := range fps {
					if fingerprint.NameOf(id) == fn {
						if _, ok := known[fp]; !ok {
							t.Errorf("%s does not know upstream %d's %s (%s)", m.File, v, fn, fp)
						}
					}
				}
			}
			for _, u := range fingerprint.UnreleasedMigrations() {
				if fingerprint.NameOf(u.Function) != fn {
					continue
				}
				for whose, fp := range u.Fingerprints {
					if d, ok := known[fp]; !ok || d.BehavesAs != u.Version {
						t.Errorf("%s does not know unreleased upstream %d's %s (%s's text, %s) as behaving like %d: %+v", m.File, u.Version, fn, whose, fp, u.Version, d)
					}
				}
			}
			if fp, ok := fingerprint.PackTexts(packfacts.UpstreamAt(m.Version))[fn]; ok {
				if _, ok := known[fp]; !ok {
					t.Errorf("%s does not know the pack's own %s before it (%s)", m.File, fn, fp)
				}
			}
		}
	}
}

func TestIdentifyNamesUpstreamVersionsAndRefusesUnknownTexts(t *testing.T) {
	fps, err := fingerprint.Upstream(21)
	if err != nil {
		t.Fatal(err)
	}
	for id, fp := range fps {
		if fingerprint.NameOf(id) != "get_instance_stats" {
			continue
		}
		d, ok := fingerprint.Identify(fingerprint.Function{Name: "get_instance_stats", Identity: id, Normalized: fp})
		if !ok || !strings.HasPrefix(d.Label, "upstream 21") || d.Fixed {
			t.Errorf("Identify(upstream 21 get_instance_stats) = %+v, %v", d, ok)
		}
	}
	if d, ok := fingerprint.Identify(fingerprint.Function{Name: "ack_orchestration_item", Identity: "x", Raw: migrations.Definition{Source: "hand edit"}.Fingerprint()}); ok {
		t.Errorf("a hand-edited body was identified as %+v", d)
	}
}

// unreleasedOf is the unreleased upstream migration of version v that
// changes function fn.
func unreleasedOf(fn string, v int64) (fingerprint.Unreleased, bool) {
	for _, u := range fingerprint.UnreleasedMigrations() {
		if u.Version == v && fingerprint.NameOf(u.Function) == fn {
			return u, true
		}
	}
	return fingerprint.Unreleased{}, false
}

func hasFingerprint(fps map[string]string, fn, fp string) bool {
	for id, got := range fps {
		if fingerprint.NameOf(id) == fn && got == fp {
			return true
		}
	}
	return false
}

func definedBy(m migrations.Migration, k migrations.Known) bool {
	for _, d := range m.Definitions {
		if d.Function == k.Function && d.Fingerprint() == k.Fingerprint {
			return true
		}
	}
	return false
}

// fixedUpTo reports whether a fix migration up to goose version v has the
// body k names (a later fix knows the earlier fixes it builds on).
func fixedUpTo(v int64, k migrations.Known) bool {
	for _, m := range migrations.Fixes() {
		if m.Version <= v && definedBy(m, k) {
			return true
		}
	}
	return false
}

func anyPackBody(k migrations.Known) bool {
	for _, m := range migrations.MustPack() {
		if definedBy(m, k) {
			return true
		}
	}
	return false
}
