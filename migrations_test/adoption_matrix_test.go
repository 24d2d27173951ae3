package migrations_test

// The adoption matrix: every start state a DBA can meet (a new database,
// the pack's own, databases duroxide-pg's runner made or touched, a hand
// edit) times every procedure the docs give them (baseline then up; up to
// the pack's fix of the ack; down to the last port before the pack's fixes),
// each cell a test of the end state: refusals, goose's
// version, catalog, which definition each fixed function has, the
// stale-timestamp probe, KV reads against a reference, an ack in flight
// against a fetch whose clock says it expired, and no row lost.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/baseline"
	"github.com/duroxide-pg/migrations/harness/ops/catalog"
	"github.com/duroxide-pg/migrations/harness/ops/doctor"
	"github.com/duroxide-pg/migrations/harness/ops/fingerprint"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/packfacts"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/sim/repro"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// noGoose stands for "no goose version table".
const noGoose = -1

// startState is one kind of database a DBA can point the harness at.
type startState struct {
	name string
	open func(t *testing.T) *testdb.Database
	// goose is goose's version (noGoose: no table), upstream the upstream
	// version whose catalog it has (0: no duroxide tables).
	goose, upstream int64
	// fetch and ack are doctor's verdicts of the two fixed functions.
	fetch, ack string
	// amendedLease: the fetch is not the pack's, yet a stale caller
	// timestamp gets a full lease (upstream's candidate with the amendment
	// offered upstream).
	amendedLease bool
}

func matrixStates() []startState {
	latest := migrations.Latest()
	pack := func(v int64) startState {
		fetch, ack := verdictsAt(v)
		return startState{name: fmt.Sprintf("pack-built at %d", v), goose: v, upstream: packfacts.UpstreamAt(v), fetch: fetch, ack: ack,
			open: func(t *testing.T) *testdb.Database { return dbs.New(t, v) }}
	}
	shaped := func(u int64) startState {
		return startState{name: fmt.Sprintf("shaped like upstream %d", u), goose: noGoose, upstream: u, fetch: doctor.Unfixed, ack: doctor.Unfixed,
			open: func(t *testing.T) *testdb.Database { return dbs.UpstreamShaped(t, u) }}
	}
	return []startState{
		{name: "fresh", goose: noGoose, upstream: 0, fetch: doctor.Missing, ack: doctor.Missing,
			open: func(t *testing.T) *testdb.Database { return dbs.New(t, 0) }},
		pack(unfixedStop()), pack(orchFixedStop()), pack(latest),
		{name: "made by the real provider", goose: noGoose, upstream: upstreamLevel, fetch: doctor.Unfixed, ack: doctor.Unfixed,
			open: func(t *testing.T) *testdb.Database { return dbs.RealProvider(t) }},
		// What a duroxide-pg release carrying upstream's candidate fix of
		// its issue #21 (unreleased; our port of it), or that candidate
		// with the amendment offered upstream, leaves.
		{name: "made by the real provider, then upstream's candidate fix (port)", goose: noGoose, upstream: upstreamLevel, fetch: doctor.Unfixed, ack: doctor.Unfixed,
			open: func(t *testing.T) *testdb.Database { return dbs.UpstreamCandidate(t) }},
		{name: "made by the real provider, then upstream's candidate fix (port) and the amendment", goose: noGoose, upstream: upstreamLevel, fetch: doctor.Unfixed, ack: doctor.Unfixed, amendedLease: true,
			open: func(t *testing.T) *testdb.Database { return dbs.UpstreamAmended(t) }},
		shaped(19), shaped(20), shaped(21),
		// Its runner replaced 0021's ack with upstream 20's (doctor: the
		// fix goose records, replaced); the fetch, which upstream 20..23
		// leave alone, keeps 0020's fix.
		{name: fmt.Sprintf("pack-built at %d then opened by the real provider", orchFixedStop()), goose: orchFixedStop(), upstream: upstreamLevel, fetch: doctor.Fixed, ack: doctor.Replaced,
			open: func(t *testing.T) *testdb.Database { return dbs.PackThenProvider(t, orchFixedStop()) }},
		{name: "made by the real provider, ack edited by hand", goose: noGoose, upstream: upstreamLevel, fetch: doctor.Unfixed, ack: doctor.Unknown,
			open: func(t *testing.T) *testdb.Database {
				db := dbs.RealProvider(t)
				editByHand(t, db, "ack_orchestration_item")
				return db
			}},
	}
}

