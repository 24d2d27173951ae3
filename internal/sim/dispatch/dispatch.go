// Package dispatch simulates duroxide's orchestration dispatchers against a
// duroxide-pg schema, the way the runtime drives the provider:
//
//   - each dispatcher is one worker loop with its own connection; it mints
//     p_now_ms from its own clock (wall clock plus an optional skew) right
//     before every call, and always passes the runtime's version filter;
//   - no row: it sleeps out the rest of the minimum poll interval (100 ms);
//   - a row: it renews the lock every ceil(timeout/2 s) (at least 1 s) by the
//     timeout truncated to whole seconds, as duroxide-pg does, while the turn
//     runs; a batch whose attempt_count exceeds MaxAttempts is acked as
//     poison (OrchestrationFailed{Poison}, status Failed), any other batch is
//     acked as a normal turn that appends the received events and enqueues
//     the instance's next message in the same ack, so the instance stays hot;
//   - an ack refused with 'Invalid lock token' is followed by one more ack
//     with the same token carrying OrchestrationFailed{Infrastructure}, and
//     nothing else: no abandon (the runtime drops that future unpolled);
//   - fetch errors back off 200 ms … 3 s (retryable) or 100 ms (permanent);
//   - a call that loses its connection (an I/O error, a closed connection,
//     an admin or crash shutdown, a connection exception) is recorded with
//     an unknown outcome (Unknown), the dispatcher drops the connection and
//     connects again for its next call, and the call counts as retryable,
//     as duroxide-pg classifies I/O errors: an ack so lost is retried on the
//     new connection.
//
// Hooks (Config.Hooks) let package faults inject its faults into this one
// loop: how a dispatcher connects, each call's kind and backend, a crash
// after a fetch, and work that runs alongside the dispatchers.
//
// Every call is recorded as an Event in a Log that Summarize reduces, and
// every message carries a unique id so that Conservation can prove nothing
// was lost or delivered twice.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/clock"
	"github.com/duroxide-pg/migrations/internal/sim/defaults"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/sim/renewal"
	"github.com/duroxide-pg/migrations/internal/sim/simconfig"
)

// Config describes a simulation. Zero fields take the defaults of
// WithDefaults. Its LockTimeout (simconfig.Common) is the runtime's
// orchestrator_lock_timeout, default 5 s (the runtime's; the organic
// scenario uses much less), and its PollInterval is
// dispatcher_min_poll_interval.
type Config struct {
	simconfig.Common
	// Dispatchers is the number of dispatcher loops (orchestration workers),
	// each with its own connection. Default 16.
	Dispatchers int `json:"dispatchers"`
	// Instances is the number of running orchestrations Seed creates, each
	// with one pending message. Default 1.
	Instances int `json:"instances"`
	// HistoryEvents is the history length of each seeded instance. Default
	// 5000.
	HistoryEvents int `json:"history_events"`
	// EventBytes is the approximate size of each seeded event's JSON.
	// Default 250.
	EventBytes int `json:"event_bytes"`
	// TurnTime is how long a turn runs between fetch and ack. Default 0.
	TurnTime time.Duration `json:"turn_time_ns"`
	// Skew spreads the dispatchers' clocks uniformly over [-Skew, +Skew]:
	// dispatcher i of n runs -Skew + 2*Skew*i/(n-1) ahead of the wall clock.
	// Default 0.
	Skew time.Duration `json:"skew_ns"`
	// Skews, when not empty, sets each dispatcher's clock offset instead:
	// dispatcher i (0-based) gets Skews[i], missing entries 0.
	Skews []time.Duration `json:"skews_ns,omitempty"`
	// MaxAttempts is the runtime's max_attempts: a batch whose attempt_count
	// exceeds it is poisoned. Default 10.
	MaxAttempts int `json:"max_attempts"`
	// Via, when not nil, is where the dispatchers connect instead of the
	// run's Source (for example through PgBouncer); seeding and reading the
	// queue keep the run's Source.
	Via *dbconn.Source `json:"-"`
	// ShutdownGrace is how long turns in progress may go on (and ack)
	// after the run ends. Default 1 s: the runtime's shutdown(None) waits
	// that long before it aborts its workers.
	ShutdownGrace time.Duration `json:"shutdown_grace_ns,omitempty"`
	// Hooks inject faults (package faults); the zero value injects none.
	Hooks Hooks `json:"-"`
}

