// Package faults runs simulated orchestration dispatchers against a
// duroxide-pg schema while injecting faults, and checks the invariants of
// package invariant on the run's log.
//
// The dispatchers follow package dispatch's loop (fetch with the caller's
// clock and the runtime's version filter, a turn that appends the received
// events and enqueues the instance's next message in its ack, poison past
// max_attempts, a fail_ack after a refused ack) and record the same
// dispatch.Event log, but drive package orch directly, because dispatch has
// no hook to lose its connection or to crash a dispatcher. Differences from
// dispatch: a dispatcher whose connection is lost reconnects (with backoff);
// an ack whose connection was lost is retried on the new connection (the
// provider classifies I/O errors as retryable) and its outcome is recorded
// as unknown (invariant.OutcomeUnknownPrefix); there is no lock renewal
// (the scenarios keep turns well inside the lock timeout, and the runtime's
// first renewal comes at 1 s, after any sub-second lease expired anyway).
//
// Faults (Config): backends terminated with pg_terminate_backend while a
// fetch or an ack runs, dispatchers that crash after a fetch (they drop the
// lease, disconnect and come back), low statement_timeout and lock_timeout
// on the dispatcher sessions, server restarts, and per-dispatcher clock
// skew.
package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/duroxide-pg/migrations/harness/sim/dispatch"
	"github.com/duroxide-pg/migrations/harness/sim/invariant"
	"github.com/duroxide-pg/migrations/harness/sim/orch"
)

// Config describes one run. Zero fields take the defaults of WithDefaults.
type Config struct {
	// Schema holds the duroxide-pg objects (required). Run EMPTIES its
	// orchestration tables (dispatch.Seed).
	Schema string `json:"schema"`
	// Dispatchers (default 4), Instances (default 3), each seeded with
	// HistoryEvents events (default 20) of about EventBytes bytes (100).
	Dispatchers   int `json:"dispatchers"`
	Instances     int `json:"instances"`
	HistoryEvents int `json:"history_events"`
	EventBytes    int `json:"event_bytes"`
	// LockTimeout is the runtime's orchestrator lock timeout (default 500
	// ms); TurnTime how long a turn runs between fetch and ack (default 0);
	// PollInterval the idle poll interval (default 25 ms); Duration the run
	// (default 3 s); MaxAttempts the runtime's max_attempts (default 10).
	LockTimeout  time.Duration `json:"lock_timeout_ns"`
	TurnTime     time.Duration `json:"turn_time_ns"`
	PollInterval time.Duration `json:"poll_interval_ns"`
	Duration     time.Duration `json:"duration_ns"`
	MaxAttempts  int           `json:"max_attempts"`
	// Skews is each dispatcher's clock offset (dispatcher i gets Skews[i];
	// missing entries are 0).
	Skews []time.Duration `json:"skews_ns,omitempty"`
	// KillEvery is the mean interval between pg_terminate_backend attempts
	// (0: none); each picks, at random, a dispatcher that is fetching or one
	// that is acking, and kills its backend while the call runs.
	KillEvery time.Duration `json:"kill_every_ns,omitempty"`
	// CrashProb is the probability that a dispatcher crashes right after a
	// fetch that returned a row: it never acks, drops its connection and
	// comes back after CrashPause (default 50 ms).
	CrashProb  float64       `json:"crash_prob,omitempty"`
	CrashPause time.Duration `json:"crash_pause_ns,omitempty"`
	// StatementTimeout and SessionLockTimeout are set on every dispatcher
	// session (0: server default).
	StatementTimeout   time.Duration `json:"statement_timeout_ns,omitempty"`
	SessionLockTimeout time.Duration `json:"session_lock_timeout_ns,omitempty"`
	// Restarts is how many times the server is restarted, evenly spread
	// over the run, with Restart (required when Restarts > 0).
	Restarts int                             `json:"restarts,omitempty"`
	Restart  func(ctx context.Context) error `json:"-"`
	// RandSeed seeds the fault schedule (0: from the clock).
	RandSeed uint64 `json:"rand_seed,omitempty"`
	// ConnectDSN, when not empty, is what the dispatchers connect with
	// instead of Run's DSN (for example through PgBouncer); seeding and the
	// checks keep Run's DSN.
	ConnectDSN string `json:"-"`
}

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	def := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	defD := func(p *time.Duration, v time.Duration) {
		if *p <= 0 {
			*p = v
		}
	}
	def(&c.Dispatchers, 4)
	def(&c.Instances, 3)
	def(&c.HistoryEvents, 20)
	def(&c.EventBytes, 100)
	def(&c.MaxAttempts, dispatch.DefaultMaxAttempts)
	defD(&c.LockTimeout, 500*time.Millisecond)
	defD(&c.PollInterval, 25*time.Millisecond)
	defD(&c.Duration, 3*time.Second)
	defD(&c.CrashPause, 50*time.Millisecond)
	if c.RandSeed == 0 {
		c.RandSeed = uint64(time.Now().UnixNano())
	}
	return c
}

