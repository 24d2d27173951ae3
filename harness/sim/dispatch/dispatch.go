// Package dispatch simulates duroxide's orchestration dispatchers against a
// duroxide-pg schema, the way the runtime drives the provider (see
// /work/shared/spec/runtime-facts.md, §1):
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
//   - fetch errors back off 200 ms … 3 s (retryable) or 100 ms (permanent).
//
// Every call is recorded as an Event in a Log that Summarize reduces, and
// every message carries a unique id so that Conservation can prove nothing
// was lost or delivered twice.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/harness/sim/orch"
)

// Config describes a simulation. Zero fields take the defaults of
// WithDefaults.
type Config struct {
	// Schema holds the duroxide-pg objects (required).
	Schema string `json:"schema"`
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
	// LockTimeout is the runtime's orchestrator_lock_timeout. Default 5 s
	// (the runtime's); the organic scenario uses much less.
	LockTimeout time.Duration `json:"lock_timeout_ns"`
	// PollInterval is dispatcher_min_poll_interval. Default 100 ms.
	PollInterval time.Duration `json:"poll_interval_ns"`
	// TurnTime is how long a turn runs between fetch and ack. Default 0.
	TurnTime time.Duration `json:"turn_time_ns"`
	// Duration is how long Run lets the dispatchers work. Default 10 s.
	Duration time.Duration `json:"duration_ns"`
	// Skew spreads the dispatchers' clocks uniformly over [-Skew, +Skew]:
	// dispatcher i of n runs -Skew + 2*Skew*i/(n-1) ahead of the wall clock.
	// Default 0.
	Skew time.Duration `json:"skew_ns"`
	// MaxAttempts is the runtime's max_attempts: a batch whose attempt_count
	// exceeds it is poisoned. Default 10.
	MaxAttempts int `json:"max_attempts"`
	// ConnectDSN, when not empty, is what the dispatchers connect with
	// instead of Run's DSN (for example through PgBouncer); seeding and
	// reading the queue keep Run's DSN.
	ConnectDSN string `json:"-"`
}

// Defaults.
const (
	DefaultDispatchers   = 16
	DefaultInstances     = 1
	DefaultHistoryEvents = 5000
	DefaultEventBytes    = 250
	DefaultLockTimeout   = 5 * time.Second
	DefaultPollInterval  = 100 * time.Millisecond
	DefaultDuration      = 10 * time.Second
	DefaultMaxAttempts   = 10
)

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	if c.Dispatchers <= 0 {
		c.Dispatchers = DefaultDispatchers
	}
	if c.Instances <= 0 {
		c.Instances = DefaultInstances
	}
	if c.HistoryEvents <= 0 {
		c.HistoryEvents = DefaultHistoryEvents
	}
	if c.EventBytes <= 0 {
		c.EventBytes = DefaultEventBytes
	}
	if c.LockTimeout <= 0 {
		c.LockTimeout = DefaultLockTimeout
	}
	if c.PollInterval <= 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.Duration <= 0 {
		c.Duration = DefaultDuration
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	return c
}

// Validate rejects a config that cannot run.
func (c Config) Validate() error {
	switch {
	case c.Schema == "":
		return errors.New("dispatch: Config.Schema is empty")
	case c.LockTimeout < time.Millisecond:
		return fmt.Errorf("dispatch: LockTimeout %v is under 1 ms", c.LockTimeout)
	case c.TurnTime < 0 || c.Skew < 0:
		return errors.New("dispatch: TurnTime and Skew must not be negative")
	}
	return nil
}

// RenewalInterval is the runtime's renewal period for a lock timeout: for
// timeouts of 15 s or more, timeout minus the 2 s buffer (at least 1 s);
// below, ceil(timeout/2) in whole seconds, at least 1 s.
func RenewalInterval(timeout time.Duration) time.Duration {
	const buffer = 2 * time.Second
	if timeout >= 15*time.Second {
		return max(timeout-min(buffer, timeout), time.Second)
	}
	half := math.Max(math.Ceil(timeout.Seconds()*0.5), 1)
	return time.Duration(half) * time.Second
}

// RenewExtendSecs is what duroxide-pg passes to
// renew_orchestration_item_lock: the timeout truncated to whole seconds
// (0 for a sub-second timeout).
func RenewExtendSecs(timeout time.Duration) int64 { return int64(timeout / time.Second) }

// SkewFor is dispatcher i's clock offset (of n).
func (c Config) SkewFor(i, n int) time.Duration {
	if c.Skew == 0 || n <= 1 {
		return 0
	}
	return -c.Skew + time.Duration(float64(2*c.Skew)*float64(i)/float64(n-1))
}

// shutdownGrace is how long a turn in progress may go on after the run's
// context is cancelled (the runtime's shutdown(None) waits 1 s before it
// aborts the workers).
const shutdownGrace = time.Second