// Hooks let a caller inject faults into the dispatchers' loop. Every hook
// is optional; hooks are called from several dispatchers at once, each
// dispatcher's calls one at a time.
type Hooks struct {
	// Connect opens dispatcher's connection from cfg (parsed from
	// Via or the run's Source: a copy the hook may change), for the first
	// connection and again after one was lost or dropped by a crash.
	// Default: pgx.ConnectConfig, once.
	Connect func(ctx context.Context, dispatcher int, cfg *pgx.ConnConfig) (*pgx.Conn, error)
	// Call is told that dispatcher is about to make a call of kind on the
	// backend whose process id is pid (KindLeaseRead for the lease read
	// after a fetch); the function it returns, when not nil, is told how
	// the call ended: its error, and whether it lost the connection (a
	// call cut short by the end of the run or of the grace period does not
	// count as lost here, though its outcome is unknown all the same).
	Call func(dispatcher int, kind Kind, pid uint32) (done func(err error, lost bool))
	// Crash is asked, after each fetch that returned a row, whether the
	// dispatcher crashes now and for how long it stays down. A crashed
	// dispatcher records its fetch with DetailCrashed, drops the lease (no
	// ack, no abandon) and its connection, and comes back after pause.
	Crash func(dispatcher int) (pause time.Duration, crash bool)
	// During runs alongside the dispatchers with the run's context (done
	// once Duration is over); Run waits for it and returns its error.
	During func(ctx context.Context) error
}

// Defaults.
const (
	defaultDispatchers   = 16
	defaultInstances     = 1
	defaultHistoryEvents = 5000
	defaultEventBytes    = 250
	defaultLockTimeout   = 5 * time.Second
	DefaultPollInterval  = simconfig.DefaultPollInterval
	defaultDuration      = simconfig.DefaultDuration
	DefaultMaxAttempts   = 10
	defaultShutdownGrace = time.Second
)

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	defaults.Set(&c.Dispatchers, defaultDispatchers)
	defaults.Set(&c.Instances, defaultInstances)
	defaults.Set(&c.HistoryEvents, defaultHistoryEvents)
	defaults.Set(&c.EventBytes, defaultEventBytes)
	c.Common = c.Common.WithDefaults(defaultLockTimeout)
	defaults.Set(&c.MaxAttempts, DefaultMaxAttempts)
	defaults.Set(&c.ShutdownGrace, defaultShutdownGrace)
	return c
}

// Validate rejects a config that cannot run.
func (c Config) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return fmt.Errorf("dispatch: %w", err)
	}
	switch {
	case c.TurnTime < 0 || c.Skew < 0 || c.ShutdownGrace < 0:
		return errors.New("dispatch: TurnTime, Skew and ShutdownGrace must not be negative")
	case c.Dispatchers < 0 || c.Instances < 0 || c.HistoryEvents < 0 || c.EventBytes < 0 || c.MaxAttempts < 0:
		return errors.New("dispatch: Dispatchers, Instances, HistoryEvents, EventBytes and MaxAttempts must not be negative")
	}
	return nil
}

// SkewFor is dispatcher i's clock offset (0-based, of n): Skews[i] when
// Skews is set, else its place in Skew's spread.
func (c Config) SkewFor(i, n int) time.Duration {
	if len(c.Skews) > 0 {
		if i < len(c.Skews) {
			return c.Skews[i]
		}
		return 0
	}
	return clock.Spread(-c.Skew, c.Skew, i, n)
}

// Run seeds nothing: it runs cfg.Dispatchers dispatchers against src for
// cfg.Duration (or until ctx is cancelled) and returns their log. Every
// connection is closed and every goroutine has ended when it returns.
func Run(ctx context.Context, src *dbconn.Source, cfg Config) (*Log, error) {
	log := NewLog()
	return log, RunLog(ctx, src, cfg, log)
}

