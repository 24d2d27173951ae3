// Package packfacts holds the facts about the pack's versions that the
// tests and the lab (the repros, the benches, the soaks) read from sql/,
// beyond what the root package exports for other programs: which pairs of
// versions the repros compare, where upstream's history ends in the pack,
// what the fixes up to a version add. Every answer is read from the files;
// a pack without a fix gives an error, never a panic.
package packfacts

import (
	"fmt"
	"slices"

	migrations "github.com/duroxide-pg/migrations"
)

// FetchFix is the pair of versions the repros and benchmarks compare: the
// pack version just before its fix of fetch_orchestration_item, and that
// fix.
func FetchFix() (bug, fix int64, err error) { return fetchFix(migrations.MustPack()) }

func fetchFix(pack []migrations.Migration) (bug, fix int64, err error) {
	m, ok := firstFixOf(pack, "fetch_orchestration_item")
	if !ok {
		return 0, 0, fmt.Errorf("the pack has no fix of fetch_orchestration_item: there is nothing to compare")
	}
	return before(pack, m.Version), m.Version, nil
}

// workerFunctions are the worker queue's functions the pack fixes.
var workerFunctions = []string{"fetch_work_item", "renew_work_item_lock", "renew_session_lock"}

// WorkerFix is the pair of versions the worker repros and benchmark
// compare: the pack version just before the first of its fixes of the
// worker queue (fetch_work_item, renew_work_item_lock, renew_session_lock),
// and the last of them (a later fix of the same function included), so
// that the fixed side has every one.
func WorkerFix() (bug, fix int64, err error) { return workerFix(migrations.MustPack()) }

func workerFix(pack []migrations.Migration) (bug, fix int64, err error) {
	var first int64
	for _, fn := range workerFunctions {
		m, ok := firstFixOf(pack, fn)
		if !ok {
			return 0, 0, fmt.Errorf("the pack has no fix of %s: there is nothing to compare", fn)
		}
		for _, f := range pack {
			if slices.Contains(f.Fixes, fn) {
				fix = max(fix, f.Version)
			}
		}
		if first == 0 || m.Version < first {
			first = m.Version
		}
	}
	return before(pack, first), fix, nil
}

// firstFixOf is the first fix migration of function name in pack.
func firstFixOf(pack []migrations.Migration, name string) (migrations.Migration, bool) {
	for _, m := range pack {
		if !m.IsPort() && slices.Contains(m.Fixes, name) {
			return m, true
		}
	}
	return migrations.Migration{}, false
}

// before is the newest version of pack below v.
func before(pack []migrations.Migration, v int64) int64 {
	var out int64
	for _, m := range pack {
		if m.Version < v {
			out = m.Version
		}
	}
	return out
}

// UpstreamAt is the newest upstream version ported at or below goose
// version v (0 when none).
func UpstreamAt(v int64) int64 {
	var u int64
	for _, m := range migrations.MustPack() {
		if m.Version <= v && m.Upstream > u {
			u = m.Upstream
		}
	}
	return u
}

// LastContiguousPort is the newest goose version v such that every
// migration up to v is a port of upstream versions 1..v: the prefix of the
// pack that is upstream's history with nothing of the pack's in between
// (19 today; fixes come after it).
func LastContiguousPort() int64 {
	var v int64
	for _, m := range migrations.MustPack() {
		if !m.IsPort() || m.Upstream != m.Version {
			break
		}
		v = m.Version
	}
	return v
}

// AddedBy lists the objects the fix migrations up to goose version v add
// to upstream's catalog, in version order.
func AddedBy(v int64) []string {
	var out []string
	for _, m := range migrations.Fixes() {
		if m.Version <= v {
			out = append(out, m.Adds...)
		}
	}
	return out
}
