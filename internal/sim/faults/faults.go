// Package faults runs simulated orchestration dispatchers against a
// duroxide-pg schema while injecting faults, and checks the invariants of
// package invariant on the run's log.
//
// The dispatchers are package dispatch's (its one loop: fetch with the
// caller's clock and the runtime's version filter, the pinned-version
// check, lock renewal, poison past max_attempts, a turn that appends the
// received events and enqueues the instance's next message in its ack, a
// fail_ack after a refused ack); this package only injects the faults,
// through dispatch.Hooks. As in dispatch, a dispatcher whose connection is
// lost connects again (here with backoff), and a call whose connection was
// lost is recorded with an unknown outcome (invariant.IsUnknown, which tests for its prefix)
// and retried on the new connection when it is an ack.
//
// Faults (Config): backends terminated with pg_terminate_backend while a
// fetch or an ack runs, dispatchers that crash after a fetch (they drop the
// lease, disconnect and come back), low statement_timeout and lock_timeout
// on the dispatcher sessions, server restarts, and per-dispatcher clock
// skew (dispatch.Config.Skews).
package faults

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/clock"
	"github.com/duroxide-pg/migrations/internal/sim/defaults"
	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
	"github.com/duroxide-pg/migrations/internal/sim/invariant"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/sim/simconfig"
)

// Config describes one run: the dispatchers' (dispatch.Config, whose
// Schema Run EMPTIES with dispatch.Seed, and whose Skews set each
// dispatcher's clock) and the faults. Zero fields take the defaults of
// WithDefaults.
type Config struct {
	dispatch.Config
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
}

// WithDefaults fills the zero fields: 4 dispatchers on 3 instances of 20
// events of about 100 bytes, lock timeout 500 ms, polls every 25 ms, runs
// 3 s; turns in progress get 2 lock timeouts + 2 s after the run (acks
// that reconnect may take that long); the rest are dispatch's defaults.
func (c Config) WithDefaults() Config {
	defaults.Set(&c.Dispatchers, 4)
	defaults.Set(&c.Instances, 3)
	defaults.Set(&c.HistoryEvents, 20)
	defaults.Set(&c.EventBytes, 100)
	defaults.Set(&c.LockTimeout, defaultLockTimeout)
	defaults.Set(&c.PollInterval, 25*time.Millisecond)
	defaults.Set(&c.Duration, 3*time.Second)
	defaults.Set(&c.ShutdownGrace, 2*c.LockTimeout+2*time.Second)
	defaults.Set(&c.CrashPause, 50*time.Millisecond)
	c.Config = c.Config.WithDefaults()
	if c.RandSeed == 0 {
		c.RandSeed = uint64(time.Now().UnixNano())
	}
	return c
}

// Validate rejects a config that cannot run.
func (c Config) Validate() error {
	if err := c.Config.Validate(); err != nil {
		return fmt.Errorf("faults: %w", err)
	}
	switch {
	case c.KillEvery < 0 || c.StatementTimeout < 0 || c.SessionLockTimeout < 0 || c.CrashPause < 0:
		return errors.New("faults: durations must not be negative")
	case c.CrashProb < 0 || c.CrashProb > 1:
		return fmt.Errorf("faults: CrashProb %v is not in [0, 1]", c.CrashProb)
	case c.Restarts > 0 && c.Restart == nil:
		return errors.New("faults: Restarts needs Restart")
	}
	return nil
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
	// Reconnects the new connections made after that (or after a crash).
	ConnLost   int64 `json:"conn_lost"`
	Reconnects int64 `json:"reconnects"`
}

// Total is every fault injected.
func (c Counts) Total() int64 { return c.KillsInjected + c.Crashes + c.Timeouts + c.Restarts }

// Add adds o's counts to c's.
func (c *Counts) Add(o Counts) {
	c.KillsInjected += o.KillsInjected
	c.KillsMidFetch += o.KillsMidFetch
	c.KillsMidAck += o.KillsMidAck
	c.Crashes += o.Crashes
	c.Timeouts += o.Timeouts
	c.Restarts += o.Restarts
	c.ConnLost += o.ConnLost
	c.Reconnects += o.Reconnects
}

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

