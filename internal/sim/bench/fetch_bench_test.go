package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/sim/simconfig"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

// BenchmarkFetchUncontended times one fetch_orchestration_item call, on
// one connection with nobody else around, of an instance shaped like the
// backlog scenario's (500-event history of ~250 bytes per event), at
// the versions before and after the fix (Versions). Each lease is handed
// back with abandon (ignore_attempt) outside the timed part.
//
//	go test -run '^$' -bench FetchUncontended ./internal/sim/bench
func BenchmarkFetchUncontended(b *testing.B) {
	s := server(b)
	ctx := context.Background()
	db, err := s.CreateDatabase(ctx, "harness_bench_micro_", "")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.DropDatabase(context.Background(), db) })
	src := testdb.MustSource(b, s.DSN(db))
	bug, fix, verr := Versions()
	require.NoError(b, verr)
	for _, v := range []int64{bug, fix} {
		schema := fmt.Sprintf("micro_v%d", v)
		if err := migrateSchema(ctx, src, schema, v); err != nil {
			b.Fatal(err)
		}
		if _, err := dispatch.Seed(ctx, src, dispatch.Config{Common: simconfig.Common{Schema: schema}, Instances: 1, HistoryEvents: 500, EventBytes: 250}); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("v%d", v), func(b *testing.B) {
			conn, err := src.Connect(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close(context.Background())
			c := orch.New(schema)
			timeout := time.Minute.Milliseconds()
			b.ResetTimer()
			for b.Loop() {
				it, err := c.Fetch(ctx, conn, time.Now().UnixMilli(), timeout, orch.RuntimeFilter())
				if err != nil || it == nil {
					b.Fatalf("fetch: %v (row %v)", err, it != nil)
				}
				b.StopTimer()
				if _, err := c.Abandon(ctx, conn, it.LockToken, time.Now().UnixMilli(), 0, true); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