// Run seeds nothing: it runs cfg.Dispatchers dispatchers against dsn for
// cfg.Duration (or until ctx is cancelled) and returns their log. Every
// connection is closed and every goroutine has ended when it returns.
func Run(ctx context.Context, dsn string, cfg Config) (*Log, error) {
	log := NewLog()
	return log, RunLog(ctx, dsn, cfg, log)
}

// RunLog is Run recording into a log the caller already holds (to watch it
// while it runs).
func RunLog(ctx context.Context, dsn string, cfg Config, log *Log) error {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.ConnectDSN != "" {
		dsn = cfg.ConnectDSN
	}
	connCfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("dispatch: parse DSN: %w", err)
	}
	// Connect everybody first, so the run starts with all dispatchers ready.
	conns := make([]*pgx.Conn, cfg.Dispatchers)
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close(context.Background())
			}
		}
	}()
	for i := range conns {
		if conns[i], err = pgx.ConnectConfig(ctx, connCfg.Copy()); err != nil {
			return fmt.Errorf("dispatch: connect dispatcher %d: %w", i+1, err)
		}
	}

	runCtx, stop := context.WithTimeout(ctx, cfg.Duration)
	defer stop()
	// Turns in progress may finish (and ack) for shutdownGrace after the run
	// ends, as the runtime lets them.
	turnCtx, stopTurns := context.WithCancel(context.WithoutCancel(ctx))
	graceDone := make(chan struct{})
	defer func() {
		stopTurns()
		<-graceDone
	}()
	go func() {
		defer close(graceDone)
		select {
		case <-runCtx.Done():
			t := time.NewTimer(shutdownGrace)
			defer t.Stop()
			select {
			case <-t.C:
			case <-turnCtx.Done():
			}
		case <-turnCtx.Done():
		}
		stopTurns()
	}()

	log.MarkStart()
	var wg sync.WaitGroup
	for i, c := range conns {
		d := &dispatcher{
			id:     i + 1,
			cfg:    cfg,
			client: orch.New(cfg.Schema),
			conn:   c,
			skewMs: cfg.SkewFor(i, cfg.Dispatchers).Milliseconds(),
			log:    log,
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.loop(runCtx, turnCtx)
		}()
	}
	wg.Wait()
	log.MarkStop()
	if err := ctx.Err(); err != nil {
		return err
	}
	return nil
}

type dispatcher struct {
	id     int
	cfg    Config
	client orch.Client
	skewMs int64
	log    *Log

	connMu sync.Mutex // the turn's calls and the renewal task share conn
	conn   *pgx.Conn
	seq    int // messages enqueued by this dispatcher
}

// now is the dispatcher's clock: the wall clock plus its skew, in epoch ms.
func (d *dispatcher) now() int64 { return time.Now().UnixMilli() + d.skewMs }

// call runs f on the connection, timing it with the dispatcher's clock.
func (d *dispatcher) call(f func(nowMs int64) error) (before, after, latencyUs int64, err error) {
	d.connMu.Lock()
	defer d.connMu.Unlock()
	start := time.Now()
	before = d.now()
	err = f(before)
	latencyUs = time.Since(start).Microseconds()
	after = d.now()
	return
}

// loop is one orchestration worker (runtime-facts §1.2).
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
			sleep(runCtx, backoff)
			continue
		}
		consecutiveRetryable = 0
		if it == nil {
			if rest := d.cfg.PollInterval - time.Since(iterStart); rest > 0 {
				sleep(runCtx, rest)
			}
			continue
		}
		d.turn(turnCtx, it)
	}
}