// Run seeds cfg.Schema (emptying it), runs the dispatchers with the faults
// for cfg.Duration, reads what is still pending and checks the invariants.
// The error is for a run that could not be made; violations are in
// Result.Report.
func Run(ctx context.Context, src *dbconn.Source, cfg Config, checks Checks) (*Result, error) {
	cfg, err := simconfig.Ready(cfg)
	if err != nil {
		return nil, err
	}
	seed, err := dispatch.Seed(ctx, src, cfg.Config)
	if err != nil {
		return nil, fmt.Errorf("faults: %w", err)
	}
	// Make the seeded messages visible to clocks far behind, too.
	if err := execOnce(ctx, src, "UPDATE "+pgx.Identifier{cfg.Schema, "orchestrator_queue"}.Sanitize()+
		" SET visible_at = visible_at - interval '1 hour'"); err != nil {
		return nil, fmt.Errorf("faults: seed: %w", err)
	}
	via := src
	if cfg.Via != nil {
		via = cfg.Via
	}
	adminCfg := via.Config()

	inj := newInjector(cfg, adminCfg)
	dcfg := cfg.Config
	dcfg.Hooks = inj.hooks()
	log := dispatch.NewLog()
	if err := dispatch.RunLog(ctx, src, dcfg, log); err != nil {
		return nil, fmt.Errorf("faults: %w", err)
	}
	elapsed := log.Elapsed()

	pending, err := pendingAfterRun(ctx, src, cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("faults: read pending messages: %w", err)
	}
	events := log.Events()
	skew := map[int]time.Duration{}
	for i := range cfg.Dispatchers {
		skew[i+1] = cfg.SkewFor(i, cfg.Dispatchers)
	}
	counts := inj.cnt.snapshot()
	// Faults that may raise attempt_count: a crash raises it on its
	// instance by one, a kill or a restart that lands after a fetch
	// committed raises it on some instance by one.
	extra := map[string]int{"": int(counts.KillsMidFetch) + int(counts.Restarts)*cfg.Dispatchers}
	for _, e := range events {
		if e.Kind == dispatch.KindFetch && e.Detail == dispatch.DetailCrashed {
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

// pendingAfterRun reads the messages still queued, retrying for up to 10 s
// while the server may still be coming back from a restart.
func pendingAfterRun(ctx context.Context, src *dbconn.Source, schema string) ([]string, error) {
	for attempt := 0; ; attempt++ {
		pending, err := dispatch.PendingMessages(ctx, src, schema)
		if err == nil || attempt == 50 || ctx.Err() != nil {
			return pending, err
		}
		clock.Sleep(ctx, 200*time.Millisecond)
	}
}

func execOnce(ctx context.Context, src *dbconn.Source, stmt string) error {
	conn, err := src.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, stmt)
	return err
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

// injector holds a run's fault schedule and what the killer needs to know
// of each dispatcher; its hooks go into dispatch.Config.Hooks.
type injector struct {
	cfg      Config
	adminCfg *pgx.ConnConfig
	cnt      counters
	rng      *rand.Rand // the killer's
	ds       []dispatcherState
}

// dispatcherState is one dispatcher as the injector sees it.
type dispatcherState struct {
	phase     atomic.Int32
	pid       atomic.Uint32 // the backend of the call in progress
	connected atomic.Bool   // has connected before (the next connect is a reconnect)
	// crashRng draws the dispatcher's crashes (only its own goroutine
	// asks).
	crashRng *rand.Rand
}

func newInjector(cfg Config, adminCfg *pgx.ConnConfig) *injector {
	inj := &injector{cfg: cfg, adminCfg: adminCfg, ds: make([]dispatcherState, cfg.Dispatchers),
		rng: rand.New(rand.NewPCG(cfg.RandSeed, 0x9e3779b97f4a7c15))}
	for i := range inj.ds {
		inj.ds[i].crashRng = rand.New(rand.NewPCG(cfg.RandSeed, uint64(i+1)))
	}
	return inj
}

func (inj *injector) hooks() dispatch.Hooks {
	h := dispatch.Hooks{Connect: inj.connect, Call: inj.call, During: inj.during}
	if inj.cfg.CrashProb > 0 {
		h.Crash = inj.crash
	}
	return h
}

// connect connects with the session timeouts, backing off (20 ms … 1 s)
// until it succeeds or ctx ends.
func (inj *injector) connect(ctx context.Context, dispatcher int, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	if inj.cfg.StatementTimeout > 0 {
		cfg.RuntimeParams["statement_timeout"] = strconv.FormatInt(max(inj.cfg.StatementTimeout.Milliseconds(), 1), 10)
	}
	if inj.cfg.SessionLockTimeout > 0 {
		cfg.RuntimeParams["lock_timeout"] = strconv.FormatInt(max(inj.cfg.SessionLockTimeout.Milliseconds(), 1), 10)
	}
	st := &inj.ds[dispatcher-1]
	backoff := 20 * time.Millisecond
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := pgx.ConnectConfig(cctx, cfg)
		cancel()
		if err == nil {
			if st.connected.Swap(true) {
				inj.cnt.reconnects.Add(1)
			}
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		clock.Sleep(ctx, backoff)
		backoff = min(2*backoff, time.Second)
	}
}

// call shows the killer a dispatcher's fetch or ack and its backend while
// it runs, and counts the timeouts and the lost connections.
func (inj *injector) call(dispatcher int, kind dispatch.Kind, pid uint32) func(error, bool) {
	st := &inj.ds[dispatcher-1]
	switch kind {
	case dispatch.KindFetch:
		st.phase.Store(phaseFetch)
	case dispatch.KindAck, dispatch.KindFailAck, dispatch.KindPoison:
		st.phase.Store(phaseAck)
	}
	st.pid.Store(pid)
	return func(err error, lost bool) {
		st.phase.Store(phaseIdle)
		st.pid.Store(0)
		switch orch.SQLState(err) {
		case "57014", "55P03":
			inj.cnt.timeouts.Add(1)
		}
		if lost {
			inj.cnt.connLost.Add(1)
		}
	}
}

// crash draws whether a dispatcher crashes after its fetch.
func (inj *injector) crash(dispatcher int) (time.Duration, bool) {
	if inj.ds[dispatcher-1].crashRng.Float64() >= inj.cfg.CrashProb {
		return 0, false
	}
	inj.cnt.crashes.Add(1)
	return inj.cfg.CrashPause, true
}

// during runs the killer and the restarter for the run, and waits for
// them.
func (inj *injector) during(ctx context.Context) error {
	var wg sync.WaitGroup
	if inj.cfg.KillEvery > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inj.killer(ctx)
		}()
	}
	var restartErr error
	if inj.cfg.Restarts > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			restartErr = inj.restarter(ctx)
		}()
	}
	wg.Wait()
	return restartErr
}