// RunLog is Run recording into a log the caller already holds (to watch it
// while it runs).
func RunLog(ctx context.Context, src *dbconn.Source, cfg Config, log *Log) error {
	cfg, err := simconfig.Ready(cfg)
	if err != nil {
		return err
	}
	if cfg.Via != nil {
		src = cfg.Via
	}
	connCfg := src.Config()
	ds := make([]*dispatcher, cfg.Dispatchers)
	for i := range ds {
		ds[i] = &dispatcher{
			id:      i + 1,
			cfg:     cfg,
			client:  orch.New(cfg.Schema),
			connCfg: connCfg,
			clock:   clock.New(cfg.SkewFor(i, cfg.Dispatchers)),
			log:     log,
		}
	}
	defer func() {
		for _, d := range ds {
			d.drop()
		}
	}()
	// Connect everybody first, so the run starts with all dispatchers ready.
	for _, d := range ds {
		if d.conn, err = d.connect(ctx); err != nil {
			return fmt.Errorf("dispatch: connect dispatcher %d: %w", d.id, err)
		}
	}

	runCtx, stop := context.WithTimeout(ctx, cfg.Duration)
	defer stop()
	// Turns in progress may finish (and ack) for ShutdownGrace after the
	// run ends, as the runtime lets them.
	turnCtx, stopTurns := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	defer func() {
		stopTurns()
		wg.Wait()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-runCtx.Done():
			clock.Sleep(turnCtx, cfg.ShutdownGrace)
		case <-turnCtx.Done():
		}
		stopTurns()
	}()
	var duringErr error
	if cfg.Hooks.During != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			duringErr = cfg.Hooks.During(runCtx)
		}()
	}

	log.MarkStart()
	var loops sync.WaitGroup
	for _, d := range ds {
		loops.Add(1)
		go func() {
			defer loops.Done()
			d.loop(runCtx, turnCtx)
		}()
	}
	loops.Wait()
	log.MarkStop()
	stopTurns()
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	if duringErr != nil {
		return fmt.Errorf("dispatch: alongside the dispatchers: %w", duringErr)
	}
	return nil
}

type dispatcher struct {
	id      int
	cfg     Config
	client  orch.Client
	connCfg *pgx.ConnConfig
	clock   clock.Skewed
	log     *Log

	connMu sync.Mutex // the turn's calls and the renewal task share conn
	conn   *pgx.Conn  // nil after a lost connection, until the next call
	seq    int        // messages enqueued by this dispatcher
}

// now is the dispatcher's clock: the wall clock plus its skew, in epoch ms.
func (d *dispatcher) now() int64 { return d.clock.NowMs() }

// connect opens a connection with Hooks.Connect or pgx.
func (d *dispatcher) connect(ctx context.Context) (*pgx.Conn, error) {
	if d.cfg.Hooks.Connect != nil {
		return d.cfg.Hooks.Connect(ctx, d.id, d.connCfg.Copy())
	}
	return pgx.ConnectConfig(ctx, d.connCfg.Copy())
}

// drop closes the connection (the next call connects again).
func (d *dispatcher) drop() {
	d.connMu.Lock()
	defer d.connMu.Unlock()
	d.dropLocked()
}

func (d *dispatcher) dropLocked() {
	if d.conn != nil {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = d.conn.Close(cctx)
		cancel()
		d.conn = nil
	}
}

// callTimes are a call's times: the dispatcher's clock before and after
// it, and its wall time.
type callTimes struct{ before, after, latencyUs int64 }

// call runs f on the connection (connecting first when the last one was
// lost), timing it with the dispatcher's clock and telling Hooks.Call. An
// error that lost the connection comes back as a *lostConnError and the
// connection is dropped.
func (d *dispatcher) call(ctx context.Context, kind Kind, f func(conn *pgx.Conn, nowMs int64) error) (callTimes, error) {
	d.connMu.Lock()
	defer d.connMu.Unlock()
	if d.conn == nil {
		c, err := d.connect(ctx)
		if err != nil {
			now := d.now()
			return callTimes{before: now, after: now}, &lostConnError{fmt.Errorf("connect: %w", err)}
		}
		d.conn = c
	}
	var done func(error, bool)
	if d.cfg.Hooks.Call != nil {
		done = d.cfg.Hooks.Call(d.id, kind, d.conn.PgConn().PID())
	}
	start := time.Now()
	t := callTimes{before: d.now()}
	err := f(d.conn, t.before)
	t.latencyUs = time.Since(start).Microseconds()
	t.after = d.now()
	lost := connLost(d.conn, err)
	if lost {
		d.dropLocked()
		err = &lostConnError{err}
	}
	if done != nil {
		done(err, lost && ctx.Err() == nil)
	}
	return t, err
}

// lostConnError is a call's error that lost its connection: whether the
// call took effect is unknown.
type lostConnError struct{ Err error }

