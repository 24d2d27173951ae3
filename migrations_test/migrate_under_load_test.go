package migrations_test

// `migrate up` with a writer enqueuing meanwhile (internal/migrateload), at
// a small size: from every start state to the latest, every write
// succeeds, the queue holds every message, and every instance with a
// message has a queue head no later than its oldest one. The writer's
// latencies are logged, never asserted (make bench measures them at
// 1,000,000 messages: docs/bench/migrate-load.md).

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
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
	require.Len(t, starts, 3)
	for _, start := range starts {
		t.Run(start.Name, func(t *testing.T) {
			db := dbs.New(t, 0)
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, db.DSN)
			require.NoError(t, err)
			defer conn.Close(ctx)

			load := migrateload.Load{Start: start, To: migrations.Latest(), Messages: 20_000, Instances: 2_000, Rate: 50, Lead: 500 * time.Millisecond}
			rep, err := migrateload.Run(ctx, db.Source, db.Schema, load)
			require.NoError(t, err)
			t.Log(rep.String())
			require.Zero(t, rep.Failed, "every write succeeds: %s", rep.FirstError)
			require.Positive(t, rep.Writes)

			var version int64
			require.NoError(t, conn.QueryRow(ctx, "SELECT max(version_id) FROM "+db.Qualify("goose_db_version")+" WHERE is_applied").Scan(&version))
			require.Equal(t, migrations.Latest(), version)
			var queued, headless int
			require.NoError(t, conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*),
				count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM %[2]s h WHERE h.instance_id = q.instance_id AND (h.visible_at, h.id) <= (q.visible_at, q.id)))
				FROM %[1]s q`, db.Qualify("orchestrator_queue"), db.Qualify("orchestrator_queue_heads"))).Scan(&queued, &headless))
			require.Equal(t, load.Messages+rep.Writes, queued, "the queue holds the backlog and every write")
			require.Zero(t, headless, "every message has its instance's head no later than itself")
		})
	}
}
