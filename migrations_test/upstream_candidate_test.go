package migrations_test

// Upstream's candidate fix of its issue #21 (unreleased; our port of it,
// internal/testenv/upstream/candidate) and that candidate with the
// amendment this project offers upstream (upstream/migrations, the
// separate form): databases
// duroxide-pg's runner gave them are recognised, adopted and fixed by the
// documented commands, and no step of the way takes the candidate's
// schema-scoped key away.

import (
	"context"
	"database/sql"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/baseline"
	"github.com/duroxide-pg/migrations/harness/ops/doctor"
	"github.com/duroxide-pg/migrations/harness/ops/fingerprint"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/sim/repro"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// candidateState is a start state holding an unreleased upstream fetch.
type candidateState struct {
	name string
	open func(t *testing.T) *testdb.Database
	// recorded are the unreleased versions its _duroxide_migrations holds;
	// the newest is what its fetch is.
	recorded []int64
	// whose is the key of the fetch's fingerprint in that version's
	// fingerprints.
	whose string
}

func candidateStates() []candidateState {
	return []candidateState{
		{"upstream's candidate (port)", func(t *testing.T) *testdb.Database { return dbs.UpstreamCandidate(t) }, []int64{24}, "port"},
		{"upstream's candidate (port) with the amendment", func(t *testing.T) *testdb.Database { return dbs.UpstreamAmended(t) }, []int64{24, 27}, "ours"},
	}
}

func fetchOf(t *testing.T, conn *sql.DB, schema string) fingerprint.Function {
	t.Helper()
	funcs, err := fingerprint.Take(context.Background(), conn, schema)
	require.NoError(t, err)
	for _, f := range funcs {
		if f.Name == "fetch_orchestration_item" {
			return f
		}
	}
	t.Fatalf("schema %s has no fetch_orchestration_item", schema)
	return fingerprint.Function{}
}

// The states hold what the pack's data says they hold: the port's and the
// amendment's fingerprints, their rows in _duroxide_migrations. And 0029's
// Down refuses on exactly those rows.
func TestCandidateStatesAreWhatThePackKnows(t *testing.T) {
	t.Parallel()
	for _, s := range candidateStates() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db := s.open(t)
			conn := sqlDB(t, db)
			newest, ok := candidateUnreleased(s.recorded[len(s.recorded)-1])
			require.True(t, ok)
			f := fetchOf(t, conn, db.Schema)
			require.True(t, f.Matches(newest.Fingerprints[s.whose]), "fetch is %s's %s text: %+v", newest.File, s.whose, f)
			require.True(t, newest.Holds(f))
			d, ok := fingerprint.Identify(f)
			require.True(t, ok)
			require.Equal(t, newest.Version, d.BehavesAs, "identified as %+v", d)
			for _, v := range s.recorded {
				u, _ := candidateUnreleased(v)
				var name string
				require.NoError(t, conn.QueryRow("SELECT name FROM "+db.Qualify("_duroxide_migrations")+" WHERE version = $1", v).Scan(&name))
				require.Equal(t, u.File, name, "upstream's runner recorded version %d", v)
			}
		})
	}
	scoped, ok := migrations.FixOf("orchestrator_queue_head_offer")
	require.True(t, ok)
	for _, u := range fingerprint.UnreleasedMigrations() {
		if fingerprint.NameOf(u.Function) != "fetch_orchestration_item" {
			continue // another function's unreleased change: not the key's business
		}
		require.Contains(t, scoped.Down, "'"+u.File+"'", "%s's Down refuses while %s is recorded", scoped.File, u.File)
	}
}

func sqlDB(t *testing.T, db *testdb.Database) *sql.DB {
	t.Helper()
	conn, err := sql.Open("pgx", db.DSN)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// doctor names the candidate: a warning, not a critical finding, that says
// what it has and lacks; and so for the amended one.
func TestDoctorNamesUpstreamsCandidate(t *testing.T) {
	t.Parallel()
	for _, s := range candidateStates() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db := s.open(t)
			r, err := doctor.Check(context.Background(), sqlDB(t, db), doctor.Options{Schema: db.Schema})
			require.NoError(t, err)
			u, _ := candidateUnreleased(s.recorded[len(s.recorded)-1])
			var seen bool
			for _, f := range r.Findings {
				require.NotEqual(t, doctor.Critical, f.Severity, "%+v", f)
				if f.Check == "fetch_orchestration_item" {
					seen = true
					require.Equal(t, doctor.Warning, f.Severity)
					require.Contains(t, f.Message, u.Note)
					require.Contains(t, f.Action, "harness baseline")
				}
			}
			require.True(t, seen, "a finding on fetch_orchestration_item: %+v", r.Findings)
			require.Equal(t, doctor.Warning, r.Status)
		})
	}
	require.Contains(t, mustUnreleased(t, 24).Note, "upstream's candidate fix of issue #21: no convoy, bounded; a caller timestamp minted before a wait outside the function still yields a dead lease")
}

