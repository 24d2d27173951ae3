// Package migrateload measures what `migrate up` does to the queue's
// writers: a schema at a start version holding a backlog in
// orchestrator_queue, a writer enqueuing messages at a steady rate through
// enqueue_orchestrator_work (what duroxide-pg calls), and `migrate up` to
// the target version in the middle of it. It reports how long each write
// took, counted from the moment it was due (a write held up delays the
// ones behind it; they count from their own due time, so nothing a block
// causes goes unseen), the migration's own time, and whether every write
// succeeded.
package migrateload

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/baseline"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/packfacts"
)

// Start is a state a schema starts from: its name, and how to make it.
type Start struct {
	Name string
	// Prepare makes the state in schema of src's database; `migrate up`
	// must then accept the schema.
	Prepare func(ctx context.Context, src *dbconn.Source, schema string) error
}

// PackAt is a schema the pack built up to version v.
func PackAt(name string, v int64) Start {
	return Start{Name: name, Prepare: func(ctx context.Context, src *dbconn.Source, schema string) error {
		return migrate.To(ctx, src.Config(), schema, v)
	}}
}

// Baselined is a schema made by made (duroxide-pg's own runner), then
// adopted with `harness baseline`, as a DBA does before `migrate up`.
func Baselined(name string, made func(ctx context.Context, src *dbconn.Source, schema string) error) Start {
	return Start{Name: name, Prepare: func(ctx context.Context, src *dbconn.Source, schema string) error {
		if err := made(ctx, src, schema); err != nil {
			return err
		}
		db := migrate.OpenDB(src.Config(), schema, "")
		defer db.Close()
		_, err := baseline.Run(ctx, db, baseline.Options{Schema: schema})
		return err
	}}
}

// Load is one measurement.
type Load struct {
	Start Start
	// To is the version `migrate up` takes the schema to.
	To int64
	// Messages are queued before the writer starts, spread over Instances
	// instances.
	Messages, Instances int
	// Rate is the writer's messages per second.
	Rate int
	// Lead is how long the writer runs alone before the migration starts,
	// and again after it ends.
	Lead time.Duration
}

// Report is what a Load measured.
type Report struct {
	Start     string `json:"start"`
	To        int64  `json:"to"`
	Messages  int    `json:"messages"`
	Instances int    `json:"instances"`
	Rate      int    `json:"rate_per_s"`
	// MigrateMs is the wall time of `migrate up`.
	MigrateMs float64 `json:"migrate_ms"`
	// Writes are the writes made, Failed those that returned an error
	// (FirstError the first of them).
	Writes     int    `json:"writes"`
	Failed     int    `json:"failed"`
	FirstError string `json:"first_error,omitempty"`
	// MaxMs, P99Ms and P50Ms are the writes' latencies from their due
	// time, over the whole run; DuringMaxMs the largest of a write due
	// while the migration ran.
	MaxMs       float64 `json:"max_ms"`
	P99Ms       float64 `json:"p99_ms"`
	P50Ms       float64 `json:"p50_ms"`
	DuringMaxMs float64 `json:"during_migrate_max_ms"`
}

// Validate refuses sizes that cannot be measured (Run also needs a
// start state).
func (l Load) Validate() error {
	switch {
	case l.To < 1:
		return fmt.Errorf("migrateload: target version %d", l.To)
	case l.Messages < 0 || l.Instances < 1:
		return fmt.Errorf("migrateload: %d messages over %d instances: need at least one instance", l.Messages, l.Instances)
	case l.Rate < 1 || l.Rate > 10_000:
		return fmt.Errorf("migrateload: rate %d/s: between 1 and 10000", l.Rate)
	case l.Lead <= 0:
		return fmt.Errorf("migrateload: lead %v: must be positive", l.Lead)
	}
	return nil
}