// fetch calls fetch_orchestration_item like duroxide-pg: up to 4 attempts,
// a fresh p_now_ms each, sleeping 50 ms × attempt after a retryable error.
// A returned row is followed by a read of its lease.
func (d *dispatcher) fetch(ctx context.Context) (*fetched, error) {
	timeoutMs := d.cfg.LockTimeout.Milliseconds()
	for attempt := 0; ; attempt++ {
		var it *orch.Item
		before, after, lat, err := d.call(func(now int64) error {
			var err error
			it, err = d.client.Fetch(ctx, d.conn, now, timeoutMs, orch.RuntimeFilter())
			return err
		})
		ev := Event{Dispatcher: d.id, Kind: KindFetch, CallerBeforeMs: before, CallerAfterMs: after, LatencyUs: lat}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			ev.Outcome = err.Error()
			d.log.Add(ev)
			if retryable(err) && attempt < 3 {
				sleep(ctx, time.Duration(50*(attempt+1))*time.Millisecond)
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
		// The lease as stored, read right away (same connection).
		d.connMu.Lock()
		lease, lerr := d.client.ReadLease(context.WithoutCancel(ctx), d.conn, it.LockToken)
		d.connMu.Unlock()
		ev.DBReturnMs = it.DBReturnMs
		if lerr == nil {
			ev.DBAtReturnMs = lease.DBNowMs
			ev.DeliveryMs = lease.DBNowMs - it.DBReturnMs
			if lease.LockedUntilMs == 0 {
				ev.LeaseLost = true
			} else {
				ev.LockedUntilMs = lease.LockedUntilMs
				ev.RemainingMs = lease.LockedUntilMs - after
				ev.LeaseAgeMs = timeoutMs - ev.RemainingMs
			}
		} else {
			ev.LeaseLost = true
			ev.Outcome = OutcomeOK + " (lease not read: " + lerr.Error() + ")"
		}
		ids, derr := MessageIDs(it.Messages)
		ev.Messages = ids
		d.log.Add(ev)
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

type fetched struct {
	*orch.Item
	ids     []string
	history historyFacts
}

// turn processes one fetched item (runtime-facts §1.2 step 3, §1.5).
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
		sleep(ctx, d.cfg.TurnTime)
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
		items = append(items, externalRaised(it.InstanceID, nid)...)
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

// poison acks the batch as poison (runtime-facts §1.8); its result is
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
			sleep(ctx, time.Duration(50*(provAttempt+1))*time.Millisecond)
		}
		if err == nil || !retryable(err) || runtimeAttempt == 5 || ctx.Err() != nil {
			return err
		}
		sleep(ctx, time.Duration(10<<runtimeAttempt)*time.Millisecond)
	}
}

func (d *dispatcher) ackOnce(ctx context.Context, it *fetched, kind Kind, a orch.Ack, enqueued []string, detail string) error {
	before, after, lat, err := d.call(func(now int64) error {
		return d.client.AckItem(ctx, d.conn, it.LockToken, now, a)
	})
	ev := Event{Dispatcher: d.id, Kind: kind, Instance: it.InstanceID, Token: it.LockToken,
		CallerBeforeMs: before, CallerAfterMs: after, LatencyUs: lat, AttemptCount: it.AttemptCount,
		Messages: it.ids, Detail: detail, Outcome: outcome(err)}
	if err == nil {
		ev.Enqueued = enqueued
	}
	d.log.Add(ev)
	return err
}

func (d *dispatcher) abandon(ctx context.Context, it *fetched, delay time.Duration) {
	before, after, lat, err := d.call(func(now int64) error {
		_, err := d.client.Abandon(ctx, d.conn, it.LockToken, now, delay.Milliseconds(), false)
		return err
	})
	d.log.Add(Event{Dispatcher: d.id, Kind: KindAbandon, Instance: it.InstanceID, Token: it.LockToken,
		CallerBeforeMs: before, CallerAfterMs: after, LatencyUs: lat, AttemptCount: it.AttemptCount,
		Messages: it.ids, Outcome: outcome(err)})
}

// startRenewal starts the renewal task of a turn (runtime-facts §1.4): the
// first renewal one interval after the fetch, each extending to now + the
// timeout in whole seconds, stopping for good at the first error. The
// returned function stops it and waits for it.
func (d *dispatcher) startRenewal(ctx context.Context, it *fetched) func() {
	interval := RenewalInterval(d.cfg.LockTimeout)
	extend := RenewExtendSecs(d.cfg.LockTimeout)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-tick.C:
			}
			before, after, lat, err := d.call(func(now int64) error {
				return d.client.Renew(rctx, d.conn, it.LockToken, now, extend)
			})
			if rctx.Err() != nil && err != nil {
				return
			}
			d.log.Add(Event{Dispatcher: d.id, Kind: KindRenew, Instance: it.InstanceID, Token: it.LockToken,
				CallerBeforeMs: before, CallerAfterMs: after, LatencyUs: lat, AttemptCount: it.AttemptCount,
				Outcome: outcome(err)})
			if err != nil {
				return
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

func outcome(err error) string {
	switch {
	case err == nil:
		return OutcomeOK
	case orch.IsInvalidLockToken(err) || isRenewRefused(err):
		return OutcomeInvalidLockToken
	default:
		return err.Error()
	}
}

func isRenewRefused(err error) bool {
	return orch.SQLState(err) == "P0001" && strings.Contains(err.Error(), "Lock token invalid")
}

// retryable is duroxide-pg's classification: deadlocks (40P01) and
// invalidated cached plans (0A000) are retried; I/O and pool errors would
// be too, but a lost connection here ends the dispatcher's usefulness, so
// they back off like the runtime and keep failing visibly.
func retryable(err error) bool {
	switch orch.SQLState(err) {
	case "40P01", "0A000":
		return true
	}
	return false
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