// unfixedStop is the last pack version before any fix of the pack's (the
// port of upstream's own history), and orchFixedStop the version where both
// orchestration fixes are in (where a DBA whose duroxide-pg stops before
// the worker fixes may stop): the two stops of the matrix, from sql/.
func unfixedStop() int64 { return packfacts.LastContiguousPort() }

func orchFixedStop() int64 {
	m, ok := migrations.FixOf("ack_orchestration_item")
	if !ok {
		panic("the pack has no fix of ack_orchestration_item")
	}
	return m.Version
}

// verdictsAt is what the pack at goose version v holds: a function is fixed
// from its fix migration on, and the pack's port of upstream before.
func verdictsAt(v int64) (fetch, ack string) {
	verdict := func(fn string) string {
		for _, m := range migrations.Fixes() {
			if slices.Contains(m.Fixes, fn) && m.Version <= v {
				return doctor.Fixed
			}
		}
		return doctor.Unfixed
	}
	return verdict("fetch_orchestration_item"), verdict("ack_orchestration_item")
}

// procedure is what the DBA runs; it returns the error the harness gave.
type procedure struct {
	name string
	kind procedureKind
	run  func(ctx context.Context, t *testing.T, db *testdb.Database) error
}

// procedureKind is what a procedure does, whatever versions its name shows.
type procedureKind int

const (
	baselineThenUp procedureKind = iota
	upToOrchFixed
	downToUnfixed
)

func matrixProcedures() []procedure {
	migrateOp := func(op func(ctx context.Context, r *migrate.Runner) error) func(ctx context.Context, t *testing.T, db *testdb.Database) error {
		return func(ctx context.Context, t *testing.T, db *testdb.Database) error {
			r, err := migrate.Open(ctx, db.Source.Config(), migrate.Options{Schema: db.Schema})
			if err != nil {
				return err
			}
			defer r.Close()
			return op(ctx, r)
		}
	}
	up := migrateOp(func(ctx context.Context, r *migrate.Runner) error { _, err := r.Up(ctx); return err })
	return []procedure{
		{"baseline then up", baselineThenUp, func(ctx context.Context, t *testing.T, db *testdb.Database) error {
			conn, err := sql.Open("pgx", db.DSN)
			require.NoError(t, err)
			defer conn.Close()
			_, berr := baseline.Run(ctx, conn, baseline.Options{Schema: db.Schema})
			// The DBA goes on to `migrate up` whatever baseline said:
			// migrate must then refuse what baseline refused.
			return errors.Join(berr, up(ctx, t, db))
		}},
		{fmt.Sprintf("up --to %d", orchFixedStop()), upToOrchFixed,
			migrateOp(func(ctx context.Context, r *migrate.Runner) error { _, err := r.UpTo(ctx, orchFixedStop()); return err })},
		{fmt.Sprintf("down --to %d", unfixedStop()), downToUnfixed,
			migrateOp(func(ctx context.Context, r *migrate.Runner) error { _, err := r.DownTo(ctx, unfixedStop()); return err })},
	}
}

// outcome is the expected end of one cell.
type outcome struct {
	// baselineRefused: baseline refuses (the DBA's up then refuses too,
	// when the schema has duroxide-pg's table and no goose table).
	baselineRefused bool
	// needsBaseline: migrate refuses with ErrNeedsBaseline, changing
	// nothing.
	needsBaseline   bool
	goose, upstream int64
	fetch, ack      string
	// fullLease: a fetch with a stale caller timestamp returns a full lease
	// (the pack's fix, or the amended candidate).
	fullLease bool
}

