package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/clock"
	"github.com/duroxide-pg/migrations/internal/sim/defaults"
	"github.com/duroxide-pg/migrations/internal/sim/renewal"
	"github.com/duroxide-pg/migrations/internal/sim/simconfig"
)

// Config describes a simulation. Zero fields of the shape (runtimes, slots,
// items, timeouts, poll interval, duration) take the defaults of
// WithDefaults; zero activity times, skew, sessions and tags mean none.
// Its LockTimeout (simconfig.Common) is the worker lock timeout, default 2 s.
type Config struct {
	simconfig.Common
	// Runtimes is the number of simulated runtimes (hosts): each has its
	// own clock (see SkewBehind), Slots worker slots and, when Sessions >
	// 0, one session renewal loop. Default 4.
	Runtimes int `json:"runtimes"`
	// Slots is the number of worker slots (worker_concurrency) per runtime,
	// each with its own connection and, when Sessions > 0, its own session
	// owner id. Default 4.
	Slots int `json:"slots"`
	// Items is the backlog Seed enqueues. Default 400.
	Items int `json:"items"`
	// Sessions is the number of sessions the session-bound items are
	// spread over (0: no session-bound item, and the workers fetch without
	// an owner).
	Sessions int `json:"sessions"`
	// Tagged mixes tagged items ("gpu", "io") into the backlog and gives
	// the slots different tag filters (any; default_and {gpu}; default_only;
	// tags {gpu, io}). Otherwise every item is untagged and every slot
	// fetches default_only.
	Tagged bool `json:"tagged"`
	// Refill replaces each completed item with a new one of the same shape,
	// so the backlog stays as deep as seeded.
	Refill bool `json:"refill"`
	// StopWhenDone ends the run as soon as every seeded item is completed
	// (without Refill).
	StopWhenDone bool `json:"stop_when_done"`
	// SessionLockTimeout is the session lease passed to fetch and renewed
	// by renew_session_lock. Default LockTimeout.
	SessionLockTimeout time.Duration `json:"session_lock_timeout_ns"`
	// SessionIdle is renew_session_lock's idle timeout. Default 4 x
	// SessionLockTimeout.
	SessionIdle time.Duration `json:"session_idle_ns"`
	// SessionRenewEvery is each runtime's session renewal period, and
	// CleanupEvery its cleanup_orphaned_sessions period. Defaults
	// SessionLockTimeout/4 and LockTimeout.
	SessionRenewEvery time.Duration `json:"session_renew_every_ns"`
	CleanupEvery      time.Duration `json:"cleanup_every_ns"`
	// ShortActivity is the longest short activity (uniform in [0, it]);
	// every LongEvery-th activity on average (0: none) is long instead,
	// uniform in [LongActivityMin, LongActivityMax], and its lease is
	// renewed every renewal.Interval(LockTimeout) while it runs.
	ShortActivity   time.Duration `json:"short_activity_ns"`
	LongEvery       int           `json:"long_every"`
	LongActivityMin time.Duration `json:"long_activity_min_ns"`
	LongActivityMax time.Duration `json:"long_activity_max_ns"`
	// SkewBehind and SkewAhead spread the runtimes' clocks over
	// [-SkewBehind, +SkewAhead]: runtime i of n runs
	// -SkewBehind + (SkewBehind+SkewAhead)*i/(n-1) ahead of the wall clock.
	SkewBehind time.Duration `json:"skew_behind_ns"`
	SkewAhead  time.Duration `json:"skew_ahead_ns"`
	// WatchLocks samples pg_stat_activity every 5 ms for fetches waiting on
	// a lock, and marks those fetches Blocked.
	WatchLocks bool `json:"watch_locks"`
	// NoLeaseRead skips reading each lease after its fetch (benchmarks):
	// RemainingMs and DeadAtReturn are then unknown.
	NoLeaseRead bool `json:"no_lease_read"`
	// RandSeed seeds the activity times (default 1).
	RandSeed int64 `json:"rand_seed"`
}

