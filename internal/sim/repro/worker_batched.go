package repro

// The batched worker fetch's stale timestamp: upstream's fetch_work_items
// (a branch migration no release carries yet; our port, applied as its
// runner applies a file) leases from p_now_ms + timeout, the seed's defect
// on the worker side; the pack's fix of it (0033, bounded by 0035) fixes it
// where duroxide-pg's runner added the function. One column per schema:
// upstream's batched fetch on a schema the real provider made, and the same
// fetch after the pack adopted that schema and one migrate up put the
// pack's latest fix of it in.

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/baseline"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/worker"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// WorkerBatchedResults are the batched fetch's stale fetches: upstream's
// first, then the pack's.
type WorkerBatchedResults []StaleFetch

// OK is the verdict: upstream's batched fetch returns a lease dead at
// return and its ack is refused; after migrate up the lease is whole and
// the ack passes.
func (r WorkerBatchedResults) OK() bool {
	return len(r) == 2 && r[0].Bug() && r[1].Fixed()
}

// WorkerBatchedRepro makes both schemas in src's database and runs the
// stale batched fetch on each.
func WorkerBatchedRepro(ctx context.Context, src *dbconn.Source, p *upstream.Provider) (WorkerBatchedResults, error) {
	if p == nil {
		return nil, fmt.Errorf("worker batched repro: needs the real duroxide-pg provider (%s)", upstream.AddonPackage)
	}
	db := stdlib.OpenDB(*src.Config())
	defer db.Close()
	file := upstream.InFlightBatchedFetch
	made := "real provider " + upstream.AddonPackage + " (upstream 1..21, 23)"
	var out WorkerBatchedResults
	for _, side := range []struct {
		key, schema, made string
		adopt             bool
	}{
		{SideUpstream, "worker_batched_upstream", made + ", then upstream's branch " + file + " (port)", false},
		{SidePack, "worker_batched_pack", made + ", adopted at the pack's latest, then " + file + " (port), then migrate up", true},
	} {
		if err := p.Migrate(ctx, src, side.schema); err != nil {
			return out, fmt.Errorf("worker batched repro: %w", err)
		}
		if side.adopt {
			if err := adoptAtLatest(ctx, db, src, side.schema); err != nil {
				return out, fmt.Errorf("worker batched repro: %w", err)
			}
		}
		if err := upstream.ApplyInFlight(ctx, src, side.schema, file); err != nil {
			return out, fmt.Errorf("worker batched repro: %w", err)
		}
		if side.adopt {
			if err := migrate.To(ctx, src.Config(), side.schema, migrations.Latest()); err != nil {
				return out, fmt.Errorf("worker batched repro: migrate up: %w", err)
			}
		}
		res, err := StaleBatchedFetch(ctx, src, side.schema)
		if err != nil {
			return out, fmt.Errorf("worker batched repro, %s: %w", side.key, err)
		}
		res.Side, res.Made = side.key, side.made
		out = append(out, res)
	}
	return out, nil
}

// adoptAtLatest runs baseline, then migrate up to the pack's latest, on
// schema.
func adoptAtLatest(ctx context.Context, db *sql.DB, src *dbconn.Source, schema string) error {
	if _, err := baseline.Run(ctx, db, baseline.Options{Schema: schema}); err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	return migrate.To(ctx, src.Config(), schema, migrations.Latest())
}