func (e *lostConnError) Error() string { return e.Err.Error() }
func (e *lostConnError) Unwrap() error { return e.Err }

// connLost reports an error that lost the connection: the connection is
// closed, or the server ended the session (admin_shutdown, crash_shutdown,
// cannot_connect_now, a connection exception), or the error is not the
// server's (an I/O error).
func connLost(conn *pgx.Conn, err error) bool {
	if err == nil {
		return false
	}
	if conn.IsClosed() {
		return true
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "57P01" || pg.Code == "57P02" || pg.Code == "57P03" || strings.HasPrefix(pg.Code, "08")
	}
	return true
}

// loop is one orchestration worker of the runtime.
func (d *dispatcher) loop(runCtx, turnCtx context.Context) {
	consecutiveRetryable := 0
	for runCtx.Err() == nil {
		iterStart := time.Now()
		it, err := d.fetch(runCtx)
		if err != nil {
			if runCtx.Err() != nil {
				// The fetch raced the shutdown and lost.
				return
			}
			var backoff time.Duration
			if retryable(err) {
				consecutiveRetryable++
				backoff = time.Duration(min(100*(int64(1)<<min(consecutiveRetryable, 6)), 3000)) * time.Millisecond
			} else {
				consecutiveRetryable = 0
				backoff = 100 * time.Millisecond
			}
			clock.Sleep(runCtx, backoff)
			continue
		}
		consecutiveRetryable = 0
		if it == nil {
			if rest := d.cfg.PollInterval - time.Since(iterStart); rest > 0 {
				clock.Sleep(runCtx, rest)
			}
			continue
		}
		d.turn(turnCtx, it)
	}
}

// fetch calls fetch_orchestration_item like duroxide-pg: up to 4 attempts,
// a fresh p_now_ms each, sleeping 50 ms × attempt after a retryable error.
// A returned row is followed by a read of its lease; then Hooks.Crash may
// crash the dispatcher, which returns no row.
func (d *dispatcher) fetch(ctx context.Context) (*fetched, error) {
	timeoutMs := d.cfg.LockTimeout.Milliseconds()
	for attempt := 0; ; attempt++ {
		var it *orch.Item
		t, err := d.call(ctx, KindFetch, func(conn *pgx.Conn, now int64) error {
			var err error
			it, err = d.client.Fetch(ctx, conn, now, timeoutMs, orch.RuntimeFilter())
			return err
		})
		ev := Event{Dispatcher: d.id, Kind: KindFetch, CallerBeforeMs: t.before, CallerAfterMs: t.after, LatencyUs: t.latencyUs}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			ev.Outcome = outcome(err)
			d.log.Add(ev)
			if retryable(err) && attempt < 3 {
				clock.Sleep(ctx, time.Duration(50*(attempt+1))*time.Millisecond)
				continue
			}
			return nil, err
		}
		if it == nil {
			ev.Outcome = OutcomeEmpty
			d.log.Add(ev)
			return nil, nil
		}
		ev.Instance, ev.Token, ev.AttemptCount = it.InstanceID, it.LockToken, it.AttemptCount
		ev.Outcome = OutcomeOK
		d.readLease(ctx, &ev, it, t.after)
		ids, derr := messageIDs(it.Messages)
		ev.Messages = ids
		pause, crash := time.Duration(0), false
		if d.cfg.Hooks.Crash != nil {
			pause, crash = d.cfg.Hooks.Crash(d.id)
		}
		if crash {
			ev.Detail = DetailCrashed
		}
		d.log.Add(ev)
		if crash {
			// The dispatcher dies with its lease: no ack, no abandon.
			d.drop()
			clock.Sleep(ctx, pause)
			return nil, nil
		}
		if it.Name == nil || it.Version == nil {
			// duroxide-pg's row decoder rejects a NULL name or version:
			// a permanent error, the lease stays until it expires.
			return nil, errors.New("Unexpected error: NULL orchestration name or version")
		}
		if derr != nil {
			// duroxide-pg returns a permanent error for undecodable messages.
			return nil, derr
		}
		return &fetched{Item: it, ids: ids, history: scanHistory(it.History)}, nil
	}
}

