package repro

// The runtime repro, pool-wait form: the seed's symptom with the real
// duroxide runtime and no advisory lock at all. duroxide-pg's fetch loop
// mints its timestamp (now_millis()) and then runs fetch_orchestration_item
// on its sqlx pool (DUROXIDE_PG_POOL_MAX connections): when every pooled
// connection is busy the statement first waits for one, and the timestamp
// is stale by that wait when the function runs. Here the pool is small, a
// backlog of orchestrations is ready (each waiting for an event, the events
// raised in a burst), and another session holds worker_queue's table lock
// for longer than the runtime's orchestration lock timeout, a few times:
// the first statements that touch worker_queue (a worker slot's poll,
// fetch_work_item, or an orchestration's ack) take every pooled connection
// and block on the lock, so the orchestration slots, their timestamps
// minted, wait for a connection. At upstream's latest, and at upstream's
// candidate fix (which measures time only from its own entry), the leases
// those fetches return are already expired and the runtime's acks are
// refused ("Invalid lock token"); the pack's latest computes the lease from
// the later of the caller's clock and the database's, and every ack passes.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/eventlog"
	"github.com/duroxide-pg/migrations/internal/sim/settings"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// PoolAcquireTimeout is how long duroxide-pg's pool lets a statement wait
// for a connection before failing it (sqlx's acquire timeout as the
// provider sets it): a hold as long would turn the stale lease into a
// failed fetch.
const PoolAcquireTimeout = 30 * time.Second

// RuntimePoolConfig is the pool-wait repro's input.
type RuntimePoolConfig struct {
	// Hold is how long the other session holds worker_queue's table lock
	// each time: it must exceed RuntimeLockTimeout, so that a timestamp
	// minted as the hold began is older than a lease when the fetch runs.
	Hold time.Duration
	// Holds is how many times it takes the lock.
	Holds int
	// Gap is the time between two holds, in which the runtime runs: the
	// fetches that waited return, their acks are refused or pass, and the
	// backlog drains a little.
	Gap time.Duration
	// Lead is the time from the last event raised to the first hold: the
	// orchestration slots' next timestamps are minted after every message
	// of the backlog became visible, so their fetches see it.
	Lead time.Duration
	// PoolMax is the provider's pool size (DUROXIDE_PG_POOL_MAX). At most
	// WorkerConcurrency: every pooled connection must end up in a statement
	// blocked on the lock, and the worker slots' polls, every 10 ms, are
	// the ones sure to come.
	PoolMax int
	// Orchestrations is the backlog: instances waiting for an event, each
	// completing in the one turn its event triggers. It must outlast every
	// hold (each hold needs ready messages when the slots mint).
	Orchestrations int
	// OrchestrationConcurrency is the runtime's orchestration slots: each
	// fetches on its own, so each can wait for the pool with a stale
	// timestamp.
	OrchestrationConcurrency int
	// WorkerConcurrency is the runtime's worker slots, each polling
	// fetch_work_item on its own.
	WorkerConcurrency int
}

// RuntimePoolDefaults is the repro's default: a pool of one connection, 16
// orchestration slots and one worker slot, 1,200 orchestrations, 3 holds of
// 6.5 s (1.5 s past the lock timeout), the first 100 ms after the events,
// the others 200 ms apart (time for the fetches that waited to return and
// ack; short, because the runtime drains the backlog meanwhile). A slot
// caught by a hold waits either in its fetch (a stale lease: refused at
// upstream and its candidate) or in its ack (which passes everywhere);
// with 4 slots a hold refused 0 to 3 turns here, with 16 about 8.
func RuntimePoolDefaults() RuntimePoolConfig { return defaultsOf[RuntimePoolConfig]() }

// settings are the runtime pool repro's settings, bound to c: each one's
// default, least value and flag.
func (c *RuntimePoolConfig) settings() *settings.List {
	l := settings.New("runtime pool repro: ")
	l.Duration(&c.Hold, "pool-hold", 6500*time.Millisecond, 0).Flag("pool-hold", fmt.Sprintf(
		"runtime pool form: how long another session holds worker_queue's table lock each time (above the runtime's %v lock timeout, below the pool's %v acquire timeout)", RuntimeLockTimeout, PoolAcquireTimeout))
	l.Int(&c.Holds, "pool-holds", 3, 1).Flag("pool-holds", "runtime pool form: how many times it holds the lock")
	l.Duration(&c.Gap, "gap", 200*time.Millisecond, 0)
	l.Duration(&c.Lead, "lead", 100*time.Millisecond, 0)
	l.Int(&c.PoolMax, "pool", 1, 1)
	l.Int(&c.Orchestrations, "pool-orchestrations", 1200, 0).Flag("pool-orchestrations", "runtime pool form: the backlog of orchestrations, each waiting for an event raised at once")
	l.Int(&c.OrchestrationConcurrency, "orchestration concurrency", 16, 1)
	l.Int(&c.WorkerConcurrency, "worker concurrency", 1, 1)
	return l
}