// Defaults.
const (
	DefaultRuntimes     = 4
	defaultSlots        = 4
	defaultItems        = 400
	DefaultLockTimeout  = 2 * time.Second
	defaultPollInterval = simconfig.DefaultPollInterval
	defaultDuration     = simconfig.DefaultDuration
	// lockWatchInterval is how often WatchLocks samples.
	lockWatchInterval = 5 * time.Millisecond
)

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	defaults.Set(&c.Runtimes, DefaultRuntimes)
	defaults.Set(&c.Slots, defaultSlots)
	defaults.Set(&c.Items, defaultItems)
	c.Common = c.Common.WithDefaults(DefaultLockTimeout)
	defaults.Set(&c.SessionLockTimeout, c.LockTimeout)
	defaults.Set(&c.SessionIdle, 4*c.SessionLockTimeout)
	defaults.Set(&c.SessionRenewEvery, c.SessionLockTimeout/4)
	defaults.Set(&c.CleanupEvery, c.LockTimeout)
	if c.RandSeed == 0 {
		c.RandSeed = 1
	}
	return c
}

// Validate rejects a config that cannot run.
func (c Config) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	switch {
	case c.Sessions < 0 || c.LongEvery < 0 || c.Runtimes < 0 || c.Slots < 0 || c.Items < 0:
		return errors.New("worker: Runtimes, Slots, Items, Sessions and LongEvery must not be negative")
	case c.SessionLockTimeout < 0 || c.SessionIdle < 0 || c.SessionRenewEvery < 0 || c.CleanupEvery < 0:
		return errors.New("worker: SessionLockTimeout, SessionIdle, SessionRenewEvery and CleanupEvery must not be negative")
	case c.ShortActivity < 0 || c.LongActivityMin < 0 || c.LongActivityMax < c.LongActivityMin:
		return errors.New("worker: activity times must be >= 0, LongActivityMax >= LongActivityMin")
	case c.SkewBehind < 0 || c.SkewAhead < 0:
		return errors.New("worker: SkewBehind and SkewAhead must not be negative")
	}
	return nil
}

// SkewFor is runtime i's clock offset (of n): its place in the spread over
// [-SkewBehind, +SkewAhead].
func (c Config) SkewFor(i, n int) time.Duration {
	return clock.Spread(-c.SkewBehind, c.SkewAhead, i, n)
}

// ItemAt is the k-th item of a run (k from 1): the seeded backlog is items
// 1..Items, refills continue the numbering. With sessions and tags, items
// cycle plain, session-bound, tagged, session-bound; with sessions only,
// plain and session-bound; with tags only, plain and tagged. Session-bound
// items are untagged; tags alternate "gpu" and "io"; session j of the k-th
// item is (k/4) mod Sessions, so every session has items all along the
// queue.
func (c Config) ItemAt(k int64) Item {
	it := Item{ID: fmt.Sprintf("w-%d", k), Instance: fmt.Sprintf("winst-%d", k%64), ActivityID: k}
	session := func() string { return fmt.Sprintf("s-%d", (k/4)%int64(c.Sessions)) }
	tag := func() string { return []string{"gpu", "io"}[(k/4)%2] }
	switch {
	case c.Sessions > 0 && c.Tagged:
		switch k % 4 {
		case 1, 3:
			it.SessionID = session()
		case 2:
			it.Tag = tag()
		}
	case c.Sessions > 0:
		if k%2 == 1 {
			it.SessionID = session()
		}
	case c.Tagged:
		if k%2 == 1 {
			it.Tag = tag()
		}
	}
	return it
}

// FilterFor is slot g's tag filter (g counts the slots of every runtime).
func (c Config) FilterFor(g int) Filter {
	if !c.Tagged {
		return Filter{Mode: ModeDefaultOnly}
	}
	switch g % 4 {
	case 0:
		return Filter{Mode: modeAny}
	case 1:
		return Filter{Mode: modeDefaultAnd, Tags: []string{"gpu"}}
	case 2:
		return Filter{Mode: ModeDefaultOnly}
	default:
		return Filter{Mode: modeTags, Tags: []string{"gpu", "io"}}
	}
}

// OwnerID is the session owner id of slot s of runtime r.
func OwnerID(r, s int) string { return fmt.Sprintf("work-%d-rt%d", s, r) }