// readLease reads the lease a fetch returned, right away on the same
// connection, into its event. A lease that could not be read counts as
// lost (DetailLeaseUnread); when the read lost the connection, the turn
// goes on and its ack connects again.
func (d *dispatcher) readLease(ctx context.Context, ev *Event, it *orch.Item, afterMs int64) {
	var lease orch.Lease
	_, err := d.call(context.WithoutCancel(ctx), KindLeaseRead, func(conn *pgx.Conn, _ int64) error {
		var err error
		lease, err = d.client.ReadLease(context.WithoutCancel(ctx), conn, it.LockToken)
		return err
	})
	ev.DBReturnMs = it.DBReturnMs
	switch {
	case err != nil:
		ev.LeaseLost = true
		ev.Detail = DetailLeaseUnread
		ev.Outcome = OutcomeOK + " (lease not read: " + err.Error() + ")"
	default:
		ev.DBAtReturnMs = lease.DBNowMs
		ev.DeliveryMs = lease.DBNowMs - it.DBReturnMs
		if lease.LockedUntilMs == 0 {
			ev.LeaseLost = true
		} else {
			ev.LockedUntilMs = lease.LockedUntilMs
			ev.RemainingMs = lease.LockedUntilMs - afterMs
			ev.LeaseAgeMs = d.cfg.LockTimeout.Milliseconds() - ev.RemainingMs
		}
	}
}

type fetched struct {
	*orch.Item
	ids     []string
	history historyFacts
}

// turn processes one fetched item (the runtime's turn).
func (d *dispatcher) turn(ctx context.Context, it *fetched) {
	// Runtime-side pinned-version check: abandon with 1 s delay.
	if v := it.history.PinnedVersion; v != "" {
		packed, ok := packVersion(v)
		if ok && (packed < orch.RuntimeFilter().Min || packed > orch.RuntimeFilter().Max) {
			d.abandon(ctx, it, time.Second)
			return
		}
	}

	stopRenew := d.startRenewal(ctx, it)
	defer stopRenew()

	// Poison comes first, before any other check and before the turn runs.
	if int(it.AttemptCount) > d.cfg.MaxAttempts {
		d.poison(ctx, it)
		return
	}
	if it.history.LastType == "OrchestrationCompleted" || it.history.LastType == "OrchestrationFailed" {
		// Terminal instance: ack the batch with no changes.
		d.ackWithRetries(ctx, it, KindAck, orch.Ack{ExecutionID: it.ExecutionID, Metadata: metadata{}.JSON()}, nil, "terminal")
		return
	}

	// The orchestration's turn (replay and new decisions).
	if d.cfg.TurnTime > 0 {
		clock.Sleep(ctx, d.cfg.TurnTime)
	}

	// A normal turn: each ExternalRaised of the batch is received
	// (ExternalEvent) and the orchestration waits for the next one
	// (ExternalSubscribed); the next message is enqueued in the same ack.
	now := d.now()
	next := it.history.LastEventID + 1
	var events []histEvent
	var items []byte
	var enqueued []string
	items = append(items, '[')
	for _, id := range it.ids {
		if id == "" {
			continue
		}
		events = append(events,
			histEvent{EventID: next, InstanceID: it.InstanceID, ExecutionID: it.ExecutionID, TimestampMs: now,
				Type: "ExternalEvent", Fields: []field{{"name", EventName}, {"data", id}}},
			histEvent{EventID: next + 1, InstanceID: it.InstanceID, ExecutionID: it.ExecutionID, TimestampMs: now,
				Type: "ExternalSubscribed", Fields: []field{{"name", EventName}}})
		next += 2
		d.seq++
		nid := "m-" + strconv.Itoa(d.id) + "-" + strconv.Itoa(d.seq)
		if len(enqueued) > 0 {
			items = append(items, ',')
		}
		items = append(items, orch.ExternalEventWorkItem(it.InstanceID, EventName, nid)...)
		enqueued = append(enqueued, nid)
	}
	items = append(items, ']')
	ack := orch.Ack{
		ExecutionID:       it.ExecutionID,
		HistoryDelta:      deltaArray(events...),
		OrchestratorItems: items,
		Metadata:          metadata{}.JSON(),
	}
	err := d.ackWithRetries(ctx, it, KindAck, ack, enqueued, "")
	if err == nil || ctx.Err() != nil {
		return
	}
	// The ack failed: fail the orchestration with an infrastructure error,
	// acked with the same token; whatever happens next, nothing else (the
	// runtime's abandon future is never polled).
	msg := err.Error()
	retryableErr := retryable(err)
	if orch.IsInvalidLockToken(err) {
		msg = "Invalid lock token"
	}
	details := object(field{"Infrastructure", object(
		field{"operation", "ack_orchestration_item"}, field{"message", msg}, field{"retryable", retryableErr})})
	failed := histEvent{EventID: it.history.LastEventID + 1, InstanceID: "", ExecutionID: 0, TimestampMs: d.now(),
		Type: "OrchestrationFailed", Fields: []field{{"details", details}}}
	d.ackWithRetries(ctx, it, KindFailAck, orch.Ack{
		ExecutionID:  it.ExecutionID,
		HistoryDelta: deltaArray(failed),
		Metadata: metadata{Status: strp("Failed"),
			Output: strp("infrastructure:ack_orchestration_item: " + msg)}.JSON(),
	}, nil, "")
}