// Register adds the runtime pool repro's flags to fs, bound to c, its
// values as their defaults.
func (c *RuntimePoolConfig) Register(fs *flag.FlagSet) { c.settings().Register(fs) }

// Validate refuses settings that cannot show the symptom.
func (c RuntimePoolConfig) Validate() error {
	if err := c.settings().Check(); err != nil {
		return err
	}
	switch {
	case c.Hold <= RuntimeLockTimeout:
		return fmt.Errorf("runtime pool repro: the hold (%v) must exceed the runtime's lock timeout (%v)", c.Hold, RuntimeLockTimeout)
	case c.Hold >= PoolAcquireTimeout:
		return fmt.Errorf("runtime pool repro: the hold (%v) must stay below the pool's acquire timeout (%v), or the waiting fetch fails instead", c.Hold, PoolAcquireTimeout)
	case c.PoolMax > c.WorkerConcurrency:
		return fmt.Errorf("runtime pool repro: the pool (%d) must be at least 1 and at most the worker slots (%d), or a connection stays free for the orchestration fetches", c.PoolMax, c.WorkerConcurrency)
	case c.Orchestrations < c.minOrchestrations():
		return fmt.Errorf("runtime pool repro: %d orchestrations cannot outlast %d holds of %d orchestration slots; use at least %d", c.Orchestrations, c.Holds, c.OrchestrationConcurrency, c.minOrchestrations())
	}
	return nil
}

// runtimePoolDrainPerSecond bounds how fast the runtime drains the backlog
// between two holds, measured here (a pool of one connection, 16
// orchestration slots, 2 cores): about 500 orchestrations a second at
// upstream's latest and its candidate, 850 at the pack's latest, and
// 1,300 at the pack's on a clean CI machine (265 drained in one 200 ms
// gap: the second hold of a 400-orchestration run found none ready).
const runtimePoolDrainPerSecond = 2000

// minOrchestrations is the smallest backlog Validate accepts: what the
// runtime drains before the last hold (the lead and the gaps, at
// runtimePoolDrainPerSecond), plus one message per orchestration slot per
// hold. A faster machine drains faster: the result reports the backlog
// ready at each hold, and a hold without one does not count as done.
func (c RuntimePoolConfig) minOrchestrations() int {
	drained := c.Lead + time.Duration(c.Holds-1)*c.Gap
	return c.Holds*c.OrchestrationConcurrency + int(drained.Seconds()*runtimePoolDrainPerSecond)
}

// RuntimePoolSettings are the settings of a run, as reported.
type RuntimePoolSettings struct {
	HoldMs                   int64 `json:"hold_ms"`
	Holds                    int   `json:"holds"`
	GapMs                    int64 `json:"gap_ms"`
	LeadMs                   int64 `json:"lead_ms"`
	PoolMax                  int   `json:"pool_max"`
	Orchestrations           int   `json:"orchestrations"`
	OrchestrationConcurrency int   `json:"orchestration_concurrency"`
	WorkerConcurrency        int   `json:"worker_concurrency"`
	LockTimeoutMs            int64 `json:"lock_timeout_ms"`
}

// echo echoes c in readable units.
func (c RuntimePoolConfig) echo() RuntimePoolSettings {
	return RuntimePoolSettings{
		HoldMs: c.Hold.Milliseconds(), Holds: c.Holds, GapMs: c.Gap.Milliseconds(), LeadMs: c.Lead.Milliseconds(),
		PoolMax: c.PoolMax, Orchestrations: c.Orchestrations, OrchestrationConcurrency: c.OrchestrationConcurrency,
		WorkerConcurrency: c.WorkerConcurrency, LockTimeoutMs: RuntimeLockTimeout.Milliseconds(),
	}
}

