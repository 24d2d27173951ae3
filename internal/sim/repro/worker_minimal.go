package repro

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/worker"
)

// WorkerMinimalConfig is the worker minimal repro's input.
type WorkerMinimalConfig struct {
	// StaleMs is how far behind the database clock the stale fetch's
	// p_now_ms is (default 10 s).
	StaleMs int64
	// LockTimeoutMs is the lock timeout of both fetches (default 5000).
	LockTimeoutMs int64
	// Hold is how long the session row stays locked once the fetch was seen
	// waiting on it (default 2 s).
	Hold time.Duration
}

func (c *WorkerMinimalConfig) defaults() {
	if c.StaleMs == 0 {
		c.StaleMs = 10_000
	}
	if c.LockTimeoutMs == 0 {
		c.LockTimeoutMs = 5_000
	}
	if c.Hold == 0 {
		c.Hold = 2 * time.Second
	}
}

// WorkerMinimalResult is what one schema did in the two worker scenarios.
type WorkerMinimalResult struct {
	// StaleFetch is the stale fetch: fetch_work_item with a stale p_now_ms,
	// then ack_worker with a current one.
	StaleFetch
	// The blocked session fetch: another transaction holds the row of the
	// fetcher's own session s1 (an uncommitted renew_session_lock) for
	// HoldMs once the fetch is seen waiting on it. Blocked: seen waiting on
	// a lock in pg_stat_activity; BlockedMs from the wait's start
	// (pg_locks.waitstart) to the function's return; CallMs the whole call;
	// Returned the session of the item it returned ("s1", "s2", or "none").
	HoldMs    int64  `json:"hold_ms"`
	Blocked   bool   `json:"blocked"`
	BlockedMs int64  `json:"blocked_ms"`
	CallMs    int64  `json:"call_ms"`
	Returned  string `json:"returned"`
}

// StaleBug: the lease was dead at return and the ack refused.
func (r WorkerMinimalResult) StaleBug() bool { return r.StaleFetch.Bug() }

// StaleFixed: a whole lease at return (the timeout minus 100 ms at least)
// and the ack succeeded.
func (r WorkerMinimalResult) StaleFixed() bool { return r.StaleFetch.Fixed() }

// BlockBug: the fetch waited on the session row, for at least half the
// hold.
func (r WorkerMinimalResult) BlockBug() bool { return r.Blocked && r.BlockedMs >= r.HoldMs/2 }

// BlockFixed: the fetch never waited, returned well within the hold, and
// returned the other session's item or nothing.
func (r WorkerMinimalResult) BlockFixed() bool {
	return !r.Blocked && r.CallMs < r.HoldMs/2 && (r.Returned == "s2" || r.Returned == "none")
}

// Bug reports both symptoms of the versions before the fix.
func (r WorkerMinimalResult) Bug() bool { return r.StaleBug() && r.BlockBug() }

// Fixed reports the fixed behaviour in both scenarios.
func (r WorkerMinimalResult) Fixed() bool { return r.StaleFixed() && r.BlockFixed() }

// WorkerMinimal runs both worker scenarios on schema (at version), in the
// database of src, emptying its worker queue and sessions first:
//
//   - the stale fetch: one visible item, fetch_work_item with p_now_ms
//     StaleMs behind the database clock, the lease read against the
//     database clock at return, then ack_worker(token, NULL, NULL, now)
//     with a current now, as the provider acks a cancelled activity;
//   - the blocked session fetch: items s1, s1, s2 (in that order); owner w2
//     fetches the first (creating session s1), another connection runs
//     renew_session_lock for w2 in a transaction it keeps open (holding the
//     s1 row), and w2 fetches again. The fetch is watched in
//     pg_stat_activity; once it is seen waiting on a lock, the holder
//     commits after Hold.
func WorkerMinimal(ctx context.Context, src *dbconn.Source, schema string, version int64, cfg WorkerMinimalConfig) (WorkerMinimalResult, error) {
	cfg.defaults()
	res := WorkerMinimalResult{HoldMs: cfg.Hold.Milliseconds(),
		StaleFetch: StaleFetch{Schema: schema, Version: version, StaleMs: cfg.StaleMs, LockTimeoutMs: cfg.LockTimeoutMs}}
	conn, err := src.Connect(ctx)
	if err != nil {
		return res, fmt.Errorf("worker minimal: %w", err)
	}
	defer conn.Close(context.Background())
	if err := workerStale(ctx, conn, schema, cfg, &res); err != nil {
		return res, fmt.Errorf("worker minimal v%d, stale fetch: %w", version, err)
	}
	if err := workerBlocked(ctx, conn, src, schema, cfg, &res); err != nil {
		return res, fmt.Errorf("worker minimal v%d, blocked session fetch: %w", version, err)
	}
	return res, nil
}

