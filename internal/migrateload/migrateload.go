// Package migrateload measures what `migrate up` does to the queues'
// writers: a schema at a start version holding a backlog in both queues
// (messages in orchestrator_queue, work items in worker_queue), a writer on
// each queue calling what duroxide-pg calls (enqueue_orchestrator_work,
// enqueue_worker_work) at a steady rate, and `migrate up` to the target
// version in the middle of it. It reports, per queue, how long each write
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
		if _, err := baseline.Run(ctx, db, baseline.Options{Schema: schema}); err != nil {
			return fmt.Errorf("baseline schema %s: %w", schema, err)
		}
		return nil
	}}
}

// Upstream21 makes a schema at upstream 1..21, the state of the
// duroxide-pg releases before upstream 23, from made (duroxide-pg's
// runner, which applies 1..21 and 23): upstream 23 changes no function,
// only three indexes, which it makes partial, and its row; both are taken
// back here, upstream 21's full indexes built again on the empty schema
// and row 23 deleted, in one transaction. The function texts stay
// upstream's own.
func Upstream21(made func(ctx context.Context, src *dbconn.Source, schema string) error) func(ctx context.Context, src *dbconn.Source, schema string) error {
	return func(ctx context.Context, src *dbconn.Source, schema string) error {
		if err := made(ctx, src, schema); err != nil {
			return err
		}
		conn, err := src.Connect(ctx)
		if err != nil {
			return fmt.Errorf("take upstream 23 back from schema %s: %w", schema, err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		q := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			for _, stmt := range []string{
				"DROP INDEX " + q("idx_orch_lock"),
				"CREATE INDEX idx_orch_lock ON " + q("orchestrator_queue") + " (lock_token)",
				"DROP INDEX " + q("idx_worker_queue_session_id"),
				"CREATE INDEX idx_worker_queue_session_id ON " + q("worker_queue") + " (session_id)",
				"DROP INDEX " + q("idx_worker_queue_tag"),
				"CREATE INDEX idx_worker_queue_tag ON " + q("worker_queue") + " (tag)",
				"DELETE FROM " + q("_duroxide_migrations") + " WHERE version = 23",
			} {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("%s: %w", stmt, err)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("take upstream 23 back from schema %s: %w", schema, err)
		}
		return nil
	}
}

// PackShaped makes a schema shaped like one duroxide-pg's runner left at
// upstream version u, from the pack's ports (their function texts are the
// pack's, not upstream's): the pack up to its port of u, the fixes below
// that port taken back, goose's table dropped.
func PackShaped(u int64) func(ctx context.Context, src *dbconn.Source, schema string) error {
	return func(ctx context.Context, src *dbconn.Source, schema string) error {
		port, ok := migrations.PortOf(u)
		if !ok {
			return fmt.Errorf("migrateload: the pack has no port of upstream version %d", u)
		}
		r, err := migrate.Open(ctx, src.Config(), migrate.Options{Schema: schema})
		if err != nil {
			return fmt.Errorf("schema %s shaped like upstream %d: %w", schema, u, err)
		}
		defer r.Close()
		if _, err := r.UpTo(ctx, port.Version); err != nil {
			return fmt.Errorf("schema %s shaped like upstream %d: %w", schema, u, err)
		}
		fixes := migrations.Fixes()
		slices.Reverse(fixes)
		for _, m := range fixes {
			if m.Version < port.Version {
				if err := r.ApplyVersion(ctx, m.Version, false); err != nil {
					return fmt.Errorf("schema %s shaped like upstream %d: take %s back: %w", schema, u, m.File, err)
				}
			}
		}
		if _, err := r.DB().ExecContext(ctx, "DROP TABLE "+pgx.Identifier{schema, migrate.VersionTable}.Sanitize()); err != nil {
			return fmt.Errorf("schema %s shaped like upstream %d: drop goose's table: %w", schema, u, err)
		}
		return nil
	}
}

// Load is one measurement.
type Load struct {
	Start Start
	// To is the version `migrate up` takes the schema to.
	To int64
	// Messages are queued in orchestrator_queue before the writers start,
	// spread over Instances instances; WorkItems in worker_queue, one
	// activity each of those instances' (one in ten with a session).
	Messages, WorkItems, Instances int
	// Rate is each writer's writes per second.
	Rate int
	// Lead is how long the writers run alone before the migration starts,
	// and again after it ends.
	Lead time.Duration
}

// Queues are the two queues a Load writes, each by its writer, in the
// order of Report.Writers.
var Queues = []string{"orchestrator_queue", "worker_queue"}

// Report is what a Load measured.
type Report struct {
	Start     string `json:"start"`
	To        int64  `json:"to"`
	Messages  int    `json:"messages"`
	WorkItems int    `json:"work_items"`
	Instances int    `json:"instances"`
	Rate      int    `json:"rate_per_s"`
	// MigrateMs is the wall time of `migrate up`.
	MigrateMs float64 `json:"migrate_ms"`
	// Writers are the writers' figures, one per queue (Queues' order).
	Writers []Writer `json:"writers"`
}

// Writer is what one writer measured.
type Writer struct {
	// Queue is the queue it writes, Function what it calls.
	Queue    string `json:"queue"`
	Function string `json:"function"`
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

// Writer returns the figures of the writer of queue (nil when none).
func (r *Report) Writer(queue string) *Writer {
	for i := range r.Writers {
		if r.Writers[i].Queue == queue {
			return &r.Writers[i]
		}
	}
	return nil
}

// Validate refuses sizes that cannot be measured (Run also needs a
// start state).
func (l Load) Validate() error {
	switch {
	case l.To < 1:
		return fmt.Errorf("migrateload: target version %d", l.To)
	case l.Messages < 0 || l.WorkItems < 0 || l.Instances < 1:
		return fmt.Errorf("migrateload: %d messages and %d work items over %d instances: need at least one instance, and no negative count", l.Messages, l.WorkItems, l.Instances)
	case l.Rate < 1 || l.Rate > 10_000:
		return fmt.Errorf("migrateload: rate %d/s: between 1 and 10000", l.Rate)
	case l.Lead <= 0:
		return fmt.Errorf("migrateload: lead %v: must be positive", l.Lead)
	}
	return nil
}

// workItem is what every message and work item of the load carries.
const workItem = `{"ExternalRaised":{"instance":"x","name":"go","data":"1"}}`

// writer is one writer's loop: its queue, the call it makes, and what it
// recorded.
type writer struct {
	rep       Writer
	call      func(ctx context.Context, conn *pgx.Conn, i int) error
	latencies []float64
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
	if err := backlog(ctx, src, schema, l); err != nil {
		return nil, fmt.Errorf("migrateload: backlog: %w", err)
	}

	enqueueOrch := fmt.Sprintf("SELECT %s($1, $2, now())", pgx.Identifier{schema, "enqueue_orchestrator_work"}.Sanitize())
	enqueueWork := fmt.Sprintf("SELECT %s($1, (extract(epoch FROM clock_timestamp()) * 1000)::bigint, $2, 1, $3)", pgx.Identifier{schema, "enqueue_worker_work"}.Sanitize())
	writers := []*writer{
		{rep: Writer{Queue: Queues[0], Function: "enqueue_orchestrator_work"}, call: func(ctx context.Context, conn *pgx.Conn, i int) error {
			_, err := conn.Exec(ctx, enqueueOrch, fmt.Sprintf("load-w-%d", i%l.Instances), workItem)
			return err
		}},
		{rep: Writer{Queue: Queues[1], Function: "enqueue_worker_work"}, call: func(ctx context.Context, conn *pgx.Conn, i int) error {
			_, err := conn.Exec(ctx, enqueueWork, workItem, fmt.Sprintf("load-w-%d", i%l.Instances), int64(i))
			return err
		}},
	}
	var conns []*pgx.Conn
	defer func() {
		for _, c := range conns {
			c.Close(context.WithoutCancel(ctx))
		}
	}()
	for _, w := range writers {
		c, err := src.Connect(ctx)
		if err != nil {
			return nil, fmt.Errorf("migrateload: writer of %s: %w", w.rep.Queue, err)
		}
		conns = append(conns, c)
	}

	var (
		mu          sync.Mutex
		migrateFrom time.Time
		migrateTo   time.Time
		stop        = make(chan struct{})
		wg          sync.WaitGroup
		stopOnce    sync.Once
	)
	end := func() { stopOnce.Do(func() { close(stop) }) }
	defer func() { end(); wg.Wait() }()
	period := time.Second / time.Duration(l.Rate)
	start := time.Now()
	for n, w := range writers {
		wg.Add(1)
		go func(w *writer, conn *pgx.Conn) {
			defer wg.Done()
			for i := 0; ; i++ {
				// The writers take turns: each is due half a period after
				// the other.
				due := start.Add(time.Duration(i)*period + time.Duration(n)*period/time.Duration(len(writers)))
				// A write once started runs to its end: the caller counts
				// the queue against the writes.
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				case <-time.After(time.Until(due)):
				}
				err := w.call(ctx, conn, i)
				ms := float64(time.Since(due).Microseconds()) / 1000
				mu.Lock()
				w.rep.Writes++
				w.latencies = append(w.latencies, ms)
				if err != nil {
					w.rep.Failed++
					if w.rep.FirstError == "" {
						w.rep.FirstError = err.Error()
					}
				}
				if !migrateFrom.IsZero() && !due.Before(migrateFrom) && (migrateTo.IsZero() || due.Before(migrateTo)) {
					w.rep.DuringMaxMs = math.Max(w.rep.DuringMaxMs, ms)
				}
				mu.Unlock()
			}
		}(w, conns[n])
	}

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
	mu.Unlock()
	if migErr == nil {
		migErr = sleep(l.Lead)
	}
	end()
	wg.Wait()
	if migErr != nil {
		return nil, fmt.Errorf("migrateload: migrate up from %s to %d: %w", l.Start.Name, l.To, migErr)
	}
	rep := &Report{Start: l.Start.Name, To: l.To, Messages: l.Messages, WorkItems: l.WorkItems, Instances: l.Instances, Rate: l.Rate,
		MigrateMs: float64(migrateTo.Sub(migrateFrom).Microseconds()) / 1000}
	for _, w := range writers {
		if w.rep.Writes == 0 {
			return nil, fmt.Errorf("migrateload: the writer of %s made no write", w.rep.Queue)
		}
		slices.Sort(w.latencies)
		w.rep.MaxMs = w.latencies[len(w.latencies)-1]
		w.rep.P99Ms = quantile(w.latencies, 0.99)
		w.rep.P50Ms = quantile(w.latencies, 0.50)
		rep.Writers = append(rep.Writers, w.rep)
	}
	return rep, nil
}

// backlog queues l's messages and work items into schema, then analyzes
// both queues.
func backlog(ctx context.Context, src *dbconn.Source, schema string, l Load) error {
	conn, err := src.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	orch := pgx.Identifier{schema, "orchestrator_queue"}.Sanitize()
	work := pgx.Identifier{schema, "worker_queue"}.Sanitize()
	for _, stmt := range []string{
		fmt.Sprintf(`INSERT INTO %s (instance_id, work_item, visible_at, created_at)
			SELECT 'load-' || (g %% %d), '%s', now(), now()
			FROM generate_series(1, %d) g`, orch, l.Instances, workItem, l.Messages),
		fmt.Sprintf(`INSERT INTO %s (work_item, visible_at, created_at, instance_id, execution_id, activity_id, session_id)
			SELECT '%s', now(), now(), 'load-' || (g %% %d), 1, g, CASE WHEN g %% 10 = 0 THEN 'session-' || (g %% %d) END
			FROM generate_series(1, %d) g`, work, workItem, l.Instances, l.Instances, l.WorkItems),
		"ANALYZE " + orch,
		"ANALYZE " + work,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

// quantile of sorted (nearest rank).
func quantile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// String is the report in one line.
func (r *Report) String() string {
	s := fmt.Sprintf("migrate up from %s to %d with %d messages over %d instances and %d work items, a writer on each queue at %d/s: migrate %.0f ms",
		r.Start, r.To, r.Messages, r.Instances, r.WorkItems, r.Rate, r.MigrateMs)
	for _, w := range r.Writers {
		s += fmt.Sprintf("; %s: %d writes, %d failed, latency from its due time max %.1f ms (max %.1f ms while migrating), p99 %.1f ms, p50 %.1f ms",
			w.Queue, w.Writes, w.Failed, w.MaxMs, w.DuringMaxMs, w.P99Ms, w.P50Ms)
	}
	return s
}

// headsTable is the object whose migration builds the queue heads (an
// index and a backfill over the whole queue).
const headsTable = "table orchestrator_queue_heads"

// Starts are the start states a DBA migrates from, read from sql/, each
// adopted or built as the DBA's would be:
//   - upstream 1..21, baselined: the duroxide-pg releases before upstream
//     23, whose full queue indexes the port of 23 makes partial on the way
//     (made by duroxide-pg's runner, its 23 taken back: Upstream21; by
//     the pack's ports when made is nil: PackShaped);
//   - upstream 1..21 and 23, made by duroxide-pg's runner, baselined (only
//     when made is not nil);
//   - upstream 19's catalog as the pack's ports build it (what a database
//     of duroxide-pg 0.1.26 or earlier is);
//   - the pack just before the migration that builds the queue heads.
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
		out = append(out,
			Baselined("upstream 1..21 (duroxide-pg's runner, its 23 taken back), baselined", Upstream21(made)),
			Baselined("upstream 1..21 and 23 (duroxide-pg's runner), baselined", made))
	} else {
		out = append(out, Baselined("upstream 1..21 (the pack's ports, shaped like upstream 21), baselined", PackShaped(21)))
	}
	return append(out,
		PackAt(fmt.Sprintf("upstream 19's catalog (goose %d)", packfacts.LastContiguousPort()), packfacts.LastContiguousPort()),
		PackAt(fmt.Sprintf("the pack at %d, before its queue heads", heads-1), heads-1),
	), nil
}

// FullSizes are the backlogs `make bench` measures, each from every start
// state: N messages in orchestrator_queue and N work items in
// worker_queue. The longest write must not grow from one to the next.
var FullSizes = []int{100_000, 1_000_000}

// MessagesPerInstance is how many messages of the backlog each instance
// holds in the load `make bench` measures.
const MessagesPerInstance = 10

// Full is the load `make bench` measures at its largest size, without its
// start and target: 1,000,000 messages over 100,000 instances, 1,000,000
// work items, and a writer on each queue, 50 writes a second each.
func Full() Load {
	return Sized(FullSizes[len(FullSizes)-1], MessagesPerInstance, 50)
}

// Sized is the load of n messages and n work items over n/perInstance
// instances (at least one), a writer on each queue at rate writes a
// second.
func Sized(n, perInstance, rate int) Load {
	return Load{Messages: n, WorkItems: n, Instances: max(1, n/max(1, perInstance)), Rate: rate, Lead: 2 * time.Second}
}