// Validate rejects a config that cannot run.
func (c Config) Validate() error {
	switch {
	case c.Schema == "":
		return errors.New("faults: Config.Schema is empty")
	case c.LockTimeout < time.Millisecond:
		return fmt.Errorf("faults: LockTimeout %v is under 1 ms", c.LockTimeout)
	case c.TurnTime < 0 || c.KillEvery < 0 || c.StatementTimeout < 0 || c.SessionLockTimeout < 0:
		return errors.New("faults: durations must not be negative")
	case c.CrashProb < 0 || c.CrashProb > 1:
		return fmt.Errorf("faults: CrashProb %v is not in [0, 1]", c.CrashProb)
	case c.Restarts > 0 && c.Restart == nil:
		return errors.New("faults: Restarts needs Restart")
	}
	return nil
}

// SkewFor is dispatcher i's (0-based) clock offset.
func (c Config) SkewFor(i int) time.Duration {
	if i < len(c.Skews) {
		return c.Skews[i]
	}
	return 0
}

// Counts are the faults injected and what they caused.
type Counts struct {
	// KillsInjected counts pg_terminate_backend calls that terminated a
	// backend, KillsMidFetch / KillsMidAck those sent while that dispatcher
	// was inside a fetch / an ack.
	KillsInjected int64 `json:"kills_injected"`
	KillsMidFetch int64 `json:"kills_mid_fetch"`
	KillsMidAck   int64 `json:"kills_mid_ack"`
	// Crashes counts dispatchers that crashed after a fetch.
	Crashes int64 `json:"crashes"`
	// Timeouts counts calls cancelled by statement_timeout (57014) or
	// lock_timeout (55P03).
	Timeouts int64 `json:"timeouts"`
	// Restarts counts server restarts.
	Restarts int64 `json:"restarts"`
	// ConnLost counts calls that failed because the connection was lost;
	// Reconnects the new connections made after that.
	ConnLost   int64 `json:"conn_lost"`
	Reconnects int64 `json:"reconnects"`
}

// Total is every fault injected.
func (c Counts) Total() int64 { return c.KillsInjected + c.Crashes + c.Timeouts + c.Restarts }

// Result is one run.
type Result struct {
	Config  Config           `json:"config"`
	Elapsed time.Duration    `json:"elapsed_ns"`
	Summary dispatch.Summary `json:"summary"`
	Faults  Counts           `json:"faults"`
	Report  invariant.Report `json:"invariants"`
	Events  []dispatch.Event `json:"-"`
}