// run is one simulation in progress.
type run struct {
	cfg       Config
	client    Client
	log       *Log
	nextItem  atomic.Int64
	completed atomic.Int64
	stop      context.CancelFunc
}

// Run runs cfg against src for cfg.Duration (or until ctx is cancelled, or
// every seeded item is completed with StopWhenDone) and returns the log.
// The schema must be seeded (Seed). Every connection is closed and every
// goroutine has ended when it returns; an activity in progress when the run
// ends is finished and acked first.
func Run(ctx context.Context, src *dbconn.Source, cfg Config) (*Log, error) {
	cfg, err := simconfig.Ready(cfg)
	if err != nil {
		return nil, err
	}
	connCfg := src.Config()
	var conns []*pgx.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close(context.Background())
		}
	}()
	connect := func(what string) (*pgx.Conn, error) {
		c, err := pgx.ConnectConfig(ctx, connCfg.Copy())
		if err != nil {
			return nil, fmt.Errorf("worker: connect %s: %w", what, err)
		}
		conns = append(conns, c)
		return c, nil
	}

	runCtx, stop := context.WithTimeout(ctx, cfg.Duration)
	defer stop()
	r := &run{cfg: cfg, client: NewClient(cfg.Schema), log: newLog(), stop: stop}
	r.nextItem.Store(int64(cfg.Items))

	var slots []*slot
	var runtimes []*runtimeLoop
	for rt := 0; rt < cfg.Runtimes; rt++ {
		hostClock := clock.New(cfg.SkewFor(rt, cfg.Runtimes))
		var owners []string
		for s := 0; s < cfg.Slots; s++ {
			c, err := connect(fmt.Sprintf("runtime %d slot %d", rt, s))
			if err != nil {
				return nil, err
			}
			w := &slot{run: r, runtime: rt, slot: s, conn: c, pid: c.PgConn().PID(), clock: hostClock,
				filter: cfg.FilterFor(rt*cfg.Slots + s), rng: rand.New(rand.NewSource(cfg.RandSeed + int64(rt*cfg.Slots+s)))}
			if cfg.Sessions > 0 {
				w.session = &Session{OwnerID: OwnerID(rt, s), LockTimeoutMs: cfg.SessionLockTimeout.Milliseconds()}
				owners = append(owners, w.session.OwnerID)
			}
			slots = append(slots, w)
		}
		if cfg.Sessions > 0 {
			c, err := connect(fmt.Sprintf("runtime %d sessions", rt))
			if err != nil {
				return nil, err
			}
			runtimes = append(runtimes, &runtimeLoop{run: r, runtime: rt, conn: c, clock: hostClock, owners: owners})
		}
	}
	var watch *lockWatcher
	if cfg.WatchLocks {
		c, err := connect("lock watcher")
		if err != nil {
			return nil, err
		}
		watch = newLockWatcher(c)
	}

	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watchDone := make(chan error, 1)
	if watch != nil {
		go func() { watchDone <- watch.run(watchCtx) }()
	}
	r.log.MarkStart()
	var wg sync.WaitGroup
	for _, rl := range runtimes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rl.loop(runCtx)
		}()
	}
	for _, w := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.loop(runCtx, ctx)
		}()
	}
	wg.Wait()
	r.log.MarkStop()
	if watch != nil {
		stopWatch()
		if err := <-watchDone; err != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("worker: lock watcher: %w", err)
		}
		r.log.Update(watch.attribute)
	}
	if err := ctx.Err(); err != nil {
		return r.log, err
	}
	return r.log, nil
}

// slot is one worker slot: the runtime's activity worker loop.
type slot struct {
	*run
	runtime, slot int
	clock         clock.Skewed
	filter        Filter
	session       *Session
	rng           *rand.Rand

	connMu sync.Mutex // the activity's renewals and the slot's calls share conn
	conn   *pgx.Conn
	pid    uint32
}

func (w *slot) now() int64 { return w.clock.NowMs() }

// call runs f on the connection, timed, with p_now_ms minted just before.
func (w *slot) call(f func(nowMs int64) error) (before, after, latencyUs int64, err error) {
	w.connMu.Lock()
	defer w.connMu.Unlock()
	start := time.Now()
	before = w.now()
	err = f(before)
	latencyUs = time.Since(start).Microseconds()
	after = w.now()
	return
}

