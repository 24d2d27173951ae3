package testdb

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql's "pgx" driver, for baseline

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/baseline"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// Start states other than "the pack at version N": databases as production
// has them. Each is built once per test binary and cloned per test.

// UpstreamShaped is a database shaped like one duroxide-pg's own runner
// left at upstream version u: upstream's catalog, rows of the upstream
// versions up to u in _duroxide_migrations, no goose table, no fix. Its
// function texts are the pack's ports (RealProvider has upstream's own).
// It is built by the pack up to its port of u, then the fixes below that
// port are taken back and goose's table is dropped.
func (p *Pool) UpstreamShaped(t testing.TB, u int64) *Database {
	t.Helper()
	port, ok := migrations.PortOf(u)
	if !ok {
		t.Fatalf("the pack has no port of upstream version %d", u)
	}
	return p.NewState(t, fmt.Sprintf("upstream-shaped-%d", u), port.Version, func(ctx context.Context, db *Database) error {
		r, err := migrate.Open(ctx, db.Source.Config(), migrate.Options{Schema: db.Schema})
		if err != nil {
			return err
		}
		defer r.Close()
		fixes := migrations.Fixes()
		slices.Reverse(fixes)
		for _, m := range fixes {
			if m.Version < port.Version {
				if err := r.ApplyVersion(ctx, m.Version, false); err != nil {
					return err
				}
			}
		}
		return db.exec(ctx, "DROP TABLE "+db.Qualify(migrate.VersionTable))
	})
}

// RealProvider is a database made by the real duroxide-pg provider
// (upstream.AddonPackage): upstream's own runner applied upstream's own
// migrations (1..21 and 23) into the schema. t is skipped with the reason
// when the provider is missing (see upstream.Require).
func (p *Pool) RealProvider(t testing.TB) *Database {
	t.Helper()
	provider := upstream.Require(t)
	return p.NewState(t, "real-provider", 0, func(ctx context.Context, db *Database) error {
		return provider.Migrate(ctx, db.Source, db.Schema)
	})
}

// UpstreamCandidate is a database made by the real duroxide-pg provider
// that then got upstream's candidate fix of its issue #21, port
// (upstream.ApplyCandidate), the way upstream's runner applies a
// migration: what a duroxide-pg release carrying that fix would leave, its
// row (24) in _duroxide_migrations included.
func (p *Pool) UpstreamCandidate(t testing.TB) *Database {
	t.Helper()
	provider := upstream.Require(t)
	return p.NewState(t, "real-provider-candidate", 0, func(ctx context.Context, db *Database) error {
		if err := provider.Migrate(ctx, db.Source, db.Schema); err != nil {
			return err
		}
		return upstream.ApplyCandidate(ctx, db.Source, db.Schema)
	})
}

// UpstreamAmended is UpstreamCandidate with the amendment this project
// offers upstream applied on top, in its separate form
// (upstream/migrations/0027_… at the repository's root, recorded as 27),
// as upstream's runner would apply it.
func (p *Pool) UpstreamAmended(t testing.TB) *Database {
	t.Helper()
	provider := upstream.Require(t)
	return p.NewState(t, "real-provider-candidate-amended", 0, func(ctx context.Context, db *Database) error {
		if err := provider.Migrate(ctx, db.Source, db.Schema); err != nil {
			return err
		}
		if err := upstream.ApplyCandidate(ctx, db.Source, db.Schema); err != nil {
			return err
		}
		return upstream.ApplyAmendment(ctx, db.Source, db.Schema)
	})
}

// PackThenProvider is a database the pack built at version v and the real
// duroxide-pg provider then opened: its runner applies the upstream
// versions the pack had not recorded.
func (p *Pool) PackThenProvider(t testing.TB, v int64) *Database {
	t.Helper()
	provider := upstream.Require(t)
	return p.NewState(t, fmt.Sprintf("pack-%d-then-provider", v), v, func(ctx context.Context, db *Database) error {
		return provider.Migrate(ctx, db.Source, db.Schema)
	})
}

// AdoptedAtLatest is RealProvider adopted the documented way: `harness
// baseline`, then `harness migrate up` to the pack's latest (the fixes
// in force, doctor OK): where a duroxide-pg upgrade finds a database the
// pack fixed.
func (p *Pool) AdoptedAtLatest(t testing.TB) *Database {
	t.Helper()
	provider := upstream.Require(t)
	return p.NewState(t, "real-provider-adopted", 0, func(ctx context.Context, db *Database) error {
		if err := provider.Migrate(ctx, db.Source, db.Schema); err != nil {
			return err
		}
		return adopt(ctx, db)
	})
}

// adopt runs baseline, then migrate up to the pack's latest, on db.
func adopt(ctx context.Context, db *Database) error {
	conn, err := sql.Open("pgx", db.DSN)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := baseline.Run(ctx, conn, baseline.Options{Schema: db.Schema}); err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	return migrate.To(ctx, db.Source.Config(), db.Schema, migrations.Latest())
}

// Upgraded is AdoptedAtLatest after a duroxide-pg release that carries
// upstream's in-flight migration file (our port of it, upstream.InFlight)
// connected: its runner applied the file over the pack's fixes.
func (p *Pool) Upgraded(t testing.TB, file string) *Database {
	t.Helper()
	provider := upstream.Require(t)
	return p.NewState(t, "real-provider-adopted-then-"+file, 0, func(ctx context.Context, db *Database) error {
		if err := provider.Migrate(ctx, db.Source, db.Schema); err != nil {
			return err
		}
		if err := adopt(ctx, db); err != nil {
			return err
		}
		return upstream.ApplyInFlight(ctx, db.Source, db.Schema, file)
	})
}

func (d *Database) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, d.DSN)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}