// RuntimePoolHold is one time the other session held the table lock.
type RuntimePoolHold struct {
	HeldMs int64 `json:"held_ms"`
	// ReadyAtTake is the number of orchestrator_queue messages visible
	// when the lock was taken: the backlog the waiting fetches can see.
	ReadyAtTake int64 `json:"ready_at_take"`
	// BlockedOnLock is the largest number of the runtime's sessions seen
	// waiting on the lock during the hold (the pooled connections it held),
	// and BlockedWaits what they waited for (pg_locks: the mode and the
	// relation). Not the statement: for these sessions pg_stat_activity
	// showed an earlier statement's text (fetch_orchestration_item waiting
	// for a RowShareLock on worker_queue, which only fetch_work_item and
	// the ack take).
	BlockedOnLock int      `json:"blocked_on_lock"`
	BlockedWaits  []string `json:"blocked_waits,omitempty"`
}

// RuntimePoolSide is what one side did.
type RuntimePoolSide struct {
	Side   string `json:"side"`
	Schema string `json:"schema"`
	// Made says what built the schema.
	Made  string            `json:"made"`
	Holds []RuntimePoolHold `json:"holds"`
	// HoldsDone counts the holds that exhausted the pool: the runtime's
	// sessions blocked on the lock with a backlog ready when it began
	// (reported; whether a fetch met the bug's condition is Leases.Stale).
	HoldsDone int `json:"holds_done"`
	// Expected is the backlog's size; Completed the instances that
	// completed, Wrong those that completed with another output than
	// their own.
	Expected  int `json:"expected"`
	Completed int `json:"completed"`
	Wrong     int `json:"wrong_outputs"`
	// Statuses counts the instances' final statuses; Odd samples those
	// not completed, or completed with another output.
	Statuses map[string]int `json:"statuses,omitempty"`
	Odd      []string       `json:"odd_sample,omitempty"`
	// Status is the scenario's ("Completed": every instance with its
	// output), Error the driver's when it failed.
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
	// InvalidLockTokens counts the lines carrying "Invalid lock token";
	// RefusedTurns the turns whose ack was refused (the runtime's
	// "ack_orchestration_item failed" lines of that kind, less those of the
	// failure event it then tries to commit in their place); LeaseLines
	// the WARN/ERROR lines of the lease kind.
	InvalidLockTokens int `json:"invalid_lock_token_lines"`
	RefusedTurns      int `json:"refused_turns"`
	LeaseLines        int `json:"lease_kind_lines"`
	// SlowAcquires are sqlx's "acquired connection, but time to acquire
	// exceeded slow threshold" lines: statements that waited for a pooled
	// connection (longer than the pool's threshold), with their waits.
	SlowAcquires     int     `json:"slow_acquires"`
	SlowAcquireMaxMs int64   `json:"slow_acquire_max_ms"`
	SlowAcquireP50Ms int64   `json:"slow_acquire_p50_ms"`
	SlowAcquireMs    []int64 `json:"slow_acquire_ms,omitempty"`
	// Tally counts the WARN and ERROR lines by kind.
	Tally map[string]int `json:"warn_error_by_kind"`
	// Sample is the first few lines of the lease kind.
	Sample []string `json:"sample,omitempty"`
	// RunMs is the side's time, from the runtime's start to its report.
	RunMs int64 `json:"run_ms"`
	// Leases are the leases its orchestration fetches returned, as the
	// server saw them (the lease probe): how many met the bug's condition
	// (a timestamp behind the database clock by more than the lock
	// timeout), how many were dead at return.
	Leases FetchLeases `json:"fetch_leases"`
	// Tries is how many runs the side took: a run in which no fetch met
	// the condition proves nothing and is run again, up to
	// RuntimePoolTries (the figures are the last run's).
	Tries int `json:"tries"`
}

// RuntimePoolTries bounds the runs of one side of the pool-wait form.
const RuntimePoolTries = 4

// done reports whether the hold exhausted the pool: the runtime's
// sessions blocked on the lock, a backlog ready when it began.
func (h RuntimePoolHold) done() bool { return h.BlockedOnLock > 0 && h.ReadyAtTake > 0 }

// exercised reports whether the side ran under the bug's condition: at
// least one orchestration fetch returned a lease from a timestamp behind
// the database clock by more than the lock timeout (the lease probe).
func (s RuntimePoolSide) exercised() bool { return s.Leases.Stale > 0 }

// showsBug reports whether the side's fetches that met the condition
// returned leases already dead, and the runtime had acks refused.
func (s RuntimePoolSide) showsBug() bool {
	return s.exercised() && s.Leases.StaleDead == s.Leases.Stale && s.InvalidLockTokens > 0
}

// clean reports whether the side ran as a fix should under the condition:
// fetches that met it, no lease dead at return, and a clean run.
func (s RuntimePoolSide) clean() bool {
	return s.exercised() && s.Leases.DeadAtReturn == 0 && s.ranWell()
}