func (w *slot) event(kind Kind) Event {
	return Event{Runtime: w.runtime, Slot: w.slot, Kind: kind, PID: w.pid}
}

// loop fetches until runCtx ends: an empty fetch sleeps out the rest of
// the poll interval, an error backs off 100 ms, a row is processed (on ctx,
// so that an activity under way when the run ends is finished and acked).
func (w *slot) loop(runCtx, ctx context.Context) {
	for runCtx.Err() == nil {
		iterStart := time.Now()
		f, err := w.fetch(runCtx)
		switch {
		case err != nil:
			if runCtx.Err() != nil {
				return
			}
			clock.Sleep(runCtx, 100*time.Millisecond)
		case f == nil:
			if rest := w.cfg.PollInterval - time.Since(iterStart); rest > 0 {
				clock.Sleep(runCtx, rest)
			}
		default:
			w.process(ctx, f, iterStart)
		}
	}
}

func (w *slot) fetch(ctx context.Context) (*Fetched, error) {
	var f *Fetched
	var dbReturn int64
	before, after, lat, err := w.call(func(now int64) error {
		var err error
		f, dbReturn, err = w.client.Fetch(ctx, w.conn, now, w.cfg.LockTimeout.Milliseconds(), w.session, w.filter)
		return err
	})
	ev := w.event(kindFetch)
	ev.CallerBeforeMs, ev.CallerAfterMs, ev.LatencyUs, ev.DBReturnMs = before, after, lat, dbReturn
	switch {
	case err != nil && f == nil:
		if ctx.Err() != nil {
			return nil, err // the fetch raced the end of the run
		}
		ev.Outcome = err.Error()
		w.log.Add(ev)
		return nil, err
	case f == nil:
		ev.Outcome = outcomeEmpty
		w.log.Add(ev)
		return nil, nil
	}
	ev.Token, ev.Item, ev.Session, ev.Attempt, ev.Outcome = f.LockToken, f.Item.ID, f.Item.SessionID, f.AttemptCount, OutcomeOK
	if err != nil {
		ev.Outcome = "ok (work item not parsed: " + err.Error() + ")"
	}
	if !w.cfg.NoLeaseRead {
		w.connMu.Lock()
		lease, lerr := w.client.ReadLease(context.WithoutCancel(ctx), w.conn, f.LockToken)
		w.connMu.Unlock()
		switch {
		case lerr != nil:
			ev.LeaseLost = true
			ev.Outcome = OutcomeOK + " (lease not read: " + lerr.Error() + ")"
		case lease.LockedUntilMs == 0:
			ev.LeaseLost, ev.DBAtReadMs = true, lease.DBNowMs
		default:
			ev.LockedUntilMs = lease.LockedUntilMs
			ev.RemainingMs = lease.LockedUntilMs - dbReturn
		}
	}
	w.log.Add(ev)
	return f, nil
}

// activityTime draws the next activity's run time.
func (w *slot) activityTime() time.Duration {
	c := w.cfg
	if c.LongEvery > 0 && w.rng.Intn(c.LongEvery) == 0 {
		return c.LongActivityMin + time.Duration(w.rng.Int63n(int64(c.LongActivityMax-c.LongActivityMin)+1))
	}
	if c.ShortActivity <= 0 {
		return 0
	}
	return time.Duration(w.rng.Int63n(int64(c.ShortActivity) + 1))
}