// expect is the table's end-state column, as rules: what the docs promise
// a DBA for each start state and procedure.
func expect(s startState, proc procedureKind) outcome {
	latest := migrations.Latest()
	unchanged := outcome{goose: s.goose, upstream: s.upstream, fetch: s.fetch, ack: s.ack, fullLease: s.fetch == doctor.Fixed || s.amendedLease}
	adopted := s.goose != noGoose || s.upstream == 0
	at := func(v int64) outcome {
		fetch, ack := verdictsAt(v)
		return outcome{goose: v, upstream: packfacts.UpstreamAt(v), fetch: fetch, ack: ack, fullLease: fetch == doctor.Fixed}
	}
	switch proc {
	case baselineThenUp:
		switch {
		case s.ack == doctor.Unknown: // a body nobody knows: refused twice, nothing changes
			o := unchanged
			o.baselineRefused, o.needsBaseline = true, true
			return o
		case s.upstream == 0: // nothing to adopt: baseline says so, up builds it
			o := at(latest)
			o.baselineRefused = true
			return o
		}
		o := at(latest)
		o.upstream = max(o.upstream, s.upstream)
		return o
	case upToOrchFixed:
		if !adopted {
			o := unchanged
			o.needsBaseline = true
			return o
		}
		if s.goose >= orchFixedStop() {
			// Nothing pending up to it; the restore step puts back a fix
			// goose records that duroxide-pg's runner replaced.
			o := unchanged
			if o.ack == doctor.Replaced {
				o.ack = doctor.Fixed
			}
			return o
		}
		return at(orchFixedStop())
	case downToUnfixed:
		if !adopted {
			o := unchanged
			o.needsBaseline = true
			return o
		}
		if s.goose <= unfixedStop() {
			o := unchanged
			if s.goose == noGoose {
				o.goose = 0 // migrate made its (empty) table
			}
			return o
		}
		o := at(unfixedStop())
		if s.upstream > packfacts.UpstreamAt(unfixedStop()) && s.goose < portOf(20) {
			// duroxide-pg's runner applied upstream 20+ outside goose:
			// the fixes' Downs restore the unfixed definitions of those
			// versions and leave upstream's objects alone.
			o.upstream = s.upstream
		}
		return o
	}
	panic(fmt.Sprintf("unknown procedure kind %d", proc))
}

func TestAdoptionMatrix(t *testing.T) {
	t.Parallel()
	for _, s := range matrixStates() {
		for _, p := range matrixProcedures() {
			t.Run(s.name+" | "+p.name, func(t *testing.T) {
				t.Parallel()
				runCell(t, s, p, expect(s, p.kind))
			})
		}
	}
}

func runCell(t *testing.T, s startState, p procedure, want outcome) {
	ctx := context.Background()
	db := s.open(t)
	h := &schemaDB{t: t, db: db, pool: db.PgxPool(t)}

	// Before: the state is what it claims, and it holds KV data.
	requireState(t, h, s.goose, s.upstream, s.fetch, s.ack, "start state")
	kv := newKVReference(h)
	kv.turns(0, 2)
	before := rowCounts(t, h)

	err := p.run(ctx, t, db)

	// The refusals, and that a refusal changed nothing.
	var refusal *baseline.Refusal
	require.Equal(t, want.baselineRefused, errors.As(err, &refusal), "baseline refused: %v", err)
	require.Equal(t, want.needsBaseline, errors.Is(err, migrate.ErrNeedsBaseline), "migrate refused with ErrNeedsBaseline: %v", err)
	if !want.baselineRefused && !want.needsBaseline {
		require.NoError(t, err)
	} else if want.needsBaseline {
		require.Contains(t, err.Error(), "harness baseline", "the refusal names the remedy")
	}

	// Catalog, goose and fingerprints.
	requireState(t, h, want.goose, want.upstream, want.fetch, want.ack, "end state")
	if want.goose == migrations.Latest() {
		// Ports re-applied over what duroxide-pg's runner made leave every
		// function as a fresh database at the latest version has it: the
		// same functions, the fixed ones fixed, the others the pack's text
		// or upstream's own of the same version.
		requireFunctionsAsAtLatest(t, h)
	}

	// No row lost: every table there before has at least its rows (kv_delta,
	// folded into kv_store by 0022's Down, is checked through KV reads).
	after := rowCounts(t, h)
	for table, n := range before {
		if table == "kv_delta" && !slices.Contains(slices.Collect(maps.Keys(after)), table) {
			continue
		}
		require.GreaterOrEqual(t, after[table], n, "rows of %s: %d before, %d after", table, n, after[table])
	}

	// KV: what the orchestration reads equals what it wrote, before and
	// after the procedure.
	kv.turns(2, 3)
	kv.requireReadsBack()

	if want.fetch == doctor.Missing {
		return
	}
	// The stale-timestamp probe: a fetch whose p_now_ms is 10 s stale.
	probe, err := repro.Minimal(ctx, h.pool, db.Schema, want.goose, repro.MinimalConfig{Filter: orch.RuntimeFilter()})
	require.NoError(t, err)
	require.True(t, probe.Fetched, "the probe's message was fetched")
	if want.fullLease {
		require.True(t, probe.Fixed(), "fixed fetch: a full lease (%d ms left) and a successful ack (%s)", probe.RemainingMs, probe.AckError)
	} else {
		require.True(t, probe.Bug(), "unfixed fetch: an expired lease (%d ms left) and a refused ack", probe.RemainingMs)
	}

	// An ack in flight against a fetch whose clock says its lease expired
	// (only where the fetch skips locked instances instead of waiting on
	// them: 19's fetch would wait on the test's own blocker).
	if want.fetch == doctor.Fixed {
		overtaken, left := ackInFlightOvertaken(t, &fixBundle{db: db, pool: h.pool, c: orch.New(db.Schema)})
		if want.ack == doctor.Fixed {
			require.False(t, overtaken, "the fixed ack holds its lease")
			require.Zero(t, left, "the batch was consumed once")
		} else {
			require.True(t, overtaken, "the unfixed ack loses its batch to the fetch")
		}
	}
}

