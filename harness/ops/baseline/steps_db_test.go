package baseline_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/harness/ops/baseline"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
)

// inTx runs fn in a transaction on db that is rolled back.
func inTx(t *testing.T, db *sql.DB, fn func(tx *sql.Tx)) {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	fn(tx)
}

func TestStepsReadTheRunnersAndGoosesRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, db := upstreamBuilt(t, 21)
	inTx(t, db, func(tx *sql.Tx) {
		state, err := baseline.ReadHistoryState(ctx, tx, d.Schema)
		require.NoError(t, err)
		require.Equal(t, int64(21), state)
		newest, err := baseline.ReadGooseNewest(ctx, tx, d.Schema, migrate.VersionTable)
		require.NoError(t, err)
		require.Equal(t, int64(-1), newest, "the runner made no goose table")

		_, err = baseline.ReadHistoryState(ctx, tx, "no_such_schema")
		require.True(t, baseline.IsRefusal(err), "%v", err)
	})
}

func TestCheckCatalogAndBodiesFindWhatIsNotUpstreams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, db := upstreamBuilt(t, 21)
	inTx(t, db, func(tx *sql.Tx) {
		reason, diff, err := baseline.CheckCatalog(ctx, tx, d.Schema, migrate.VersionTable, 21)
		require.NoError(t, err)
		require.Empty(t, reason, diff)
		n, reason, diff, err := baseline.CheckBodies(ctx, tx, d.Schema, 21)
		require.NoError(t, err)
		require.Empty(t, reason, diff)
		require.Greater(t, n, 20, "the schema's functions were read")

		reason, _, err = baseline.CheckCatalog(ctx, tx, d.Schema, migrate.VersionTable, 19)
		require.NoError(t, err)
		require.Contains(t, reason, "does not match upstream's catalog at version 19", "21's catalog is not 19's")
	})
	editFetch(t, db)
	exec(t, db, "CREATE TABLE "+d.Qualify("stray")+" (id int)")
	inTx(t, db, func(tx *sql.Tx) {
		_, diff, err := baseline.CheckCatalog(ctx, tx, d.Schema, migrate.VersionTable, 21)
		require.NoError(t, err)
		require.Contains(t, diff, "+ extra    table stray")
		_, reason, diff, err := baseline.CheckBodies(ctx, tx, d.Schema, 21)
		require.NoError(t, err)
		require.Contains(t, reason, "neither upstream's at version 21 nor the pack's")
		require.Contains(t, diff, "function fetch_orchestration_item(")
	})
}

func TestRecordWritesExactlyTheBaseline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, db := upstreamBuilt(t, 19)
	qtable := pgx.Identifier{d.Schema, migrate.VersionTable}.Sanitize()
	versions := func() []int64 {
		rows, err := db.QueryContext(ctx, "SELECT version_id FROM "+qtable+" ORDER BY 1")
		require.NoError(t, err)
		defer rows.Close()
		var out []int64
		for rows.Next() {
			var v int64
			require.NoError(t, rows.Scan(&v))
			out = append(out, v)
		}
		require.NoError(t, rows.Err())
		return out
	}
	commit := func(create bool, base int64) {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, baseline.Record(ctx, tx, qtable, create, base))
		require.NoError(t, tx.Commit())
	}
	commit(true, 3)
	require.Equal(t, []int64{0, 1, 2, 3}, versions(), "created, with 0..3")
	exec(t, db, "INSERT INTO "+qtable+" (version_id, is_applied) VALUES (30, true)")
	commit(false, 2)
	require.Equal(t, []int64{0, 1, 2}, versions(), "replaced: exactly 0..2, nothing left of before")
}