// freshWorkerQueue empties the worker queue and sessions of schema and
// returns a client of it and the database clock.
func freshWorkerQueue(ctx context.Context, conn *pgx.Conn, schema string) (worker.Client, int64, error) {
	_, err := conn.Exec(ctx, "TRUNCATE "+pgx.Identifier{schema, "worker_queue"}.Sanitize()+", "+
		pgx.Identifier{schema, "sessions"}.Sanitize())
	if err != nil {
		return worker.Client{}, 0, err
	}
	now, err := dbNowMs(ctx, conn)
	return worker.NewClient(schema), now, err
}

func dbNowMs(ctx context.Context, conn *pgx.Conn) (int64, error) {
	var ms int64
	err := conn.QueryRow(ctx, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint").Scan(&ms)
	return ms, err
}

func workerStale(ctx context.Context, conn *pgx.Conn, schema string, cfg WorkerMinimalConfig, res *WorkerMinimalResult) error {
	c, now, err := freshWorkerQueue(ctx, conn, schema)
	if err != nil {
		return err
	}
	it := worker.Item{ID: "stale-1", Instance: "repro-worker-minimal", ActivityID: 1}
	// Visible well before the stale timestamp, so both versions see it.
	if err := c.Enqueue(ctx, conn, it, now-cfg.StaleMs-60_000); err != nil {
		return err
	}
	if now, err = dbNowMs(ctx, conn); err != nil {
		return err
	}
	f, _, err := c.Fetch(ctx, conn, now-cfg.StaleMs, cfg.LockTimeoutMs, nil, worker.Filter{Mode: worker.ModeDefaultOnly})
	if err != nil || f == nil {
		return err
	}
	res.Fetched = true
	lease, err := c.ReadLease(ctx, conn, f.LockToken)
	if err != nil {
		return err
	}
	res.RemainingMs = lease.LockedUntilMs - f.DBReturnMs
	if now, err = dbNowMs(ctx, conn); err != nil {
		return err
	}
	if err := c.Ack(ctx, conn, f.LockToken, "", "", now); err != nil {
		if !worker.IsNotFound(err) {
			return err
		}
		res.AckError = "Worker queue item not found or already processed"
	} else {
		res.AckOK = true
	}
	return nil
}

func workerBlocked(ctx context.Context, conn *pgx.Conn, src *dbconn.Source, schema string, cfg WorkerMinimalConfig, res *WorkerMinimalResult) error {
	c, now, err := freshWorkerQueue(ctx, conn, schema)
	if err != nil {
		return err
	}
	for i, s := range []string{"s1", "s1", "s2"} {
		it := worker.Item{ID: fmt.Sprintf("block-%d", i+1), Instance: "repro-worker-minimal", ActivityID: int64(i + 1), SessionID: s}
		if err := c.Enqueue(ctx, conn, it, now-60_000); err != nil {
			return err
		}
	}
	session := &worker.Session{OwnerID: "w2", LockTimeoutMs: 60_000}
	filter := worker.Filter{Mode: worker.ModeDefaultOnly}
	if now, err = dbNowMs(ctx, conn); err != nil {
		return err
	}
	first, _, err := c.Fetch(ctx, conn, now, cfg.LockTimeoutMs, session, filter)
	if err != nil {
		return err
	}
	if first == nil || first.Item.SessionID != "s1" {
		return errors.New("the first fetch did not return the first item of session s1")
	}

	holder, err := src.Connect(ctx)
	if err != nil {
		return err
	}
	defer holder.Close(context.Background())
	tx, err := holder.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	renewed, err := c.RenewSessions(ctx, tx, []string{"w2"}, now, 60_000, 60_000)
	if err != nil {
		return err
	}
	if renewed != 1 {
		return fmt.Errorf("the holder's renew_session_lock renewed %d sessions, want 1 (s1)", renewed)
	}

	fetcher, err := src.Connect(ctx)
	if err != nil {
		return err
	}
	defer fetcher.Close(context.Background())
	type outcome struct {
		f   *worker.Fetched
		db  int64
		lat time.Duration
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		start := time.Now()
		f, db, err := c.Fetch(ctx, fetcher, time.Now().UnixMilli(), cfg.LockTimeoutMs, session, filter)
		done <- outcome{f, db, time.Since(start), err}
	}()

	// Watch the fetch: seen waiting on a lock, or done.
	var got outcome
	var waitStart int64
	finished := false
	deadline := time.Now().Add(30 * time.Second)
	for !finished && !res.Blocked {
		select {
		case got = <-done:
			finished = true
			continue
		default:
		}
		if time.Now().After(deadline) {
			return errors.New("the fetch neither returned nor waited on a lock within 30 s")
		}
		err := conn.QueryRow(ctx, `SELECT floor(extract(epoch FROM coalesce(min(l.waitstart), clock_timestamp())) * 1000)::bigint
FROM pg_stat_activity a LEFT JOIN pg_locks l ON l.pid = a.pid AND NOT l.granted
WHERE a.pid = $1 AND a.wait_event_type = 'Lock' AND a.wait_event IN ('transactionid', 'tuple')
GROUP BY a.pid`, fetcher.PgConn().PID()).Scan(&waitStart)
		switch {
		case err == nil:
			res.Blocked = true
		case !errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("watch the fetch: %w", err)
		default:
			time.Sleep(5 * time.Millisecond)
		}
	}
	if res.Blocked {
		// The fetch is waiting on the held row: keep holding it for a while,
		// then let it go (the hold's length is not what is measured).
		select {
		case <-time.After(cfg.Hold):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	if !finished {
		got = <-done
	}
	if got.err != nil {
		return got.err
	}
	res.CallMs = got.lat.Milliseconds()
	if res.Blocked {
		res.BlockedMs = got.db - waitStart
	}
	res.Returned = "none"
	if got.f != nil {
		res.Returned = got.f.Item.SessionID
	}
	return nil
}

// WorkerMinimalRepro migrates a schema worker_minimal_vN to N for each of
// versions in the database of src, and runs WorkerMinimal on each, in
// order.
func WorkerMinimalRepro(ctx context.Context, src *dbconn.Source, versions []int64) (WorkerMinimalResults, error) {
	return atEach(versions, "worker minimal repro", func(v int64) (WorkerMinimalResult, error) {
		schema := fmt.Sprintf("worker_minimal_v%d", v)
		if err := migrate.To(ctx, src.Config(), schema, v); err != nil {
			return WorkerMinimalResult{}, err
		}
		return WorkerMinimal(ctx, src, schema, v, WorkerMinimalConfig{})
	})
}

// WorkerMinimalResults are the worker minimal repro's results, one per
// version.
type WorkerMinimalResults []WorkerMinimalResult

// OK is the worker minimal repro's verdict: the first result shows both
// symptoms and the second neither.
func (results WorkerMinimalResults) OK() bool { return pairVerdict(results) }

// PrintWorkerMinimal writes the worker minimal repro's results side by
// side, with its settings and its verdict.
func PrintWorkerMinimal(w io.Writer, results WorkerMinimalResults) error {
	if len(results) == 0 {
		return nil
	}
	fmt.Fprintf(w, "worker minimal repro: fetch_work_item with p_now_ms %d ms stale and a %d ms lock timeout, then ack_worker; "+
		"a session fetch while another transaction holds the session's row (%d ms)\n\n",
		results[0].StaleMs, results[0].LockTimeoutMs, results[0].HoldMs)
	return printPair(w, results, workerMinimalRows(results))
}

// WorkerMinimalMarkdown renders the worker minimal repro as a Markdown
// section.
func WorkerMinimalMarkdown(results []WorkerMinimalResult) string {
	if len(results) == 0 {
		return ""
	}
	var b strings.Builder
	r0 := results[0]
	b.WriteString("## Worker minimal scenarios: a stale p_now_ms, a session row held by another transaction\n\n")
	fmt.Fprintf(&b, "Stale fetch: one visible item; fetch_work_item with p_now_ms %d ms behind the database clock and a %d ms lock timeout; "+
		"remaining lease by the database clock at return; then ack_worker with a current p_now_ms. "+
		"Blocked session fetch: items of sessions s1, s1, s2; owner w2 fetches the first, another transaction holds session s1's row "+
		"(an uncommitted renew_session_lock) for %d ms once w2's next fetch is seen waiting on it.\n\n",
		r0.StaleMs, r0.LockTimeoutMs, r0.HoldMs)
	rows := workerMinimalRows(results)
	writeMarkdownTable(&b, rows[0], rows[1:])
	return b.String()
}

// workerMinimalRows are the side-by-side rows: a header, then label and one
// cell per version.
func workerMinimalRows(results []WorkerMinimalResult) [][]string {
	return append([][]string{versionHeader(results)}, rowsOf(results, []rowDef[WorkerMinimalResult]{
		{"stale fetch: row returned", func(r WorkerMinimalResult) string { return fmt.Sprint(r.Fetched) }},
		{"remaining lease at return (ms, db clock)", func(r WorkerMinimalResult) string { return fmt.Sprintf("%+d", r.RemainingMs) }},
		{"ack_worker with the returned token", func(r WorkerMinimalResult) string { return r.ack("refused") }},
		{"blocked fetch: waited on the session row", func(r WorkerMinimalResult) string {
			if r.Blocked {
				return fmt.Sprintf("yes, %d ms", r.BlockedMs)
			}
			return "no"
		}},
		{"call duration (ms)", func(r WorkerMinimalResult) string { return fmt.Sprint(r.CallMs) }},
		{"item returned (session)", func(r WorkerMinimalResult) string { return r.Returned }},
	})...)
}
