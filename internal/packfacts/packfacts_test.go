package packfacts

import (
	"slices"
	"testing"

	migrations "github.com/duroxide-pg/migrations"
)

func TestTheReprosCompareTheFetchFixWithThePortBeforeIt(t *testing.T) {
	bug, fix, err := FetchFix()
	if err != nil {
		t.Fatal(err)
	}
	m, ok := migrations.ByVersion(fix)
	if !ok || !slices.Contains(m.Fixes, "fetch_orchestration_item") {
		t.Fatalf("FetchFix's fix %d is %+v, not the migration whose header says it fixes fetch_orchestration_item", fix, m.Fixes)
	}
	before, ok := migrations.ByVersion(bug)
	if !ok || bug != fix-1 || !before.IsPort() {
		t.Errorf("FetchFix's bug version %d: want the port right before %s", bug, m.File)
	}
}

func TestTheWorkerReprosCompareTheWorkerFixesWithTheVersionBeforeThem(t *testing.T) {
	bug, fix, err := WorkerFix()
	if err != nil {
		t.Fatal(err)
	}
	fixed := map[string]bool{}
	for v := bug + 1; v <= fix; v++ {
		m, ok := migrations.ByVersion(v)
		if !ok || m.IsPort() {
			t.Fatalf("WorkerFix's versions %d..%d: %d is %+v, not a fix", bug+1, fix, v, m)
		}
		for _, fn := range m.Fixes {
			fixed[fn] = true
		}
	}
	for _, fn := range workerFunctions {
		m, ok := migrations.FixOf(fn)
		if !ok || m.Version <= bug || m.Version > fix || !fixed[fn] {
			t.Errorf("%s is fixed by %s (version %d), not within WorkerFix's (%d, %d]", fn, m.File, m.Version, bug, fix)
		}
	}
	before, ok := migrations.ByVersion(bug)
	if !ok || !before.IsPort() {
		t.Errorf("WorkerFix's bug version %d: want the port right before the first worker fix, got %+v", bug, before.Fixes)
	}
	if _, fetchFix, _ := FetchFix(); bug <= fetchFix {
		t.Errorf("WorkerFix's bug version %d already lacks the orchestration fetch fix %d", bug, fetchFix)
	}
}

// A pack without the fixes (upstream's history alone) has no pair to
// compare: an error that names the function, not a panic.
func TestAPackWithoutTheFixesHasNoPairAndSaysWhy(t *testing.T) {
	var ports []migrations.Migration
	for _, m := range migrations.MustPack() {
		if m.IsPort() {
			ports = append(ports, m)
		}
	}
	if _, _, err := fetchFix(ports); err == nil || err.Error() != "the pack has no fix of fetch_orchestration_item: there is nothing to compare" {
		t.Errorf("fetchFix on ports only: %v", err)
	}
	if _, _, err := workerFix(ports); err == nil || err.Error() != "the pack has no fix of fetch_work_item: there is nothing to compare" {
		t.Errorf("workerFix on ports only: %v", err)
	}
}

func TestUpstreamsHistoryInThePack(t *testing.T) {
	if got := LastContiguousPort(); got != 19 {
		t.Errorf("LastContiguousPort = %d, want 19 (the fixes follow upstream 19)", got)
	}
	if got := UpstreamAt(migrations.Latest()); got != slices.Max(migrations.UpstreamVersions()) {
		t.Errorf("UpstreamAt(latest) = %d, want the newest upstream version ported", got)
	}
	if got := UpstreamAt(3); got != 3 {
		t.Errorf("UpstreamAt(3) = %d", got)
	}
	var all []string
	for _, m := range migrations.Fixes() {
		all = append(all, m.Adds...)
	}
	if got := AddedBy(migrations.Latest()); !slices.Equal(got, all) {
		t.Errorf("AddedBy(latest) = %v, want every fix's Adds %v", got, all)
	}
	if got := AddedBy(LastContiguousPort()); len(got) != 0 {
		t.Errorf("AddedBy(%d) = %v: upstream's history adds nothing of the pack's", LastContiguousPort(), got)
	}
}