// Line is a one-line summary of the run.
func (r *Result) Line() string {
	return fmt.Sprintf("fetches %d (calls %d), committed acks %d, invalid-lock acks %d, dead leases %d, max attempt_count %d; "+
		"faults: kills %d (mid-fetch %d, mid-ack %d), crashes %d, timeouts %d, restarts %d, conn lost %d; "+
		"checks %d, violations %d (exclusion %d, conservation %d [lost %d, doubled %d], progress %d, dead lease %d)",
		r.Report.Leases, r.Summary.FetchCalls, r.Report.CommittedAcks, r.Summary.InvalidLockAcks, r.Report.DeadLeases, r.Report.MaxAttemptCount,
		r.Faults.KillsInjected, r.Faults.KillsMidFetch, r.Faults.KillsMidAck, r.Faults.Crashes, r.Faults.Timeouts, r.Faults.Restarts, r.Faults.ConnLost,
		r.Report.Checks, len(r.Report.Violations), r.Report.Count(invariant.Exclusion), r.Report.Count(invariant.Conservation),
		r.Report.Lost, r.Report.Doubled, r.Report.Count(invariant.Progress), r.Report.Count(invariant.DeadLease))
}

// Checks tunes what Run asserts beyond exclusion, conservation and the
// attempt_count bound.
type Checks struct {
	// ForbidDeadLeases makes every dead lease a violation.
	ForbidDeadLeases bool
	// RequireAdvance makes every instance complete at least one turn.
	RequireAdvance bool
}

// phases of a dispatcher, for the killer.
const (
	phaseIdle int32 = iota
	phaseFetch
	phaseAck
)

type counters struct {
	kills, killsFetch, killsAck, crashes, timeouts, restarts, connLost, reconnects atomic.Int64
}

func (c *counters) snapshot() Counts {
	return Counts{
		KillsInjected: c.kills.Load(), KillsMidFetch: c.killsFetch.Load(), KillsMidAck: c.killsAck.Load(),
		Crashes: c.crashes.Load(), Timeouts: c.timeouts.Load(), Restarts: c.restarts.Load(),
		ConnLost: c.connLost.Load(), Reconnects: c.reconnects.Load(),
	}
}