// ranWell reports whether the side's runtime logged no line of the lease
// kind and completed every orchestration with its own output.
func (s RuntimePoolSide) ranWell() bool {
	return s.LeaseLines == 0 && s.Expected > 0 && s.Completed == s.Expected && s.Wrong == 0
}

// isFixSide reports whether the side is one that must not show the bug.
func isFixSide(key string) bool { return key == SidePack || key == SideAmended }

// retry reports whether a try of the side proves nothing either way and
// is worth another: no fetch met the condition, and (on a side that must
// be fixed) nothing went wrong. A fix side that ran badly is never tried
// again: its failure is the result.
func (s RuntimePoolSide) retry() bool {
	if isFixSide(s.Side) {
		return !s.exercised() && s.ranWell()
	}
	return !s.exercised()
}

// sideName names a side in verdicts.
func sideName(key string) string {
	return map[string]string{SideUpstream: "upstream", SideCandidate: "upstream's candidate", SidePack: "the pack", SideAmended: "the amended candidate"}[key]
}

// notExercised says that a side ran, tries times, without a fetch that met
// the condition.
func (s RuntimePoolSide) notExercised() string {
	return fmt.Sprintf("NOT EXERCISED on %s (%d tries: no fetch returned a lease from a timestamp older than the lock timeout)", sideName(s.Side), s.Tries)
}

// fixVerdict says how a side that should be fixed ran: fixed, NOT FIXED,
// or NOT EXERCISED (it ran well, but no fetch met the condition, so the
// run proves nothing either way).
func (s RuntimePoolSide) fixVerdict() string {
	switch {
	case !s.ranWell() || s.Leases.DeadAtReturn > 0:
		return "NOT FIXED on " + sideName(s.Side)
	case !s.exercised():
		return s.notExercised()
	default:
		return "fixed on " + sideName(s.Side)
	}
}

// bugVerdict says how a side that should show the bug ran.
func (s RuntimePoolSide) bugVerdict() string {
	switch {
	case !s.exercised():
		return s.notExercised()
	case s.showsBug():
		return "reproduced on " + sideName(s.Side)
	default:
		return "NOT REPRODUCED on " + sideName(s.Side)
	}
}

// RuntimePoolResult is the pool-wait repro's outcome.
type RuntimePoolResult struct {
	Addon    string              `json:"addon"`
	Settings RuntimePoolSettings `json:"settings"`
	// The sides and the verdict (OK: reproduced on upstream and its
	// candidate, fixed on the pack and on the amended candidate), judged
	// on the fetches that met the bug's condition (a lease from a
	// timestamp older than the lock timeout). Reproduced: on upstream's
	// latest (and its candidate, when it ran) such fetches happened, every
	// one returned a lease already dead, and the runtime's acks were
	// refused ("Invalid lock token"). Fixed: on the pack's latest (and the
	// amended candidate, when it ran) such fetches happened, no lease was
	// dead at return, no line of the lease kind was logged and every
	// orchestration completed with its own output. A side where no fetch
	// met the condition is run again (RuntimePoolTries), then reported
	// NOT EXERCISED, which fails the verdict.
	sidesVerdict[RuntimePoolSide]
}

func (s RuntimePoolSide) key() string { return s.Side }

// judge sets the verdict from the sides: upstream and the pack must have
// run; the candidate, when it ran, must show the bug, the amended
// candidate, when it ran, must run clean.
func (r *RuntimePoolResult) judge() {
	up, okUp := r.Side(SideUpstream)
	pack, okPack := r.Side(SidePack)
	r.Reproduced = okUp && up.showsBug()
	r.Fixed = okPack && pack.clean()
	if cand, ok := r.Side(SideCandidate); ok {
		r.Reproduced = r.Reproduced && cand.showsBug()
	}
	if am, ok := r.Side(SideAmended); ok {
		r.Fixed = r.Fixed && am.clean()
	}
}