// Run measures l on schema (which must not exist yet, or be empty) of
// src's database.
func Run(ctx context.Context, src *dbconn.Source, schema string, l Load) (*Report, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if l.Start.Prepare == nil || l.Start.Name == "" {
		return nil, errors.New("migrateload: the load has no start state")
	}
	if err := l.Start.Prepare(ctx, src, schema); err != nil {
		return nil, fmt.Errorf("migrateload: start state %s: %w", l.Start.Name, err)
	}
	conn, err := src.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrateload: %w", err)
	}
	defer conn.Close(context.Background())
	queue := pgx.Identifier{schema, "orchestrator_queue"}.Sanitize()
	if _, err := conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (instance_id, work_item, visible_at, created_at)
		SELECT 'load-' || (g %% %d), '{"ExternalRaised":{"instance":"x","name":"go","data":"1"}}', now(), now()
		FROM generate_series(1, %d) g`, queue, l.Instances, l.Messages)); err != nil {
		return nil, fmt.Errorf("migrateload: backlog: %w", err)
	}
	if _, err := conn.Exec(ctx, "ANALYZE "+queue); err != nil {
		return nil, fmt.Errorf("migrateload: analyze: %w", err)
	}

	writer, err := src.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrateload: writer: %w", err)
	}
	defer writer.Close(context.Background())
	enqueue := fmt.Sprintf("SELECT %s($1, $2, now())", pgx.Identifier{schema, "enqueue_orchestrator_work"}.Sanitize())

	var (
		mu          sync.Mutex
		migrateFrom time.Time
		migrateTo   time.Time
		rep         = &Report{Start: l.Start.Name, To: l.To, Messages: l.Messages, Instances: l.Instances, Rate: l.Rate}
		latencies   []float64
		stop        = make(chan struct{})
		wg          sync.WaitGroup
	)
	var stopOnce sync.Once
	end := func() { stopOnce.Do(func() { close(stop) }) }
	defer func() { end(); wg.Wait() }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		period := time.Second / time.Duration(l.Rate)
		start := time.Now()
		for i := 0; ; i++ {
			due := start.Add(time.Duration(i) * period)
			// A write once started runs to its end: the caller counts
			// the queue against the writes.
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-time.After(time.Until(due)):
			}
			_, err := writer.Exec(ctx, enqueue, fmt.Sprintf("load-w-%d", i%l.Instances), `{"ExternalRaised":{"instance":"x","name":"go","data":"1"}}`)
			ms := float64(time.Since(due).Microseconds()) / 1000
			mu.Lock()
			rep.Writes++
			latencies = append(latencies, ms)
			if err != nil {
				rep.Failed++
				if rep.FirstError == "" {
					rep.FirstError = err.Error()
				}
			}
			if !migrateFrom.IsZero() && !due.Before(migrateFrom) && (migrateTo.IsZero() || due.Before(migrateTo)) {
				rep.DuringMaxMs = math.Max(rep.DuringMaxMs, ms)
			}
			mu.Unlock()
		}
	}()

	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	if err := sleep(l.Lead); err != nil {
		return nil, err
	}
	mu.Lock()
	migrateFrom = time.Now()
	mu.Unlock()
	migErr := migrate.To(ctx, src.Config(), schema, l.To)
	mu.Lock()
	migrateTo = time.Now()
	rep.MigrateMs = float64(migrateTo.Sub(migrateFrom).Microseconds()) / 1000
	mu.Unlock()
	if migErr == nil {
		migErr = sleep(l.Lead)
	}
	end()
	wg.Wait()
	if migErr != nil {
		return nil, fmt.Errorf("migrateload: migrate up from %s to %d: %w", l.Start.Name, l.To, migErr)
	}
	if rep.Writes == 0 {
		return nil, errors.New("migrateload: the writer made no write")
	}
	slices.Sort(latencies)
	rep.MaxMs = latencies[len(latencies)-1]
	rep.P99Ms = quantile(latencies, 0.99)
	rep.P50Ms = quantile(latencies, 0.50)
	return rep, nil
}

// quantile of sorted (nearest rank).
func quantile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// String is the report in one line.
func (r *Report) String() string {
	return fmt.Sprintf("migrate up from %s to %d with %d messages over %d instances, a writer at %d/s: migrate %.0f ms; %d writes, %d failed; write latency from its due time: max %.1f ms (max %.1f ms while migrating), p99 %.1f ms, p50 %.1f ms",
		r.Start, r.To, r.Messages, r.Instances, r.Rate, r.MigrateMs, r.Writes, r.Failed, r.MaxMs, r.DuringMaxMs, r.P99Ms, r.P50Ms)
}

// headsTable is the object whose migration builds the queue heads (an
// index and a backfill over the whole queue).
const headsTable = "table orchestrator_queue_heads"

// Starts are the start states a DBA migrates from, read from sql/: a
// database duroxide-pg's runner made (made, when not nil: upstream 1..21
// and 23), baselined; upstream 19's catalog as the pack's ports build it
// (what a database of duroxide-pg 0.1.26 or earlier is; its full queue
// indexes are rebuilt partial on the way); and the pack just before the
// migration that builds the queue heads.
func Starts(made func(ctx context.Context, src *dbconn.Source, schema string) error) ([]Start, error) {
	pack, err := migrations.Pack()
	if err != nil {
		return nil, fmt.Errorf("migrateload: %w", err)
	}
	var heads int64
	for _, m := range pack {
		if slices.Contains(m.Adds, headsTable) {
			heads = m.Version
		}
	}
	if heads == 0 {
		return nil, fmt.Errorf("migrateload: no migration of the pack adds %s", headsTable)
	}
	var out []Start
	if made != nil {
		out = append(out, Baselined("upstream 1..21 and 23 (duroxide-pg's runner), baselined", made))
	}
	return append(out,
		PackAt(fmt.Sprintf("upstream 19's catalog (goose %d)", packfacts.LastContiguousPort()), packfacts.LastContiguousPort()),
		PackAt(fmt.Sprintf("the pack at %d, before its queue heads", heads-1), heads-1),
	), nil
}

// Full is the load `make bench` measures, without its start and target: a
// queue of 1,000,000 messages over 100,000 instances and a writer
// enqueuing 50 a second.
func Full() Load {
	return Load{Messages: 1_000_000, Instances: 100_000, Rate: 50, Lead: 2 * time.Second}
}