// poison acks the batch as poison, as the runtime does; its result is
// ignored by the runtime.
func (d *dispatcher) poison(ctx context.Context, it *fetched) {
	msgs := string(it.Messages)
	if msgs == "" {
		msgs = "[]"
	}
	details := object(field{"Poison", object(
		field{"attempt_count", it.AttemptCount},
		field{"max_attempts", d.cfg.MaxAttempts},
		field{"message_type", object(field{"Orchestration", object(
			field{"instance", it.InstanceID}, field{"execution_id", it.ExecutionID})})},
		field{"message", msgs},
	)})
	now := d.now()
	var events []histEvent
	next := it.history.LastEventID + 1
	if it.history.Empty {
		events = append(events, histEvent{EventID: 1, InstanceID: it.InstanceID, ExecutionID: it.ExecutionID, TimestampMs: now,
			Type: "OrchestrationStarted", Fields: []field{{"name", *it.Name}, {"version", *it.Version}, {"input", ""},
				{"parent_instance", nil}, {"parent_id", nil}}})
		next = 2
	}
	events = append(events, histEvent{EventID: next, InstanceID: "", ExecutionID: 0, TimestampMs: now,
		Type: "OrchestrationFailed", Fields: []field{{"details", details}}})
	out := fmt.Sprintf("poison: orchestration %s exceeded %d attempts (max %d)", it.InstanceID, it.AttemptCount, d.cfg.MaxAttempts)
	d.ackWithRetries(ctx, it, KindPoison, orch.Ack{
		ExecutionID:  it.ExecutionID,
		HistoryDelta: deltaArray(events...),
		Metadata:     metadata{Name: it.Name, Version: it.Version, Status: strp("Failed"), Output: &out}.JSON(),
	}, nil, "")
}

// ackWithRetries is the runtime's ack_orchestration_with_changes over
// duroxide-pg's ack: retryable errors are retried (by the provider 3 times,
// 50/100/150 ms, then by the runtime 5 times, 10…160 ms); a permanent error
// (including 'Invalid lock token') is returned at once.
func (d *dispatcher) ackWithRetries(ctx context.Context, it *fetched, kind Kind, a orch.Ack, enqueued []string, detail string) error {
	var err error
	for runtimeAttempt := 0; ; runtimeAttempt++ {
		for provAttempt := 0; ; provAttempt++ {
			err = d.ackOnce(ctx, it, kind, a, enqueued, detail)
			if err == nil || !retryable(err) || provAttempt == 3 || ctx.Err() != nil {
				break
			}
			clock.Sleep(ctx, time.Duration(50*(provAttempt+1))*time.Millisecond)
		}
		if err == nil || !retryable(err) || runtimeAttempt == 5 || ctx.Err() != nil {
			return err
		}
		clock.Sleep(ctx, time.Duration(10<<runtimeAttempt)*time.Millisecond)
	}
}

func (d *dispatcher) ackOnce(ctx context.Context, it *fetched, kind Kind, a orch.Ack, enqueued []string, detail string) error {
	var probe ackProbe
	t, err := d.call(ctx, kind, func(conn *pgx.Conn, now int64) error {
		q := probedAck{conn: conn, schema: d.cfg.Schema, token: it.LockToken, probe: &probe}
		return d.client.AckItem(ctx, q, it.LockToken, now, a)
	})
	ev := Event{Dispatcher: d.id, Kind: kind, Instance: it.InstanceID, Token: it.LockToken,
		CallerBeforeMs: t.before, CallerAfterMs: t.after, LatencyUs: t.latencyUs, AttemptCount: it.AttemptCount,
		Messages: it.ids, Detail: detail, Outcome: outcome(err),
		AckDBStartMs: probe.dbStartMs, AckLockedUntilMs: probe.lockedUntilMs}
	if err == nil {
		ev.Enqueued = enqueued
	}
	d.log.Add(ev)
	return err
}