// Run seeds cfg.Schema (emptying it), runs the dispatchers with the faults
// for cfg.Duration, reads what is still pending and checks the invariants.
// The error is for a run that could not be made; violations are in
// Result.Report.
func Run(ctx context.Context, dsn string, cfg Config, checks Checks) (*Result, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dcfg := dispatch.Config{Schema: cfg.Schema, Dispatchers: cfg.Dispatchers, Instances: cfg.Instances,
		HistoryEvents: cfg.HistoryEvents, EventBytes: cfg.EventBytes, LockTimeout: cfg.LockTimeout, MaxAttempts: cfg.MaxAttempts}
	seed, err := dispatch.Seed(ctx, dsn, dcfg)
	if err != nil {
		return nil, err
	}
	// Make the seeded messages visible to clocks far behind, too.
	if err := execOnce(ctx, dsn, "UPDATE "+pgx.Identifier{cfg.Schema, "orchestrator_queue"}.Sanitize()+
		" SET visible_at = visible_at - interval '1 hour'"); err != nil {
		return nil, fmt.Errorf("faults: seed: %w", err)
	}

	connectDSN := dsn
	if cfg.ConnectDSN != "" {
		connectDSN = cfg.ConnectDSN
	}
	connCfg, err := pgx.ParseConfig(connectDSN)
	if err != nil {
		return nil, fmt.Errorf("faults: parse DSN: %w", err)
	}
	if cfg.StatementTimeout > 0 {
		connCfg.RuntimeParams["statement_timeout"] = strconv.FormatInt(max(cfg.StatementTimeout.Milliseconds(), 1), 10)
	}
	if cfg.SessionLockTimeout > 0 {
		connCfg.RuntimeParams["lock_timeout"] = strconv.FormatInt(max(cfg.SessionLockTimeout.Milliseconds(), 1), 10)
	}

	log := dispatch.NewLog()
	cnt := &counters{}
	rng := rand.New(rand.NewPCG(cfg.RandSeed, 0x9e3779b97f4a7c15))
	workers := make([]*worker, cfg.Dispatchers)
	for i := range workers {
		workers[i] = &worker{id: i + 1, cfg: cfg, client: orch.New(cfg.Schema), connCfg: connCfg,
			skewMs: cfg.SkewFor(i).Milliseconds(), log: log, cnt: cnt,
			rng: rand.New(rand.NewPCG(cfg.RandSeed, uint64(i+1)))}
	}

	start := time.Now()
	runCtx, stop := context.WithTimeout(ctx, cfg.Duration)
	defer stop()
	// Turns in progress may finish for a grace period after the run.
	turnCtx, stopTurns := context.WithCancel(context.WithoutCancel(ctx))
	defer stopTurns()
	go func() {
		<-runCtx.Done()
		select {
		case <-time.After(2*cfg.LockTimeout + 2*time.Second):
		case <-ctx.Done():
		}
		stopTurns()
	}()

	var wg sync.WaitGroup
	var restartErr error
	if cfg.KillEvery > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			killer(runCtx, connCfg, workers, cfg.KillEvery, rng, cnt)
		}()
	}
	if cfg.Restarts > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			restartErr = restarter(runCtx, cfg, cnt)
		}()
	}
	var wwg sync.WaitGroup
	for _, w := range workers {
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			w.loop(runCtx, turnCtx)
		}()
	}
	wwg.Wait()
	wg.Wait()
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if restartErr != nil {
		return nil, restartErr
	}

	var pending []string
	for attempt := 0; ; attempt++ { // the server may still be coming back
		pending, err = dispatch.PendingMessages(ctx, dsn, cfg.Schema)
		if err == nil || attempt == 50 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("faults: read pending messages: %w", err)
	}
	events := log.Events()
	skew := map[int]time.Duration{}
	for i := range workers {
		skew[i+1] = cfg.SkewFor(i)
	}
	counts := cnt.snapshot()
	// Faults that may raise attempt_count: a crash raises it on its
	// instance by one, a kill or a restart that lands after a fetch
	// committed raises it on some instance by one.
	extra := map[string]int{"": int(counts.KillsMidFetch) + int(counts.Restarts)*cfg.Dispatchers}
	for _, e := range events {
		if e.Kind == dispatch.KindFetch && e.Detail == detailCrashed {
			extra[e.Instance]++
		}
	}
	rep := invariant.Check(invariant.Input{
		Events: events, Seeded: seed.Messages, Pending: pending, Skew: skew,
		MaxAttempts: cfg.MaxAttempts, ExtraAttempts: extra,
		Instances: seed.Instances, RequireAdvance: checks.RequireAdvance,
		ForbidDeadLeases: checks.ForbidDeadLeases,
	})
	return &Result{
		Config: cfg, Elapsed: elapsed,
		Summary: dispatch.Summarize(events, elapsed, cfg.MaxAttempts),
		Faults:  counts, Report: rep, Events: events,
	}, nil
}

// detailCrashed marks the fetch after which its dispatcher crashed.
const detailCrashed = "crashed"

func execOnce(ctx context.Context, dsn, stmt string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, stmt)
	return err
}

// killer terminates the backend of a dispatcher inside a fetch or an ack,
// about every `every` (uniformly 0.5x-1.5x).
func killer(ctx context.Context, connCfg *pgx.ConnConfig, workers []*worker, every time.Duration, rng *rand.Rand, cnt *counters) {
	var admin *pgx.Conn
	defer func() {
		if admin != nil {
			_ = admin.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		sleep(ctx, time.Duration(float64(every)*(0.5+rng.Float64())))
		want := phaseFetch
		if rng.IntN(2) == 1 {
			want = phaseAck
		}
		// Wait (up to 500 ms) for a dispatcher in that phase.
		deadline := time.Now().Add(500 * time.Millisecond)
		var target *worker
		var pid uint32
		for target == nil && time.Now().Before(deadline) && ctx.Err() == nil {
			off := rng.IntN(len(workers))
			for k := range workers {
				w := workers[(off+k)%len(workers)]
				if w.phase.Load() == want {
					if p := w.pid.Load(); p != 0 {
						target, pid = w, p
						break
					}
				}
			}
			if target == nil {
				time.Sleep(100 * time.Microsecond)
			}
		}
		if target == nil {
			continue
		}
		if admin == nil || admin.IsClosed() {
			var err error
			if admin, err = pgx.ConnectConfig(ctx, adminConfig(connCfg)); err != nil {
				admin = nil
				continue
			}
		}
		var ok bool
		if err := admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", int64(pid)).Scan(&ok); err != nil || !ok {
			continue
		}
		cnt.kills.Add(1)
		switch want {
		case phaseFetch:
			cnt.killsFetch.Add(1)
		case phaseAck:
			cnt.killsAck.Add(1)
		}
	}
}