func mustUnreleased(t *testing.T, v int64) fingerprint.Unreleased {
	t.Helper()
	u, ok := candidateUnreleased(v)
	require.True(t, ok, "the pack knows unreleased upstream %d", v)
	return u
}

// candidateUnreleased is the unreleased upstream fetch of version v
// (upstream's candidate, 24; with the amendment, 27): versions collide
// across upstream's branches, functions do not.
func candidateUnreleased(v int64) (fingerprint.Unreleased, bool) {
	for _, u := range fingerprint.UnreleasedMigrations() {
		if u.Version == v && fingerprint.NameOf(u.Function) == "fetch_orchestration_item" {
			return u, true
		}
	}
	return fingerprint.Unreleased{}, false
}

// baseline adopts the database, then `migrate up`, one version at a time,
// reaches the pack's latest; at every stop the fetch takes a schema-scoped
// key (the candidate's own, until the pack's fix that takes the same key
// replaces it). At the latest the fix holds and doctor is content; a Down
// below the scoped fix is refused, changing nothing.
func TestCandidateIsAdoptedAndFixedWithoutLosingItsKey(t *testing.T) {
	t.Parallel()
	scoped, ok := migrations.FixOf("orchestrator_queue_head_offer")
	require.True(t, ok, "the pack has a fix of the heads' keys")
	for _, s := range candidateStates() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := s.open(t)
			conn := sqlDB(t, db)
			res, err := baseline.Run(ctx, conn, baseline.Options{Schema: db.Schema})
			require.NoError(t, err, "baseline adopts it")
			require.Equal(t, s.recorded, res.Unreleased)
			require.Empty(t, res.Unvouched)
			require.True(t, slices.ContainsFunc(res.Lines, func(l string) bool { return strings.Contains(l, "is in no release, and the pack knows it") }), "%v", res.Lines)

			before := fetchOf(t, conn, db.Schema)
			r := db.Runner(t)
			for v := res.Baseline + 1; v <= migrations.Latest(); v++ {
				_, err := r.UpTo(ctx, v)
				require.NoError(t, err, "up to %d", v)
				f := fetchOf(t, conn, db.Schema)
				d, ok := fingerprint.Identify(f)
				require.True(t, ok, "at %d the fetch is known", v)
				if v < scoped.Version {
					require.Equal(t, before, f, "at %d the candidate is left as it is (%s)", v, d.Label)
				} else {
					require.True(t, fingerprint.FixedFrom(f, scoped.Version), "at %d the fetch is the pack's scoped fix, got %s", v, d.Label)
				}
			}
			rep, err := doctor.Check(ctx, conn, doctor.Options{Schema: db.Schema})
			require.NoError(t, err)
			require.True(t, doctor.AllFixed(rep.Functions), "%+v", rep.Functions)
			require.Equal(t, doctor.OK, rep.Status, "%+v", rep.Findings)

			h := &schemaDB{t: t, db: db, pool: db.PgxPool(t)}
			probe, err := repro.Minimal(ctx, h.pool, db.Schema, migrations.Latest(), repro.MinimalConfig{Filter: orch.RuntimeFilter()})
			require.NoError(t, err)
			require.True(t, probe.Fixed(), "a stale caller timestamp gets a full lease (%d ms left), its ack succeeds (%s)", probe.RemainingMs, probe.AckError)

			// Down to the scoped fix is allowed (later fixes keep its key);
			// below it is refused.
			_, err = r.DownTo(ctx, scoped.Version)
			require.NoError(t, err, "down to %d keeps the schema-scoped key", scoped.Version)
			after := fetchOf(t, conn, db.Schema)
			require.True(t, fingerprint.FixedFrom(after, scoped.Version))
			_, err = r.DownTo(ctx, scoped.Version-1)
			var pgErr *pgconn.PgError
			require.True(t, errors.As(err, &pgErr), "the Down is refused: %v", err)
			require.Equal(t, "55000", pgErr.Code)
			require.Contains(t, pgErr.Message, "schema-scoped")
			v, err := r.Version(ctx)
			require.NoError(t, err)
			require.Equal(t, scoped.Version, v)
			require.Equal(t, after, fetchOf(t, conn, db.Schema), "the refused Down changed nothing")
		})
	}
}

