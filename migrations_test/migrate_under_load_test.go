package migrations_test

// `migrate up` with a writer enqueuing into each queue meanwhile
// (internal/migrateload), at a small size: from every start state to the
// latest, every write of either writer succeeds, each queue holds its
// backlog and every write, every instance with a message has a queue head
// no later than its oldest one, and the port of upstream 23 left its
// indexes partial and nothing under a build name. The writers' latencies
// are logged, never asserted (make bench measures them at 100,000 and
// 1,000,000 of each: docs/bench/migrate-load.md).

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/baseline"
	"github.com/duroxide-pg/migrations/harness/ops/catalog"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/migrateload"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

func TestMigrateUpUnderAWritersLoad(t *testing.T) {
	p := upstream.Require(t)
	starts, err := migrateload.Starts(func(ctx context.Context, src *dbconn.Source, schema string) error {
		return p.Migrate(ctx, src, schema)
	})
	require.NoError(t, err)
	require.Len(t, starts, 4)
	require.Contains(t, starts[0].Name, "upstream 1..21 (duroxide-pg's runner", "the state of the releases before upstream 23")
	for _, start := range starts {
		t.Run(start.Name, func(t *testing.T) {
			db := dbs.New(t, 0)
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, db.DSN)
			require.NoError(t, err)
			defer conn.Close(ctx)

			load := migrateload.Load{Start: start, To: migrations.Latest(), Messages: 20_000, WorkItems: 20_000, Instances: 2_000, Rate: 50, Lead: 500 * time.Millisecond}
			rep, err := migrateload.Run(ctx, db.Source, db.Schema, load)
			require.NoError(t, err)
			t.Log(rep.String())
			require.Len(t, rep.Writers, len(migrateload.Queues))
			for _, w := range rep.Writers {
				require.Zero(t, w.Failed, "every write into %s succeeds: %s", w.Queue, w.FirstError)
				require.Positive(t, w.Writes, w.Queue)
			}

			var version int64
			require.NoError(t, conn.QueryRow(ctx, "SELECT max(version_id) FROM "+db.Qualify("goose_db_version")+" WHERE is_applied").Scan(&version))
			require.Equal(t, migrations.Latest(), version)
			var queued, headless int
			require.NoError(t, conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*),
				count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM %[2]s h WHERE h.instance_id = q.instance_id AND (h.visible_at, h.id) <= (q.visible_at, q.id)))
				FROM %[1]s q`, db.Qualify("orchestrator_queue"), db.Qualify("orchestrator_queue_heads"))).Scan(&queued, &headless))
			require.Equal(t, load.Messages+rep.Writer("orchestrator_queue").Writes, queued, "orchestrator_queue holds the backlog and every write")
			require.Zero(t, headless, "every message has its instance's head no later than itself")
			var items int
			require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM "+db.Qualify("worker_queue")).Scan(&items))
			require.Equal(t, load.WorkItems+rep.Writer("worker_queue").Writes, items, "worker_queue holds the backlog and every write")
			var partial, leftovers int
			require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE c.relname IN ('idx_orch_lock', 'idx_worker_queue_session_id', 'idx_worker_queue_tag') AND i.indisvalid AND i.indpred IS NOT NULL),
				count(*) FILTER (WHERE c.relname LIKE '%\_0024\_%')
				FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relnamespace = $1::regnamespace`, db.Schema).Scan(&partial, &leftovers))
			require.Equal(t, 3, partial, "upstream 23's three partial indexes")
			require.Zero(t, leftovers, "nothing under a build or drop name")
		})
	}
}

// The start states of upstream 1..21 the bench makes (from duroxide-pg's
// runner with its 23 taken back, or from the pack's ports when the runner
// is missing) are upstream 21: its catalog, and a baseline takes them for
// state 21.
func TestMigrateLoadMakesUpstream21(t *testing.T) {
	p := upstream.Require(t)
	for name, mk := range map[string]func(context.Context, *dbconn.Source, string) error{
		"runner":           migrateload.Upstream21(p.Migrate),
		"the pack's ports": migrateload.PackShaped(21),
	} {
		t.Run(name, func(t *testing.T) {
			db := dbs.New(t, 0)
			ctx := context.Background()
			require.NoError(t, mk(ctx, db.Source, "shaped"))
			sqlDB := migrate.OpenDB(db.Source.Config(), "shaped", "")
			defer sqlDB.Close()
			snap, err := catalog.Take(ctx, sqlDB, "shaped")
			require.NoError(t, err)
			requireSameCatalog(t, upstreamCatalog(t, 21), snap, name)
			res, err := baseline.Run(ctx, sqlDB, baseline.Options{Schema: "shaped"})
			require.NoError(t, err)
			require.Equal(t, int64(21), res.State)
		})
	}
}