func adminConfig(c *pgx.ConnConfig) *pgx.ConnConfig {
	a := c.Copy()
	delete(a.RuntimeParams, "statement_timeout")
	delete(a.RuntimeParams, "lock_timeout")
	return a
}

// restarter restarts the server cfg.Restarts times, evenly over the run.
func restarter(ctx context.Context, cfg Config, cnt *counters) error {
	gap := cfg.Duration / time.Duration(cfg.Restarts+1)
	for i := 0; i < cfg.Restarts; i++ {
		sleep(ctx, gap)
		if ctx.Err() != nil {
			return nil
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		err := cfg.Restart(rctx)
		cancel()
		if err != nil {
			return fmt.Errorf("faults: restart the server: %w", err)
		}
		cnt.restarts.Add(1)
	}
	return nil
}

// worker is one dispatcher.
type worker struct {
	id      int
	cfg     Config
	client  orch.Client
	connCfg *pgx.ConnConfig
	skewMs  int64
	log     *dispatch.Log
	cnt     *counters
	rng     *rand.Rand

	conn      *pgx.Conn
	connected bool // has connected before (the next connect is a reconnect)
	pid       atomic.Uint32
	phase     atomic.Int32
	seq       int
}

func (w *worker) now() int64 { return time.Now().UnixMilli() + w.skewMs }

// connect (re)connects, backing off until ctx ends.
func (w *worker) connect(ctx context.Context) bool {
	w.drop()
	backoff := 20 * time.Millisecond
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := pgx.ConnectConfig(cctx, w.connCfg.Copy())
		cancel()
		if err == nil {
			if w.connected {
				w.cnt.reconnects.Add(1)
			}
			w.conn, w.connected = c, true
			w.pid.Store(c.PgConn().PID())
			return true
		}
		sleep(ctx, backoff)
		backoff = min(2*backoff, time.Second)
	}
	return false
}

func (w *worker) drop() {
	w.pid.Store(0)
	if w.conn != nil {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = w.conn.Close(cctx)
		cancel()
		w.conn = nil
	}
}

// connLost reports an error that lost the connection (the call's outcome
// is then unknown).
func (w *worker) connLost(err error) bool {
	if err == nil {
		return false
	}
	if w.conn == nil || w.conn.IsClosed() {
		return true
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		// admin_shutdown, crash_shutdown, cannot_connect_now, connection
		// exceptions.
		return pg.Code == "57P01" || pg.Code == "57P02" || pg.Code == "57P03" || pg.Code[:2] == "08"
	}
	return true // an I/O error
}

func (w *worker) noteTimeout(err error) {
	switch orch.SQLState(err) {
	case "57014", "55P03":
		w.cnt.timeouts.Add(1)
	}
}

func (w *worker) loop(runCtx, turnCtx context.Context) {
	defer w.drop()
	if !w.connect(runCtx) {
		return
	}
	for runCtx.Err() == nil {
		if w.conn == nil && !w.connect(runCtx) {
			return
		}
		iterStart := time.Now()
		it, ids, err := w.fetch(runCtx)
		if err != nil {
			if runCtx.Err() != nil {
				return
			}
			sleep(runCtx, 50*time.Millisecond)
			continue
		}
		if it == nil {
			if rest := w.cfg.PollInterval - time.Since(iterStart); rest > 0 {
				sleep(runCtx, rest)
			}
			continue
		}
		w.turn(turnCtx, it, ids)
	}
}