func portOf(u int64) int64 {
	m, ok := migrations.PortOf(u)
	if !ok {
		panic(fmt.Sprintf("the pack has no port of upstream %d", u))
	}
	return m.Version
}

// requireState checks goose's version, the catalog (upstream's at
// upstream), and which definition the fixed functions have.
func requireState(t *testing.T, h *schemaDB, goose, upstream int64, fetch, ack, what string) {
	t.Helper()
	ctx := context.Background()
	var hasGoose bool
	h.scan("SELECT to_regclass($1) IS NOT NULL", []any{h.db.Qualify(migrate.VersionTable)}, &hasGoose)
	got := int64(noGoose)
	if hasGoose {
		h.scan("SELECT coalesce(max(version_id), 0) FROM "+h.db.Qualify(migrate.VersionTable)+" WHERE is_applied", nil, &got)
	}
	require.Equal(t, goose, got, "%s: goose version", what)

	conn, err := sql.Open("pgx", h.db.DSN)
	require.NoError(t, err)
	defer conn.Close()
	snap, err := catalog.Take(ctx, conn, h.db.Schema)
	require.NoError(t, err)
	if upstream == 0 {
		for _, tbl := range []string{"instances", "_duroxide_migrations"} {
			var exists bool
			h.scan("SELECT to_regclass($1) IS NOT NULL", []any{h.db.Qualify(tbl)}, &exists)
			require.False(t, exists, "%s: no duroxide table %s", what, tbl)
		}
	} else {
		requireUpstreamPlus(t, upstreamCatalog(t, upstream), snap, packfacts.AddedBy(goose), fmt.Sprintf("%s: upstream %d", what, upstream))
	}

	fns, err := doctor.Functions(ctx, conn, h.db.Schema)
	require.NoError(t, err)
	verdicts := map[string]string{}
	for _, f := range fns {
		require.NotContains(t, verdicts, f.Name, "%s: doctor lists %s once", what, f.Name)
		verdicts[f.Name] = f.Verdict
	}
	require.Equal(t, fetch, verdicts["fetch_orchestration_item"], "%s: fetch_orchestration_item %+v", what, fns)
	require.Equal(t, ack, verdicts["ack_orchestration_item"], "%s: ack_orchestration_item %+v", what, fns)
}