// RuntimePoolRepro makes the sides' schemas in src's database (MakeSides,
// prefix runtime_pool) and runs the form on each in turn, again (up to
// RuntimePoolTries runs) while a run proves nothing either way.
// Upstream's side and the pack's are required.
func RuntimePoolRepro(ctx context.Context, src *dbconn.Source, p *upstream.Provider, cfg RuntimePoolConfig, sides []string, progress func(string)) (RuntimePoolResult, error) {
	res := RuntimePoolResult{Addon: upstream.AddonPackage, Settings: cfg.echo()}
	if err := cfg.Validate(); err != nil {
		return res, err
	}
	if p == nil {
		return res, fmt.Errorf("runtime pool repro: needs the real duroxide runtime (%s)", upstream.AddonPackage)
	}
	if progress == nil {
		progress = func(string) {}
	}
	var err error
	res.Sides, err = onSides(ctx, src, p, "runtime pool repro", "runtime_pool", sides, func(side Side) (RuntimePoolSide, error) {
		var rs RuntimePoolSide
		for try := 1; try <= RuntimePoolTries; try++ {
			progress(fmt.Sprintf("runtime pool repro: %s (%s: %s), pool of %d, %d orchestrations, %d holds of %v, run %d",
				side.Key, side.Schema, side.Made, cfg.PoolMax, cfg.Orchestrations, cfg.Holds, cfg.Hold, try))
			var err error
			rs, err = runtimePoolSide(ctx, src, p, side, cfg)
			rs.Tries = try
			if err != nil {
				return rs, fmt.Errorf("runtime pool repro, side %s: %w", side.Key, err)
			}
			progress(fmt.Sprintf("runtime pool repro: %s: %d of %d leases from a timestamp older than the lock timeout (%d of them dead at return), %d dead at return in all; %d \"Invalid lock token\" lines, %d/%d completed, %d slow acquires (max %d ms)",
				side.Key, rs.Leases.Stale, rs.Leases.Leases, rs.Leases.StaleDead, rs.Leases.DeadAtReturn, rs.InvalidLockTokens, rs.Completed, rs.Expected, rs.SlowAcquires, rs.SlowAcquireMaxMs))
			if !rs.retry() {
				break
			}
			if try < RuntimePoolTries {
				progress(fmt.Sprintf("runtime pool repro: %s: no fetch met the condition; running the side again", side.Key))
			}
		}
		return rs, nil
	})
	if err != nil {
		return res, err
	}
	res.judge()
	return res, nil
}

// driverSignal is one line of the driver's signal file.
type driverSignal struct {
	Event string `json:"event"`
	AtMs  int64  `json:"atMs"`
}

// signalled reports whether the signal file holds a line of event.
func signalled(path, event string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var s driverSignal
		if json.Unmarshal(sc.Bytes(), &s) == nil && s.Event == event {
			return true, nil
		}
	}
	return false, sc.Err()
}