// fetch calls fetch_orchestration_item and reads the returned lease.
func (w *worker) fetch(ctx context.Context) (*orch.Item, []string, error) {
	w.phase.Store(phaseFetch)
	start := time.Now()
	before := w.now()
	it, err := w.client.Fetch(ctx, w.conn, before, w.cfg.LockTimeout.Milliseconds(), orch.RuntimeFilter())
	after := w.now()
	w.phase.Store(phaseIdle)
	ev := dispatch.Event{Dispatcher: w.id, Kind: dispatch.KindFetch, CallerBeforeMs: before, CallerAfterMs: after,
		LatencyUs: time.Since(start).Microseconds()}
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		w.noteTimeout(err)
		ev.Outcome = err.Error()
		if w.connLost(err) {
			ev.Outcome = invariant.Unknown(err)
			w.cnt.connLost.Add(1)
			w.drop()
		}
		w.log.Add(ev)
		return nil, nil, err
	}
	if it == nil {
		ev.Outcome = dispatch.OutcomeEmpty
		w.log.Add(ev)
		return nil, nil, nil
	}
	ev.Instance, ev.Token, ev.AttemptCount, ev.Outcome = it.InstanceID, it.LockToken, it.AttemptCount, dispatch.OutcomeOK
	lease, lerr := w.client.ReadLease(context.WithoutCancel(ctx), w.conn, it.LockToken)
	switch {
	case lerr != nil:
		ev.Detail = invariant.DetailLeaseUnread
	case lease.LockedUntilMs == 0:
		ev.LeaseLost = true
	default:
		ev.DBAtReturnMs = lease.DBNowMs
		ev.LockedUntilMs = lease.LockedUntilMs
		ev.RemainingMs = lease.LockedUntilMs - after
		ev.LeaseAgeMs = w.cfg.LockTimeout.Milliseconds() - ev.RemainingMs
	}
	ids, derr := dispatch.MessageIDs(it.Messages)
	ev.Messages = ids
	crash := w.cfg.CrashProb > 0 && w.rng.Float64() < w.cfg.CrashProb
	if crash {
		ev.Detail = detailCrashed
	}
	w.log.Add(ev)
	if lerr != nil && w.connLost(lerr) {
		w.cnt.connLost.Add(1)
		w.drop()
		// The turn goes on: the ack reconnects.
	}
	if derr != nil {
		return nil, nil, derr
	}
	if crash {
		// The dispatcher dies with its lease: no ack, no abandon.
		w.cnt.crashes.Add(1)
		w.drop()
		sleep(ctx, w.cfg.CrashPause)
		return nil, nil, nil
	}
	return it, ids, nil
}

// turn acks the batch as the runtime would.
func (w *worker) turn(ctx context.Context, it *orch.Item, ids []string) {
	if int(it.AttemptCount) > w.cfg.MaxAttempts {
		out := fmt.Sprintf("poison: attempt_count %d > %d", it.AttemptCount, w.cfg.MaxAttempts)
		w.ack(ctx, it, dispatch.KindPoison, orch.Ack{ExecutionID: it.ExecutionID, HistoryDelta: delta(it, lastEventID(it.History), "OrchestrationFailed", []string{""}),
			Metadata: metadataJSON("Failed", out)}, ids, nil)
		return
	}
	if w.cfg.TurnTime > 0 {
		sleep(ctx, w.cfg.TurnTime)
	}
	var enq []string
	items := []json.RawMessage{}
	for _, id := range ids {
		if id == "" {
			continue
		}
		w.seq++
		nid := "m-" + strconv.Itoa(w.id) + "-" + strconv.Itoa(w.seq)
		enq = append(enq, nid)
		items = append(items, json.RawMessage(orch.ExternalEventWorkItem(it.InstanceID, dispatch.EventName, nid)))
	}
	itemsJSON, _ := json.Marshal(items)
	err := w.ack(ctx, it, dispatch.KindAck, orch.Ack{ExecutionID: it.ExecutionID,
		HistoryDelta: delta(it, lastEventID(it.History), "ExternalEvent", ids), OrchestratorItems: itemsJSON,
		Metadata: metadataJSON("", "")}, ids, enq)
	if err == nil || ctx.Err() != nil {
		return
	}
	// The ack was refused (or kept failing): fail the orchestration with the
	// same token, as the runtime does.
	w.ack(ctx, it, dispatch.KindFailAck, orch.Ack{ExecutionID: it.ExecutionID,
		HistoryDelta: delta(it, lastEventID(it.History), "OrchestrationFailed", []string{""}),
		Metadata:     metadataJSON("Failed", "infrastructure:ack_orchestration_item: "+err.Error())}, ids, nil)
}