// StaleBatchedFetch is the stale fetch of WorkerMinimal through
// fetch_work_items: one visible item, fetched (a batch of one) with p_now_ms
// 10 s behind the database clock and a 5 s lock timeout, its lease read
// against the database clock at return, then ack_worker with a current
// p_now_ms.
func StaleBatchedFetch(ctx context.Context, src *dbconn.Source, schema string) (StaleFetch, error) {
	cfg := WorkerMinimalConfig{}
	cfg.defaults()
	res := StaleFetch{Schema: schema, StaleMs: cfg.StaleMs, LockTimeoutMs: cfg.LockTimeoutMs}
	conn, err := src.Connect(ctx)
	if err != nil {
		return res, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	c, now, err := freshWorkerQueue(ctx, conn, schema)
	if err != nil {
		return res, err
	}
	if err := c.Enqueue(ctx, conn, worker.Item{ID: "stale-batch-1", Instance: "repro-worker-batched", ActivityID: 1}, now-cfg.StaleMs-60_000); err != nil {
		return res, err
	}
	if now, err = dbNowMs(ctx, conn); err != nil {
		return res, err
	}
	var token *string
	var dbReturn int64
	err = conn.QueryRow(ctx, "SELECT f.out_lock_token, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint "+
		"FROM (SELECT 1) AS one LEFT JOIN LATERAL "+pgx.Identifier{schema, "fetch_work_items"}.Sanitize()+
		"($1, $2, NULL, NULL, NULL, 'default_only', 1, 0) AS f ON true", now-cfg.StaleMs, cfg.LockTimeoutMs).Scan(&token, &dbReturn)
	if err != nil {
		return res, fmt.Errorf("fetch_work_items: %w", err)
	}
	if token == nil {
		return res, nil
	}
	res.Fetched = true
	lease, err := c.ReadLease(ctx, conn, *token)
	if err != nil {
		return res, err
	}
	res.RemainingMs = lease.LockedUntilMs - dbReturn
	if now, err = dbNowMs(ctx, conn); err != nil {
		return res, err
	}
	if err := c.Ack(ctx, conn, *token, "", "", now); err != nil {
		if !worker.IsNotFound(err) {
			return res, err
		}
		res.AckError = "Worker queue item not found or already processed"
	} else {
		res.AckOK = true
	}
	return res, nil
}

// PrintWorkerBatched writes the batched fetch's stale fetches side by side,
// and the verdict.
func PrintWorkerBatched(w io.Writer, r WorkerBatchedResults) error {
	if len(r) == 0 {
		return nil
	}
	fmt.Fprintf(w, "worker batched repro: fetch_work_items (upstream's batched worker fetch, on a branch; our port applied as its runner applies a file) with p_now_ms %d ms stale and a %d ms lock timeout, then ack_worker\n\n",
		r[0].StaleMs, r[0].LockTimeoutMs)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	for _, row := range workerBatchedRows(r) {
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range r {
		fmt.Fprintf(w, "  %s: %s\n", s.Side, s.Made)
	}
	verdict := WorkerBatchedVerdict()
	if !r.OK() {
		verdict = "NOT SHOWN: " + verdict
	}
	_, err := fmt.Fprintf(w, "\nverdict: %s\n", verdict)
	return err
}

func workerBatchedRows(r WorkerBatchedResults) [][]string {
	header := []string{""}
	for _, s := range r {
		header = append(header, s.Side)
	}
	return append([][]string{header}, rowsOf(r, []rowDef[StaleFetch]{
		{"row returned", func(s StaleFetch) string { return fmt.Sprint(s.Fetched) }},
		{"remaining lease at return (ms, db clock)", func(s StaleFetch) string { return fmt.Sprintf("%+d", s.RemainingMs) }},
		{"ack_worker with the returned token", func(s StaleFetch) string { return s.ack("refused") }},
	})...)
}

// workerBatchedMarkdown renders r as a Markdown section.
func workerBatchedMarkdown(r WorkerBatchedResults) string {
	var b strings.Builder
	b.WriteString("## The batched worker fetch with a stale p_now_ms (worker-minimal repro)\n\n```\n")
	_ = PrintWorkerBatched(&b, r)
	b.WriteString("```\n")
	return b.String()
}

// WorkerBatchedVerdict is the verdict line when the repro shows what it
// should, naming the pack's latest fix of upstream's batched fetch (read
// from sql/: the fix that migrate up installs for its behaviour).
func WorkerBatchedVerdict() string {
	// The branch file's number is the behaviour its guard rows name.
	behaviour, err := strconv.ParseInt(strings.SplitN(upstream.InFlightBatchedFetch, "_", 2)[0], 10, 64)
	fix, _, ok := migrations.FixFor("fetch_work_items", behaviour, migrations.Latest())
	if err != nil || !ok {
		return "upstream's batched fetch shows the bug; the pack has no fix of it"
	}
	return fmt.Sprintf("upstream's batched fetch shows the bug; after migrate up (%04d) it is fixed", fix.Version)
}