// ackProbe is what the statement just before an ack read: the database
// clock and the token's locked_until (Event.AckDBStartMs,
// Event.AckLockedUntilMs).
type ackProbe struct{ dbStartMs, lockedUntilMs int64 }

// probedAck is the orch.Querier an ack runs through: its Exec sends, in one
// batch (one round trip, one implicit transaction), a read of the database
// clock and of the token's lease, then the ack's own statement unchanged.
// The read takes no lock and the ack reads no database clock, so the ack
// behaves as when sent alone; the clock the read returns comes before the
// ack's statement starts, so it is a lower bound of the clock at which the
// ack checked its lease. Through the simple protocol (PgBouncer) the batch
// is one multi-statement query, with the same effect.
type probedAck struct {
	conn   *pgx.Conn
	schema string
	token  string
	probe  *ackProbe
}

func (q probedAck) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	b := &pgx.Batch{}
	b.Queue("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, "+
		"coalesce((SELECT locked_until FROM "+pgx.Identifier{q.schema, "instance_locks"}.Sanitize()+
		" WHERE lock_token = $1), 0)", q.token)
	b.Queue(sql, args...)
	br := q.conn.SendBatch(ctx, b)
	var p ackProbe
	if err := br.QueryRow().Scan(&p.dbStartMs, &p.lockedUntilMs); err != nil {
		// A server error here aborted the batch's transaction before the
		// ack ran; a lost connection leaves its result unknown (Unknown).
		_ = br.Close()
		return pgconn.CommandTag{}, err
	}
	*q.probe = p
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (q probedAck) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return q.conn.QueryRow(ctx, sql, args...)
}

func (d *dispatcher) abandon(ctx context.Context, it *fetched, delay time.Duration) {
	t, err := d.call(ctx, kindAbandon, func(conn *pgx.Conn, now int64) error {
		_, err := d.client.Abandon(ctx, conn, it.LockToken, now, delay.Milliseconds(), false)
		return err
	})
	d.log.Add(Event{Dispatcher: d.id, Kind: kindAbandon, Instance: it.InstanceID, Token: it.LockToken,
		CallerBeforeMs: t.before, CallerAfterMs: t.after, LatencyUs: t.latencyUs, AttemptCount: it.AttemptCount,
		Messages: it.ids, Outcome: outcome(err)})
}

// startRenewal starts the renewal task of a turn, see
// renewal.Start.
func (d *dispatcher) startRenewal(ctx context.Context, it *fetched) func() {
	return renewal.Start(ctx, d.cfg.LockTimeout, func(rctx context.Context, extendSecs int64) (func(), error) {
		t, err := d.call(rctx, kindRenew, func(conn *pgx.Conn, now int64) error {
			return d.client.Renew(rctx, conn, it.LockToken, now, extendSecs)
		})
		return func() {
			d.log.Add(Event{Dispatcher: d.id, Kind: kindRenew, Instance: it.InstanceID, Token: it.LockToken,
				CallerBeforeMs: t.before, CallerAfterMs: t.after, LatencyUs: t.latencyUs, AttemptCount: it.AttemptCount,
				Outcome: outcome(err)})
		}, err
	})
}

func outcome(err error) string {
	var lost *lostConnError
	switch {
	case err == nil:
		return OutcomeOK
	case errors.As(err, &lost):
		return Unknown(err)
	case orch.IsInvalidLockToken(err) || isRenewRefused(err):
		return OutcomeInvalidLockToken
	default:
		return err.Error()
	}
}

func isRenewRefused(err error) bool {
	return orch.SQLState(err) == "P0001" && strings.Contains(err.Error(), "Lock token invalid")
}

// retryable is duroxide-pg's classification: deadlocks (40P01),
// invalidated cached plans (0A000) and I/O errors (a lost connection, on
// which the dispatcher connects again) are retried.
func retryable(err error) bool {
	var lost *lostConnError
	if errors.As(err, &lost) {
		return true
	}
	switch orch.SQLState(err) {
	case "40P01", "0A000":
		return true
	}
	return false
}