// Two schemas of one database, the same instance ids: a session holding
// one schema's keys keeps that schema's fetch (and enqueue, for the heads'
// key) off the instance, and the other schema's not at all.
func TestInstanceKeysAreScopedToTheSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbs.New(t, 0)
	const a, b = "scoped_a", "scoped_b"
	for _, s := range []string{a, b} {
		require.NoError(t, migrate.To(ctx, db.Source.Config(), s, migrations.Latest()))
	}
	pool := db.PgxPool(t)
	now := func() int64 {
		ms, err := orch.DBNowMs(ctx, pool)
		require.NoError(t, err)
		return ms
	}
	const instance = "same-id"
	for _, s := range []string{a, b} {
		require.NoError(t, orch.New(s).Enqueue(ctx, pool, instance, orch.StartWorkItem(instance, "Scoped", "1.0.0", 1), msTime(now()-1000)))
	}
	holder := db.Conn(t, "")
	_, err := holder.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1 || '.' || $2)), pg_advisory_lock(2700, hashtext($1 || '.' || $2))", a, instance)
	require.NoError(t, err)

	got, err := orch.New(b).Fetch(ctx, pool, now(), 5000, nil)
	require.NoError(t, err)
	require.NotNil(t, got, "schema %s's fetch claims its instance while %s's key is held", b, a)
	require.Equal(t, instance, got.InstanceID)
	got, err = orch.New(a).Fetch(ctx, pool, now(), 5000, nil)
	require.NoError(t, err)
	require.Nil(t, got, "schema %s's fetch skips the instance whose key is held", a)

	// The heads take no advisory key since 0030 (a lock on the head row,
	// which belongs to its schema): an enqueue waits on neither schema's
	// keys.
	enqueue := func(schema string) error {
		conn := db.Conn(t, "")
		_, err := conn.Exec(ctx, "SET lock_timeout = '300ms'")
		require.NoError(t, err)
		return orch.New(schema).Enqueue(ctx, conn, instance, orch.StartWorkItem(instance, "Scoped", "1.0.0", 2), msTime(now()))
	}
	require.NoError(t, enqueue(b), "schema %s's enqueue does not wait on %s's keys", b, a)
	require.NoError(t, enqueue(a), "schema %s's enqueue takes no advisory key", a)
}

// No function of the pack's latest takes an advisory key on an instance
// that is not scoped to the schema.
func TestNoPackFunctionTakesAnUnscopedInstanceKey(t *testing.T) {
	t.Parallel()
	db := dbs.New(t, testdb.Latest)
	h := &schemaDB{t: t, db: db, pool: db.PgxPool(t)}
	call := regexp.MustCompile(`pg_(?:try_)?advisory_(?:xact_)?lock(?:_shared)?\(([^;]*?)\)\s*(?:THEN|;)`)
	var keys int
	for _, src := range h.texts(`SELECT p.proname::text || E'\n' || p.prosrc FROM pg_proc p WHERE p.pronamespace = $1::regnamespace`, db.Schema) {
		name, body, _ := strings.Cut(src, "\n")
		for _, m := range call.FindAllStringSubmatch(body, -1) {
			if !strings.Contains(m[1], "instance_id") {
				continue // a key on a worker item or a session
			}
			keys++
			require.Contains(t, m[1], "current_schema() || '.' ||", "%s takes the instance key %s", name, m[1])
		}
	}
	require.Equal(t, 1, keys, "the fetch's key (the heads' upkeep takes row locks since 0030)")
}

// The minimal repro on every side, the amended candidate included: the
// bug where the lease comes from the caller's timestamp (upstream, its
// candidate), a full lease where it does not (the pack, the amendment).
func TestMinimalReproOnEverySide(t *testing.T) {
	t.Parallel()
	p := upstream.Require(t)
	ctx := context.Background()
	db := dbs.New(t, 0)
	sides, err := repro.MakeSides(ctx, db.Source, p, "sides", []string{repro.SideUpstream, repro.SideCandidate, repro.SidePack, repro.SideAmended})
	require.NoError(t, err)
	results, err := repro.RunMinimal(ctx, db.Source, sides)
	require.NoError(t, err)
	require.True(t, repro.MinimalResults(results).OK(), "%+v", results)
	for _, r := range results {
		t.Logf("%s: %+d ms left at return, ack ok %v", r.Side, r.RemainingMs, r.AckOK)
		if r.Side == repro.SideAmended {
			require.True(t, r.Fixed(), "the amendment hands out a full lease: %+v", r)
		}
	}
}