func requireFunctionsAsAtLatest(t *testing.T, h *schemaDB) {
	t.Helper()
	latest := migrations.Latest()
	u := packfacts.UpstreamAt(latest)
	conn, err := sql.Open("pgx", h.db.DSN)
	require.NoError(t, err)
	defer conn.Close()
	funcs, err := fingerprint.Take(context.Background(), conn, h.db.Schema)
	require.NoError(t, err)
	texts := fingerprint.PackTexts(u)
	added := addedFunctions(latest)
	require.Len(t, funcs, len(texts)+len(added), "the functions of pack %d", latest)
	for id, f := range funcs {
		if fp, ok := added[f.Name]; ok {
			require.True(t, f.Matches(fp), "%s is the text of the newest fix that defines it", id)
			continue
		}
		if d, ok := fingerprint.Identify(f); ok && d.Fixed {
			continue
		}
		require.True(t, fingerprint.Allowed(f, u), "%s is the pack's or upstream's text at upstream %d", id, u)
	}
}

// editByHand adds a comment to a function's body, as a DBA's hot fix would.
func editByHand(t *testing.T, db *testdb.Database, fn string) {
	t.Helper()
	h := &schemaDB{t: t, db: db, pool: db.PgxPool(t)}
	var def string
	h.scan("SELECT pg_get_functiondef($1::regproc)", []any{db.Qualify(fn)}, &def)
	h.exec(strings.Replace(def, "BEGIN", "BEGIN\n    -- hot fix, by hand", 1))
}

// rowCounts counts the rows of every table of the schema but the two
// bookkeeping tables.
func rowCounts(t *testing.T, h *schemaDB) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, table := range h.texts(`SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relname NOT IN ($2, '_duroxide_migrations')`, h.db.Schema, migrate.VersionTable) {
		var n int64
		h.scan("SELECT count(*) FROM "+h.db.Qualify(table), nil, &n)
		out[table] = n
	}
	return out
}

// kvReference drives one orchestration that writes KV across turns, and
// remembers what it wrote.
type kvReference struct {
	h       *schemaDB
	started bool
	want    map[string]string
}

func newKVReference(h *schemaDB) *kvReference { return &kvReference{h: h, want: map[string]string{}} }

// kvTurns are the orchestration's turns: key a is set twice (the second
// value must win) before the procedure, b after it.
var kvTurns = []struct{ key, value string }{{"a", "v1"}, {"a", "v2"}, {"b", "w"}}

// turns runs turns [from, to) when the schema has KV (upstream 18 on).
func (k *kvReference) turns(from, to int) {
	k.h.t.Helper()
	if !k.hasKV() {
		return
	}
	if !k.started {
		k.h.startInstance("kv", "Counter", "1.0.0", clock0)
		k.started = true
	}
	for i := from; i < to; i++ {
		key, value := kvTurns[i].key, kvTurns[i].value
		_, err := k.h.turnErr("kv", clock0+int64(i+1)*1_000, turn{Meta: kvMeta(k.h.t, "Running", kvSet(key, value, clock0+int64(i+1)*1_000))})
		require.NoError(k.h.t, err, "KV turn %d", i)
		k.want[key] = value
	}
}

func (k *kvReference) hasKV() bool {
	var ok bool
	k.h.scan("SELECT to_regclass($1) IS NOT NULL", []any{k.h.db.Qualify("kv_store")}, &ok)
	return ok
}

// requireReadsBack reads the orchestration's KV the way duroxide-pg does at
// the schema's version and compares it with what it wrote: from upstream 20
// on through get_kv_all_values (the fetch's snapshot is then, by design,
// the state at the start of the execution: kv_store only), before 20
// through the fetch's snapshot.
func (k *kvReference) requireReadsBack() {
	k.h.t.Helper()
	if !k.hasKV() {
		return
	}
	var reader bool
	k.h.scan("SELECT to_regproc($1) IS NOT NULL", []any{k.h.db.Qualify("get_kv_all_values")}, &reader)
	if reader {
		require.Equal(k.h.t, k.want, k.h.getKVAll("kv"), "get_kv_all_values")
		return
	}
	now := clock0 + 100_000
	k.h.enqueueOrch("kv", externalItem("kv", "read"), now)
	it := k.h.mustFetchOrch(now, "kv")
	got := map[string]string{}
	for key, e := range it.KV {
		got[key] = e.Value
	}
	require.Equal(k.h.t, k.want, got, "the fetch's KV snapshot")
	k.h.ack(it.Token, now+1, turn{})
}