// ack acks with the lease's token, retrying (at most 3 more times, on a
// new connection) when the connection was lost; it returns the last error.
func (w *worker) ack(ctx context.Context, it *orch.Item, kind dispatch.Kind, a orch.Ack, ids, enq []string) error {
	var err error
	for attempt := 0; attempt < 4 && ctx.Err() == nil; attempt++ {
		if w.conn == nil && !w.connect(ctx) {
			return ctx.Err()
		}
		w.phase.Store(phaseAck)
		start := time.Now()
		before := w.now()
		err = w.client.AckItem(ctx, w.conn, it.LockToken, before, a)
		after := w.now()
		w.phase.Store(phaseIdle)
		ev := dispatch.Event{Dispatcher: w.id, Kind: kind, Instance: it.InstanceID, Token: it.LockToken,
			CallerBeforeMs: before, CallerAfterMs: after, LatencyUs: time.Since(start).Microseconds(),
			AttemptCount: it.AttemptCount, Messages: ids, Enqueued: enq, Outcome: dispatch.OutcomeOK}
		lost := false
		if err != nil {
			w.noteTimeout(err)
			switch {
			case orch.IsInvalidLockToken(err):
				ev.Outcome = dispatch.OutcomeInvalidLockToken
			case w.connLost(err):
				ev.Outcome = invariant.Unknown(err)
				lost = true
			default:
				ev.Outcome = err.Error()
			}
		}
		w.log.Add(ev)
		if !lost {
			return err
		}
		w.cnt.connLost.Add(1)
		w.drop()
		sleep(ctx, time.Duration(20*(attempt+1))*time.Millisecond)
	}
	return err
}

// lastEventID finds the highest event_id of a fetched history.
func lastEventID(h json.RawMessage) int64 {
	var evs []struct {
		EventID int64 `json:"event_id"`
	}
	_ = json.Unmarshal(h, &evs)
	var last int64
	for _, e := range evs {
		last = max(last, e.EventID)
	}
	return last
}

// delta is a history delta of one event of type typ per id, after last.
func delta(it *orch.Item, last int64, typ string, ids []string) json.RawMessage {
	type elem struct {
		EventID   int64  `json:"event_id"`
		EventType string `json:"event_type"`
		EventData string `json:"event_data"`
	}
	var out []elem
	for _, id := range ids {
		if id == "" && typ == "ExternalEvent" {
			continue
		}
		last++
		data, _ := json.Marshal(map[string]any{
			"event_id": last, "source_event_id": nil, "instance_id": it.InstanceID, "execution_id": it.ExecutionID,
			"timestamp_ms": time.Now().UnixMilli(), "duroxide_version": dispatch.DuroxideVersion,
			"type": typ, "name": dispatch.EventName, "data": id,
		})
		out = append(out, elem{last, "Event", string(data)})
	}
	b, _ := json.Marshal(out)
	if out == nil {
		return json.RawMessage("[]")
	}
	return b
}

func metadataJSON(status, output string) json.RawMessage {
	m := map[string]any{
		"orchestration_name": nil, "orchestration_version": nil, "status": nil, "output": nil,
		"parent_instance_id": nil, "pinned_duroxide_version": nil, "custom_status_action": nil,
		"custom_status_value": nil, "kv_mutations": []any{},
	}
	if status != "" {
		m["status"], m["output"] = status, output
	}
	b, _ := json.Marshal(m)
	return b
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
