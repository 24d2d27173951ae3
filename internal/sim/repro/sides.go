package repro

import (
	"context"
	"fmt"
	"slices"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// The sides the repros compare, side by side: upstream's latest as its own
// runner makes it, upstream's candidate fix of its issue #21 (our port of
// it, applied as upstream's runner would), and the pack's latest. The
// amended side (the candidate with the amendment offered upstream) is for
// the tests of that amendment.
const (
	SideUpstream  = "upstream"
	SideCandidate = "candidate"
	SidePack      = "pack"
	SideAmended   = "amended"
)

// Side is one schema a repro runs on, and what made it.
type Side struct {
	// Key is SideUpstream, SideCandidate, SidePack or SideAmended.
	Key string `json:"key"`
	// Schema is its name in the repro's database.
	Schema string `json:"schema"`
	// Made says, for people, what built it.
	Made string `json:"made"`
}

// keyed is what a side of the runtime repros says of itself: its key.
type keyed interface{ key() string }

// sidesVerdict is the runtime repros' outcome over their sides: each
// side, and the verdict. It is embedded, so the result's JSON keeps its
// keys (sides, reproduced, fixed) at the end.
type sidesVerdict[S keyed] struct {
	Sides []S `json:"sides"`
	// Reproduced: upstream's side (and its candidate's, as the repro
	// says) showed the bug.
	Reproduced bool `json:"reproduced"`
	// Fixed: the pack's side (and the amended candidate's) did not.
	Fixed bool `json:"fixed"`
}

// OK is the verdict: reproduced, and fixed.
func (v sidesVerdict[S]) OK() bool { return v.Reproduced && v.Fixed }

// Side returns the side of key, if it ran.
func (v sidesVerdict[S]) Side(key string) (S, bool) {
	for _, s := range v.Sides {
		if s.key() == key {
			return s, true
		}
	}
	var zero S
	return zero, false
}

// Sides is the default comparison: upstream, candidate, pack.
func Sides() []string { return []string{SideUpstream, SideCandidate, SidePack} }

// MakeSides builds, in the database of src, one schema per key (prefix_key):
// upstream's by the real provider p (its runner: upstream 1..21 and 23);
// the candidate's by p, then upstream's candidate fix, port; the amended
// one by p, the port and the amendment; the pack's by the pack at its
// latest version.
func MakeSides(ctx context.Context, src *dbconn.Source, p *upstream.Provider, prefix string, keys []string) ([]Side, error) {
	var out []Side
	for _, key := range keys {
		s := Side{Key: key, Schema: prefix + "_" + key}
		made := "real provider " + upstream.AddonPackage + " (upstream 1..21, 23)"
		switch key {
		case SidePack:
			if err := migrate.To(ctx, src.Config(), s.Schema, migrations.Latest()); err != nil {
				return nil, err
			}
			s.Made = fmt.Sprintf("the pack at %04d", migrations.Latest())
		case SideUpstream, SideCandidate, SideAmended:
			if p == nil {
				return nil, fmt.Errorf("the %s side needs the real duroxide-pg provider (%s)", key, upstream.AddonPackage)
			}
			if err := p.Migrate(ctx, src, s.Schema); err != nil {
				return nil, err
			}
			s.Made = made
			if key != SideUpstream {
				if err := upstream.ApplyCandidate(ctx, src, s.Schema); err != nil {
					return nil, err
				}
				s.Made = made + ", then " + upstream.CandidateLabel + " (24)"
			}
			if key == SideAmended {
				if err := upstream.ApplyAmendment(ctx, src, s.Schema); err != nil {
					return nil, err
				}
				s.Made += " and the amendment offered upstream (" + upstream.AmendmentFile + ")"
			}
		default:
			return nil, fmt.Errorf("no side %q: use %s, %s, %s or %s", key, SideUpstream, SideCandidate, SidePack, SideAmended)
		}
		out = append(out, s)
	}
	return out, nil
}

// sideOf returns the side of key in sides.
func sideOf(sides []Side, key string) (Side, bool) {
	for _, s := range sides {
		if s.Key == key {
			return s, true
		}
	}
	return Side{}, false
}

// onSides makes the sides (MakeSides, prefix) in the database of src, then
// runs run on each in turn and collects the results (those before a
// failing side, with its error); upstream's side and the pack's must be
// among sides, for the verdict compares them. what names the repro in
// errors.
func onSides[R any](ctx context.Context, src *dbconn.Source, p *upstream.Provider, what, prefix string, sides []string, run func(Side) (R, error)) ([]R, error) {
	if !slices.Contains(sides, SideUpstream) || !slices.Contains(sides, SidePack) {
		return nil, fmt.Errorf("%s: the verdict compares upstream's side and the pack's; sides %v", what, sides)
	}
	made, err := MakeSides(ctx, src, p, prefix, sides)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	var out []R
	for _, side := range made {
		r, err := run(side)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}