// runtimePoolSide runs the real runtime on side's schema (the backlog
// scenario, a pool of cfg.PoolMax) and, once every event is raised, holds
// worker_queue's table lock cfg.Holds times from another session.
func runtimePoolSide(ctx context.Context, src *dbconn.Source, p *upstream.Provider, s Side, cfg RuntimePoolConfig) (RuntimePoolSide, error) {
	side := RuntimePoolSide{Side: s.Key, Schema: s.Schema, Made: s.Made, Expected: cfg.Orchestrations}
	dir, err := os.MkdirTemp("", "runtime-pool-")
	if err != nil {
		return side, fmt.Errorf("signal file: %w", err)
	}
	defer os.RemoveAll(dir)
	signalFile := filepath.Join(dir, "signal.jsonl")
	conn, err := src.Connect(ctx)
	if err != nil {
		return side, fmt.Errorf("lock holder: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	qschema := pgx.Identifier{s.Schema}.Sanitize()
	probe, err := installLeaseProbe(ctx, conn, s.Schema)
	if err != nil {
		return side, err
	}
	since, err := probe.mark(ctx, conn)
	if err != nil {
		return side, err
	}

	type outcome struct {
		res *upstream.RuntimeResult
		err error
	}
	done := make(chan outcome, 1)
	// The scenario's bound: the backlog's setup (measured: about 5 ms an
	// instance with a pool of one; 50 allowed), the holds, and the drain.
	wait := 2*time.Minute + time.Duration(cfg.Holds)*(cfg.Hold+cfg.Gap) + time.Duration(cfg.Orchestrations)*50*time.Millisecond
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	started := time.Now()
	go func() {
		res, err := p.RunRuntime(runCtx, src, upstream.RuntimeRun{
			Schema:  s.Schema,
			PoolMax: cfg.PoolMax,
			Runtime: upstream.RuntimeOptions{
				OrchestrationConcurrency: cfg.OrchestrationConcurrency,
				WorkerConcurrency:        cfg.WorkerConcurrency,
			},
			Scenarios: []upstream.Scenario{{Name: "eventBacklog", Key: "pool", Count: cfg.Orchestrations, SignalFile: signalFile}},
			// Ids of their own, should the schema hold an earlier run's.
			Prefix: fmt.Sprintf("pool-%s-%d-", s.Key, started.UnixMilli()),
			Wait:   wait,
		})
		done <- outcome{res, err}
	}()
	// finish waits for the runtime's report (cancelling it first when the
	// holds failed).
	finish := func(cause error) (*upstream.RuntimeResult, error) {
		if cause != nil {
			cancelRun()
			<-done
			return nil, cause
		}
		out := <-done
		return out.res, out.err
	}

	// Wait until every event is raised, then the lead.
	for {
		ok, err := signalled(signalFile, "raised")
		if err != nil {
			_, err = finish(fmt.Errorf("signal file: %w", err))
			return side, err
		}
		if ok {
			break
		}
		select {
		case out := <-done:
			// The driver ended before raising its events: its report says why.
			if out.err != nil {
				return side, out.err
			}
			return side, fmt.Errorf("the runtime ended before the backlog's events were raised: %v", out.res.Results["pool"])
		case <-ctx.Done():
			_, err := finish(ctx.Err())
			return side, err
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := sleepCtx(ctx, cfg.Lead); err != nil {
		_, err = finish(err)
		return side, err
	}
	for i := 0; i < cfg.Holds; i++ {
		h, err := holdWorkerQueue(ctx, conn, qschema, cfg.Hold)
		if err != nil {
			_, err = finish(fmt.Errorf("hold %d: %w", i+1, err))
			return side, err
		}
		side.Holds = append(side.Holds, h)
		if h.done() {
			side.HoldsDone++
		}
		if i < cfg.Holds-1 {
			if err := sleepCtx(ctx, cfg.Gap); err != nil {
				_, err = finish(err)
				return side, err
			}
		}
	}
	res, err := finish(nil)
	if err != nil {
		return side, err
	}
	side.RunMs = time.Since(started).Milliseconds()
	side.read(res)
	if side.Leases, err = probe.read(ctx, conn, since, RuntimeLockTimeout.Milliseconds()); err != nil {
		return side, err
	}
	return side, nil
}

// holdWorkerQueue takes worker_queue's table lock on conn (ACCESS
// EXCLUSIVE, in a transaction), holds it for hold, watching which of the
// runtime's sessions wait on it, and lets it go.
func holdWorkerQueue(ctx context.Context, conn *pgx.Conn, qschema string, hold time.Duration) (RuntimePoolHold, error) {
	var h RuntimePoolHold
	tx, err := conn.Begin(ctx)
	if err != nil {
		return h, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	// A statement of the runtime in progress on the table delays the lock
	// by its own length; a bound keeps a stuck one from stalling the repro.
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '10s'"); err != nil {
		return h, err
	}
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+qschema+".orchestrator_queue WHERE visible_at <= now() AND (locked_until IS NULL OR locked_until < (extract(epoch FROM now()) * 1000)::bigint)").Scan(&h.ReadyAtTake); err != nil {
		return h, fmt.Errorf("count the ready messages: %w", err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+qschema+".worker_queue IN ACCESS EXCLUSIVE MODE"); err != nil {
		return h, fmt.Errorf("lock worker_queue: %w", err)
	}
	taken := time.Now()
	waited := map[string]bool{}
	for time.Since(taken) < hold {
		rows, err := tx.Query(ctx, `SELECT coalesce(l.mode || ' on ' || l.relation::regclass::text, a.wait_event)
			FROM pg_stat_activity a LEFT JOIN pg_locks l ON l.pid = a.pid AND NOT l.granted
			WHERE a.datname = current_database() AND a.wait_event_type = 'Lock' AND pg_backend_pid() = ANY (pg_blocking_pids(a.pid))`)
		if err != nil {
			return h, fmt.Errorf("pg_stat_activity: %w", err)
		}
		n := 0
		for rows.Next() {
			var waits string
			if err := rows.Scan(&waits); err != nil {
				rows.Close()
				return h, err
			}
			n++
			waited[waits] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return h, fmt.Errorf("pg_stat_activity: %w", err)
		}
		h.BlockedOnLock = max(h.BlockedOnLock, n)
		if err := sleepCtx(ctx, min(250*time.Millisecond, hold-time.Since(taken))); err != nil {
			return h, err
		}
	}
	h.HeldMs = time.Since(taken).Milliseconds()
	if err := tx.Commit(ctx); err != nil {
		return h, fmt.Errorf("let go of worker_queue: %w", err)
	}
	for w := range waited {
		h.BlockedWaits = append(h.BlockedWaits, w)
	}
	sort.Strings(h.BlockedWaits)
	return h, nil
}

// sleepCtx sleeps d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// slowAcquireMessage is sqlx's line for a statement that waited longer than
// the pool's slow threshold for a connection; its field aquired_after_secs
// (sqlx's spelling) is the wait.
const slowAcquireMessage = "acquired connection, but time to acquire exceeded slow threshold"

// acquireWaitMs is the wait a slow-acquire line reports, in ms.
func acquireWaitMs(l upstream.LogLine) (int64, bool) {
	if !strings.Contains(l.Message, slowAcquireMessage) {
		return 0, false
	}
	for _, k := range []string{"aquired_after_secs", "acquired_after_secs"} {
		if v, ok := l.Fields[k]; ok {
			if secs, err := strconv.ParseFloat(v, 64); err == nil {
				return int64(secs*1000 + 0.5), true
			}
		}
	}
	return 0, true
}

// read fills the side's figures from the runtime's report and log.
func (side *RuntimePoolSide) read(res *upstream.RuntimeResult) {
	out := res.Results["pool"]
	side.Status, side.Error = out.Status(), out.Error()
	num := func(k string) int {
		f, _ := out[k].(float64)
		return int(f)
	}
	side.Completed, side.Wrong = num("completed"), num("wrong")
	if st, ok := out["statuses"].(map[string]any); ok {
		side.Statuses = map[string]int{}
		for k, v := range st {
			n, _ := v.(float64)
			side.Statuses[k] = int(n)
		}
	}
	samples := func(key string, text func(map[string]any) string) {
		list, _ := out[key].([]any)
		for _, x := range list {
			if m, ok := x.(map[string]any); ok {
				side.Odd = append(side.Odd, text(m))
			}
		}
	}
	samples("notCompletedSample", func(m map[string]any) string {
		return fmt.Sprintf("%v ended %v: %v", m["id"], m["status"], m["error"])
	})
	samples("wrongSample", func(m map[string]any) string {
		return fmt.Sprintf("%v completed with %q, not %q", m["id"], m["got"], m["want"])
	})
	side.Tally = res.Tally()
	side.InvalidLockTokens = res.InvalidLockTokens()
	for _, l := range res.Logs {
		if l.InvalidLockToken() && strings.Contains(l.Message, "ack_orchestration_item failed") {
			side.RefusedTurns++
		}
		if strings.Contains(l.Message, "Failed to commit failure event") {
			side.RefusedTurns--
		}
		if l.Lease() {
			side.LeaseLines++
			if len(side.Sample) < 3 {
				side.Sample = append(side.Sample, l.Text())
			}
		}
		if ms, ok := acquireWaitMs(l); ok {
			side.SlowAcquires++
			side.SlowAcquireMs = append(side.SlowAcquireMs, ms)
		}
	}
	side.RefusedTurns = max(side.RefusedTurns, 0)
	sorted := slices.Sorted(slices.Values(side.SlowAcquireMs))
	side.SlowAcquireMaxMs = eventlog.Percentile(sorted, 100)
	side.SlowAcquireP50Ms = eventlog.Percentile(sorted, 50)
}

// PrintRuntimePool writes what the pool-wait form is, then its table, one
// column per side, the sample lines and the verdict.
func PrintRuntimePool(w io.Writer, r RuntimePoolResult) error {
	st := r.Settings
	ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
	fmt.Fprintf(w, "runtime repro, pool-wait form: the real duroxide runtime (%s), no advisory lock held; a pool of %d connection(s) (DUROXIDE_PG_POOL_MAX), %d orchestration slot(s), %d worker slot(s), %d orchestrations ready at once (each waiting for an event; the events raised in a burst); %v later another session holds worker_queue's table lock %v at a time, %d times, %v apart: the first statements to touch worker_queue (worker polls, acks) take every pooled connection and block on it, and the orchestration fetches, their timestamps minted, wait for a connection; the runtime's orchestration lock timeout is its default, %v\n\n",
		r.Addon, st.PoolMax, st.OrchestrationConcurrency, st.WorkerConcurrency, st.Orchestrations,
		ms(st.LeadMs), ms(st.HoldMs), st.Holds, ms(st.GapMs), ms(st.LockTimeoutMs))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(name string, f func(RuntimePoolSide) string) {
		cells := []string{name}
		for _, s := range r.Sides {
			cells = append(cells, f(s))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	row("", func(s RuntimePoolSide) string { return s.Side })
	row("schema", func(s RuntimePoolSide) string { return s.Schema })
	row("holds done (pool exhausted, backlog ready)", func(s RuntimePoolSide) string {
		return fmt.Sprintf("%d of %d", s.HoldsDone, st.Holds)
	})
	row("ready messages as each hold began", func(s RuntimePoolSide) string {
		var parts []string
		for _, h := range s.Holds {
			parts = append(parts, fmt.Sprint(h.ReadyAtTake))
		}
		return strings.Join(parts, " ")
	})
	row("runtime sessions blocked on the lock, per hold", func(s RuntimePoolSide) string {
		var parts []string
		for _, h := range s.Holds {
			parts = append(parts, fmt.Sprint(h.BlockedOnLock))
		}
		return strings.Join(parts, " ")
	})
	row("slow pool acquires: count, wait p50 / max", func(s RuntimePoolSide) string {
		return fmt.Sprintf("%d, %d / %d ms", s.SlowAcquires, s.SlowAcquireP50Ms, s.SlowAcquireMaxMs)
	})
	row("leases returned (server's view)", func(s RuntimePoolSide) string { return fmt.Sprint(s.Leases.Leases) })
	row(fmt.Sprintf("from a timestamp older than the lock timeout (%v)", ms(st.LockTimeoutMs)), func(s RuntimePoolSide) string {
		return fmt.Sprintf("%d (lag max %d ms)", s.Leases.Stale, s.Leases.MaxStaleMs)
	})
	row("of those, dead at return", func(s RuntimePoolSide) string { return fmt.Sprint(s.Leases.StaleDead) })
	row("leases dead at return, in all", func(s RuntimePoolSide) string { return fmt.Sprint(s.Leases.DeadAtReturn) })
	row(`"Invalid lock token" lines`, func(s RuntimePoolSide) string { return fmt.Sprint(s.InvalidLockTokens) })
	row("turns whose ack was refused", func(s RuntimePoolSide) string { return fmt.Sprint(s.RefusedTurns) })
	row("WARN/ERROR lines of the lease kind", func(s RuntimePoolSide) string { return fmt.Sprint(s.LeaseLines) })
	row("orchestrations completed (wrong output)", func(s RuntimePoolSide) string {
		return fmt.Sprintf("%d of %d (%d)", s.Completed, s.Expected, s.Wrong)
	})
	row("side's run (runs it took)", func(s RuntimePoolSide) string {
		return fmt.Sprintf("%.1f s (%d)", float64(s.RunMs)/1000, s.Tries)
	})
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, s := range r.Sides {
		fmt.Fprintf(w, "  %s: %s\n", s.Side, s.Made)
	}
	for _, s := range r.Sides {
		if s.Error != "" {
			fmt.Fprintf(w, "  %s: scenario %s: %s\n", s.Side, s.Status, s.Error)
		}
		for _, l := range s.Sample {
			fmt.Fprintf(w, "  %s: %s\n", s.Side, l)
		}
		for _, o := range s.Odd {
			fmt.Fprintf(w, "  %s: %s\n", s.Side, o)
		}
	}
	_, err := fmt.Fprintf(w, "\nverdict: %s\n", r.verdict())
	return err
}

// verdict is the verdict line: on the sides that show the bug, then on
// those that must not, one phrase each group when all agree.
func (r RuntimePoolResult) verdict() string {
	_, withCandidate := r.Side(SideCandidate)
	_, withAmended := r.Side(SideAmended)
	bug, fix := "upstream", "the pack"
	if withCandidate {
		bug = "upstream and its candidate"
	}
	if withAmended {
		fix = "the pack and the amended candidate"
	}
	var parts []string
	if r.Reproduced {
		parts = append(parts, "reproduced on "+bug)
	} else {
		for _, key := range []string{SideUpstream, SideCandidate} {
			if s, ok := r.Side(key); ok {
				parts = append(parts, s.bugVerdict())
			}
		}
	}
	if r.Fixed {
		parts = append(parts, "fixed on "+fix)
	} else {
		for _, key := range []string{SidePack, SideAmended} {
			if s, ok := r.Side(key); ok {
				parts = append(parts, s.fixVerdict())
			}
		}
	}
	return strings.Join(parts, ", ")
}

// runtimePoolMarkdown renders r as a Markdown section: the table in a code
// block.
func runtimePoolMarkdown(r RuntimePoolResult) string {
	var b strings.Builder
	b.WriteString("## The real runtime, pool-wait form (runtime repro)\n\n```\n")
	_ = PrintRuntimePool(&b, r)
	b.WriteString("```\n")
	return b.String()
}