// killer terminates the backend of a dispatcher inside a fetch or an ack,
// about every KillEvery (uniformly 0.5x-1.5x).
func (inj *injector) killer(ctx context.Context) {
	var admin *pgx.Conn
	defer func() {
		if admin != nil {
			_ = admin.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		clock.Sleep(ctx, time.Duration(float64(inj.cfg.KillEvery)*(0.5+inj.rng.Float64())))
		want := phaseFetch
		if inj.rng.IntN(2) == 1 {
			want = phaseAck
		}
		pid := inj.waitForPhase(ctx, want, 500*time.Millisecond)
		if pid == 0 {
			continue
		}
		if admin == nil || admin.IsClosed() {
			var err error
			if admin, err = pgx.ConnectConfig(ctx, inj.adminCfg.Copy()); err != nil {
				admin = nil
				continue
			}
		}
		var ok bool
		if err := admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", int64(pid)).Scan(&ok); err != nil || !ok {
			continue
		}
		inj.cnt.kills.Add(1)
		switch want {
		case phaseFetch:
			inj.cnt.killsFetch.Add(1)
		case phaseAck:
			inj.cnt.killsAck.Add(1)
		}
	}
}

// waitForPhase waits (up to limit) for a dispatcher, picked at random, in
// phase want, and returns its backend's pid (0: none).
func (inj *injector) waitForPhase(ctx context.Context, want int32, limit time.Duration) uint32 {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		off := inj.rng.IntN(len(inj.ds))
		for k := range inj.ds {
			st := &inj.ds[(off+k)%len(inj.ds)]
			if st.phase.Load() == want {
				if p := st.pid.Load(); p != 0 {
					return p
				}
			}
		}
		clock.Sleep(ctx, 100*time.Microsecond)
	}
	return 0
}

// restarter restarts the server Restarts times, evenly over the run.
func (inj *injector) restarter(ctx context.Context) error {
	gap := inj.cfg.Duration / time.Duration(inj.cfg.Restarts+1)
	for range inj.cfg.Restarts {
		clock.Sleep(ctx, gap)
		if ctx.Err() != nil {
			return nil
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		err := inj.cfg.Restart(rctx)
		cancel()
		if err != nil {
			return fmt.Errorf("faults: restart the server: %w", err)
		}
		inj.cnt.restarts.Add(1)
	}
	return nil
}