// process runs the activity, renewing its lease while it runs long, then
// acks it with its completion; with Refill a completed item is replaced.
func (w *slot) process(ctx context.Context, f *Fetched, fetchStart time.Time) {
	stopRenew := w.startRenewal(ctx, f)
	clock.Sleep(ctx, w.activityTime())
	stopRenew()

	before, after, lat, err := w.call(func(now int64) error {
		return w.client.Ack(ctx, w.conn, f.LockToken, f.Item.Instance, f.Item.Completion(), now)
	})
	ev := w.event(KindAck)
	ev.Item, ev.Session, ev.Token = f.Item.ID, f.Item.SessionID, f.LockToken
	ev.CallerBeforeMs, ev.CallerAfterMs, ev.LatencyUs = before, after, lat
	ev.CycleUs = time.Since(fetchStart).Microseconds()
	ev.Outcome = outcome(err, IsNotFound)
	if ev.Outcome == outcomeRefused {
		// Refused while its lease was valid, or after it was lost: the
		// token's lease as it stands right after the refusal says which.
		w.connMu.Lock()
		lease, lerr := w.client.ReadLease(context.WithoutCancel(ctx), w.conn, f.LockToken)
		w.connMu.Unlock()
		ev.RefusedWhileValid = lerr == nil && lease.LockedUntilMs > max(before, lease.DBNowMs)
	}
	w.log.Add(ev)
	if err != nil {
		return
	}
	if n := w.completed.Add(1); w.cfg.StopWhenDone && n >= int64(w.cfg.Items) {
		w.stop()
	}
	if !w.cfg.Refill {
		return
	}
	next := w.cfg.ItemAt(w.nextItem.Add(1))
	before, after, lat, err = w.call(func(now int64) error { return w.client.Enqueue(ctx, w.conn, next, now) })
	ev = w.event(KindEnqueue)
	ev.Item, ev.Session = next.ID, next.SessionID
	ev.CallerBeforeMs, ev.CallerAfterMs, ev.LatencyUs, ev.Outcome = before, after, lat, outcome(err, nil)
	w.log.Add(ev)
}

// startRenewal renews the item's lease as the runtime does
// (renewal.Start), with the worker lock timeout.
func (w *slot) startRenewal(ctx context.Context, f *Fetched) func() {
	return renewal.Start(ctx, w.cfg.LockTimeout, func(rctx context.Context, extendSecs int64) (func(), error) {
		before, after, lat, err := w.call(func(now int64) error {
			return w.client.RenewItem(rctx, w.conn, f.LockToken, now, extendSecs)
		})
		return func() {
			ev := w.event(kindRenew)
			ev.Item, ev.Session, ev.Token = f.Item.ID, f.Item.SessionID, f.LockToken
			ev.CallerBeforeMs, ev.CallerAfterMs, ev.LatencyUs, ev.Outcome = before, after, lat, outcome(err, isRenewRefused)
			w.log.Add(ev)
		}, err
	})
}

// runtimeLoop is one runtime's session upkeep: renew_session_lock for all
// its slots' owner ids every SessionRenewEvery, cleanup_orphaned_sessions
// every CleanupEvery.
type runtimeLoop struct {
	*run
	runtime int
	conn    *pgx.Conn
	clock   clock.Skewed
	owners  []string
}

func (rl *runtimeLoop) loop(ctx context.Context) {
	renew := time.NewTicker(rl.cfg.SessionRenewEvery)
	defer renew.Stop()
	cleanup := time.NewTicker(rl.cfg.CleanupEvery)
	defer cleanup.Stop()
	for {
		kind := kindRenewSession
		select {
		case <-ctx.Done():
			return
		case <-renew.C:
		case <-cleanup.C:
			kind = kindCleanup
		}
		start := time.Now()
		now := rl.clock.NowMs()
		var n int64
		var err error
		if kind == kindRenewSession {
			n, err = rl.client.RenewSessions(ctx, rl.conn, rl.owners, now, rl.cfg.SessionLockTimeout.Milliseconds(), rl.cfg.SessionIdle.Milliseconds())
		} else {
			n, err = rl.client.CleanupSessions(ctx, rl.conn, now)
		}
		if ctx.Err() != nil {
			return
		}
		rl.log.Add(Event{Runtime: rl.runtime, Slot: -1, Kind: kind, PID: rl.conn.PgConn().PID(), CallerBeforeMs: now,
			CallerAfterMs: rl.clock.NowMs(), LatencyUs: time.Since(start).Microseconds(), Count: n,
			Outcome: outcome(err, nil)})
	}
}

func outcome(err error, refused func(error) bool) string {
	switch {
	case err == nil:
		return OutcomeOK
	case refused != nil && refused(err):
		return outcomeRefused
	default:
		return err.Error()
	}
}
