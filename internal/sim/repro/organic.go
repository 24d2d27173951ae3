package repro

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
	"github.com/duroxide-pg/migrations/internal/sim/settings"
	"github.com/duroxide-pg/migrations/internal/sim/simconfig"
)

// The organic scenario: no hand-made stale timestamp, just the runtime's
// dispatch loop (package dispatch) run against each schema version, one
// after the other, with the same seed and settings. See OrganicDefaults for
// the settings and what they gave when measured.

// Verdict thresholds.
const (
	// The bug reproduces when at least this share of leases is dead at
	// return (and at least one ack is refused, and attempt_count exceeds
	// max_attempts).
	BugDeadPct = 20.0
	// Shares are judged only over enough leases: a run with fewer fails
	// its "leases returned" check (run it longer) rather than pass or fail
	// on a percentage of a handful.
	minBugLeases = 20
	minFixLeases = 50
	// At the fix the median lease must reach the return of the function
	// with at most this share of it used up, by the database clock. The
	// fix counts the lease from its own last step, so what it uses is
	// that step and the return of the row (a few ms); a lease counted
	// from the caller's p_now_ms has used at least one whole fetch,
	// 1/LockTimeoutFactor of the calibrated timeout, even when nothing
	// waited, and at 19 the whole wait on the advisory lock. The median,
	// not the maximum: a scheduling stall on a loaded machine delays a
	// single return by up to ~100 ms whatever the function does (measured
	// under fork loops: max 87-95 ms against a p50 of 3-5 ms). A busy
	// machine's delivery of the row is the caller's, not judged.
	FixReturnAgeP50Pct = 25
	// A side runs for up to this many Durations, on the same queue, until
	// its run can be judged: below the fix until it shows the bug (its
	// checks all pass: the bug builds up, attempt_count climbing by one a
	// lost lease, and how fast depends on the calibrated lock timeout);
	// at the fix until it has returned minFixLeases leases (a starved
	// machine returns fewer a second: the condition is made to happen,
	// and counted, rather than judged on too few).
	MaxSegments = 3
)

// OrganicDefaults is the full organic scenario (`make repro`): 32
// dispatchers (sixteen runtimes at the runtime's default of 2 orchestration
// workers) on 5 hot instances, each a running orchestration whose history
// holds 5000 events of ~250 bytes (1.25 MB of JSON per fetch), with one
// pending message, every turn enqueueing the next; the runtime's 100 ms
// minimum poll interval and max_attempts 10, no turn time, no clock skew,
// 10 s per version. The lock timeout is calibrated (CalibrateLockTimeout):
// LockTimeoutFactor times the median of 9 uncontended fetches of a hot
// instance on this machine, now (dispatch.Calibrate).
//
// Why these settings, and what they measured: docs/BENCH.md, "The repros'
// settings".
func OrganicDefaults() OrganicConfig { return defaultsOf[OrganicConfig]() }

// defaultsOf is a zero config with its settings' defaults filled in.
func defaultsOf[T any, P interface {
	*T
	settings() *settings.List
}]() T {
	var c T
	P(&c).settings().Fill()
	return c
}

// settings are the organic repro's settings, bound to c: each one's
// default, least value and flag. A lock timeout of 0 is calibrated.
func (c *OrganicConfig) settings() *settings.List {
	l := settings.New("organic: ")
	l.Int(&c.Dispatchers, "dispatchers", 32, 1).Flag("dispatchers", "organic: simulated dispatchers, each with its own connection")
	l.Int(&c.Instances, "instances", 5, 1).Flag("instances", "organic: hot instances")
	l.Int(&c.HistoryEvents, "history", 5000, 0).Flag("history", "organic: history events per instance")
	l.Int(&c.EventBytes, "event-bytes", 250, 1).Flag("event-bytes", "organic: approximate size of one history event")
	l.Duration(&c.LockTimeout, "lock-timeout", 0, 0).
		Flag("lock-timeout", fmt.Sprintf("organic: orchestrator lock timeout (0: %g x one uncontended fetch, measured now)", LockTimeoutFactor)).
		OnSet(func() { c.CalibrateLockTimeout = c.LockTimeout == 0 })
	l.Duration(&c.PollInterval, "poll", 100*time.Millisecond, time.Nanosecond).Flag("poll", "organic: minimum poll interval")
	l.Duration(&c.TurnTime, "turn", 0, 0).Flag("turn", "organic: simulated turn time")
	l.Duration(&c.Duration, "duration", 10*time.Second, time.Nanosecond).Flag("duration", "organic: run time per version")
	l.Duration(&c.Skew, "skew", 0, 0).Flag("skew", "organic: spread the dispatchers' clocks over [-skew, +skew]")
	l.Int(&c.MaxAttempts, "max-attempts", 10, 0)
	l.After(func() { c.CalibrateLockTimeout = c.LockTimeout == 0 })
	return l
}

// Register adds the organic repro's flags to fs, bound to c, its values as
// their defaults.
func (c *OrganicConfig) Register(fs *flag.FlagSet) { c.settings().Register(fs) }

// OrganicConfig is the organic scenario: the dispatchers' settings, and
// whether their lock timeout is measured on the machine before the run.
type OrganicConfig struct {
	dispatch.Config
	// CalibrateLockTimeout sets the lock timeout to LockTimeoutFactor x the
	// median uncontended fetch of a hot instance, measured on the lowest
	// version's schema before the first run (dispatch.Calibrate); the same
	// timeout then serves every version. LockTimeout must then be 0.
	CalibrateLockTimeout bool
}

// CheckSettings rejects settings the organic repro cannot run, before
// anything connects (the schemas are the repro's own, so Schema is not
// asked for): each setting at least its least (settings).
func (c OrganicConfig) CheckSettings() error { return c.settings().Check() }

// OrganicShort is OrganicDefaults cut to 8 s per version, for the test
// suite: about 14 s for calibration and both versions.
func OrganicShort() OrganicConfig {
	c := OrganicDefaults()
	c.Duration = 8 * time.Second
	return c
}

// OrganicSettings echoes the scenario's settings in readable units.
type OrganicSettings struct {
	Dispatchers    int     `json:"dispatchers"`
	Instances      int     `json:"instances"`
	HistoryEvents  int     `json:"history_events"`
	EventBytes     int     `json:"event_bytes"`
	LockTimeoutMs  int64   `json:"lock_timeout_ms"`
	PollIntervalMs int64   `json:"poll_interval_ms"`
	TurnTimeMs     int64   `json:"turn_time_ms"`
	DurationS      float64 `json:"duration_s"`
	SkewMs         int64   `json:"skew_ms"`
	MaxAttempts    int     `json:"max_attempts"`
}

// echoOrganic echoes cfg, its defaults applied.
func echoOrganic(cfg dispatch.Config) OrganicSettings {
	return OrganicSettings{
		Dispatchers: cfg.Dispatchers, Instances: cfg.Instances, HistoryEvents: cfg.HistoryEvents,
		EventBytes: cfg.EventBytes, LockTimeoutMs: cfg.LockTimeout.Milliseconds(),
		PollIntervalMs: cfg.PollInterval.Milliseconds(), TurnTimeMs: cfg.TurnTime.Milliseconds(),
		DurationS: cfg.Duration.Seconds(), SkewMs: cfg.Skew.Milliseconds(), MaxAttempts: cfg.MaxAttempts,
	}
}

// organicRun is the organic scenario at one schema version.
type organicRun = SchemaRun[dispatch.Summary, dispatch.Event]

// OrganicVerdict says whether the runs show the bug below the fix and its
// absence at the fix, and whether every run conserved its messages.
type OrganicVerdict struct {
	Verdict
	// Conserved: no message was lost or processed twice in any run
	// (advisory: see judge).
	Conserved bool `json:"conserved"`
}

// OrganicResult is what RunOrganic returns; it serialises to stable
// snake_case JSON.
type OrganicResult = Result[OrganicSettings, dispatch.Calibration, dispatch.Summary, dispatch.Event, OrganicVerdict]

// RunOrganic runs the organic scenario cfg (Schema is ignored) on each of
// sides (schemas in the database of src, made by MakeSides), one after the
// other, and judges the runs. Seed empties each schema's orchestration
// tables before its run. With cfg.CalibrateLockTimeout the lock timeout is
// calibrated first, on the first side's schema; zero fields take
// dispatch's defaults, applied here once. progress, when not nil, receives
// one line per step.
func RunOrganic(ctx context.Context, src *dbconn.Source, sides []Side, cfg OrganicConfig, progress func(string)) (OrganicResult, error) {
	progress = quiet(progress)
	if len(sides) == 0 {
		return OrganicResult{}, fmt.Errorf("organic: no side to run on")
	}
	var cal *dispatch.Calibration
	if cfg.CalibrateLockTimeout {
		if cfg.LockTimeout != 0 {
			return OrganicResult{}, fmt.Errorf("organic: LockTimeout %v with CalibrateLockTimeout: give one", cfg.LockTimeout)
		}
		c, err := dispatch.Calibrate(ctx, src, sides[0].Schema, cfg.Config, LockTimeoutFactor)
		if err != nil {
			return OrganicResult{}, err
		}
		cal = &c
		cfg.LockTimeout = c.LockTimeout
		progress(fmt.Sprintf("calibration: one uncontended fetch of a hot instance takes %v (median of %d); lock timeout %g x that = %v",
			c.Fetch.Round(time.Millisecond), c.Samples, c.Factor, c.LockTimeout))
	}
	// Checked once here, on the first side's schema; each run sets its own.
	cfg.Schema = sides[0].Schema
	dcfg, err := simconfig.Ready(cfg.Config)
	if err != nil {
		return OrganicResult{}, fmt.Errorf("organic: %w", err)
	}
	res := OrganicResult{Settings: echoOrganic(dcfg), Calibration: cal}
	for _, side := range sides {
		run, err := runOrganicSide(ctx, src, side, dcfg, progress)
		if err != nil {
			return res, err
		}
		res.Runs = append(res.Runs, run)
	}
	shareHistogramAxis(res.Runs, dcfg.LockTimeout.Milliseconds(), dispatch.Remaining)
	res.Verdict = judge(res.Runs)
	return res, nil
}

// organicRole is what the organic scenario expects of a side: the bug at
// upstream's latest (its convoy), a clean run at the pack. Upstream's
// candidate, amended or not, is reported, not judged: it has no convoy,
// but its lease starts at the claim, before it claims the messages and
// loads the history, which a lock timeout of a few fetch times (the
// scenario's calibration) makes a large share of the lease.
func organicRole(side string) role {
	switch side {
	case SideUpstream:
		return bugRole
	case SidePack:
		return fixRole
	}
	return reportedRole
}

func runOrganicSide(ctx context.Context, src *dbconn.Source, side Side, cfg dispatch.Config, progress func(string)) (organicRun, error) {
	cfg.Schema = side.Schema
	run := organicRun{Side: side.Key, Made: side.Made, Schema: side.Schema}
	progress(fmt.Sprintf("%s: seeding %d instance(s) x %d history events of ~%d bytes in schema %s",
		side.Key, cfg.Instances, cfg.HistoryEvents, cfg.EventBytes, side.Schema))
	seed, err := dispatch.Seed(ctx, src, cfg)
	if err != nil {
		return run, fmt.Errorf("organic %s: %w", side.Key, err)
	}
	progress(fmt.Sprintf("%s: %d dispatchers, lock timeout %v, poll %v, for %v",
		side.Key, cfg.Dispatchers, cfg.LockTimeout, cfg.PollInterval, cfg.Duration))
	var elapsed time.Duration
	for {
		log, err := dispatch.Run(ctx, src, cfg)
		if err != nil {
			return run, fmt.Errorf("organic %s: %w", side.Key, err)
		}
		run.Segments++
		run.Events = append(run.Events, log.Events()...)
		elapsed += log.Elapsed()
		run.Summary = dispatch.Summarize(run.Events, elapsed, cfg.MaxAttempts)
		// The bug is cumulative (attempt_count climbs by one a lost
		// lease): the side that must show it and has not yet runs on, on
		// the same queue, rather than fail for a short run; the side that
		// must be clean runs on until it has returned enough leases to be
		// judged.
		if run.Segments >= MaxSegments || !needsMore(side.Key, run) {
			break
		}
		progress(fmt.Sprintf("%s: not judged yet after %v (%d leases, max attempt_count %d, %.1f%% dead at return): running another %v on the same queue",
			side.Key, elapsed.Round(100*time.Millisecond), run.Summary.Fetches, run.Summary.MaxAttemptCount, run.Summary.DeadAtReturnPct, cfg.Duration))
	}
	pending, err := dispatch.PendingMessages(ctx, src, side.Schema)
	if err != nil {
		return run, fmt.Errorf("organic %s: read the queue: %w", side.Key, err)
	}
	run.Conservation = conservation(dispatch.Conservation(seed.Messages, run.Events, pending))
	run.Histogram = remainingHistogram(run.Events, cfg.LockTimeout.Milliseconds())
	s := run.Summary
	progress(fmt.Sprintf("%s: %d fetches, %d (%.1f%%) dead at return, %d more expired in delivery, %d invalid-lock acks (%d of a lease still valid, %d late), max attempt_count %d, %.1f turns/s",
		side.Key, s.Fetches, s.DeadAtReturn, s.DeadAtReturnPct, s.ExpiredInDelivery, s.InvalidLockAcks,
		s.RefusedWhileValidAcks, s.RefusedLateAcks, s.MaxAttemptCount, s.TurnsPerSec))
	return run, nil
}

// needsMore reports whether a side's run so far cannot be judged yet: a
// side that must show the bug has not shown it, a side that must be clean
// has returned fewer than minFixLeases leases. A reported side runs once.
func needsMore(side string, run organicRun) bool {
	switch organicRole(side) {
	case bugRole:
		return !judge([]organicRun{run}).Reproduced
	case fixRole:
		return run.Summary.Fetches < minFixLeases
	}
	return false
}

// judge applies the verdict criteria. A version below the fix must
// reproduce the bug (over up to MaxSegments runs of the configured
// duration): at least minBugLeases leases, >= BugDeadPct% of them
// dead at return (expired by the database clock when the function
// returned), >= 1 refused ack, attempt_count > max_attempts. The fix and
// above must be clean: at least minFixLeases leases, none dead at return,
// the median lease with at most FixReturnAgeP50Pct% of it used up when the
// function returned (database clock, over the leases read after their row
// arrived; a lease that the row's delivery outlived afterwards, or that
// was taken over before its reader could read it, is reported, not
// judged: the function cannot shorten the delivery of a starved
// dispatcher), no ack refused while its lease was still valid
// when the ack ran (dispatch.Event.RefusedAck: locked_until after the
// later of the ack's p_now_ms and the database clock read just before it,
// a defect of the schema). Acks refused after their lease ran out (during
// the delivery of the row or the caller's own processing of the turn,
// which a busy machine can stretch past the lease) are reported with their
// lateness and where the lease ran out, not judged, and so is the
// attempt_count they raise.
//
// "Messages conserved" (every message consumed by exactly one successful
// ack, or still queued) is checked too, but only as an advisory check: it
// can fail at both versions for a reason the fetch fix does not touch.
// ack_orchestration_item validates the lease with a plain read against the
// caller's p_now_ms, minted before the call, and locks nothing (until the
// pack's ack fix); a fetch can take the instance over (its lease expired by
// the fetcher's clock) while such an ack is between its validation and its
// DELETE of the batch. The ack then commits its history and new messages
// without consuming the batch (re-tagged by the taker), and the taker
// processes the same messages again. Seen about once in twenty organic
// runs, near the lease's end.
func judge(runs []organicRun) OrganicVerdict {
	j := newJudgement()
	conserved := true
	for _, r := range runs {
		s := r.Summary
		rl := organicRole(r.Side)
		add := j.run(rl, r.Version, r.Side)
		if rl == bugRole {
			add("leases returned", fmt.Sprintf(">= %d", minBugLeases), fmt.Sprint(s.Fetches), s.Fetches >= minBugLeases, false)
			add("leases dead at return", fmt.Sprintf(">= %.0f%%", BugDeadPct),
				fmt.Sprintf("%.1f%% (%d of %d)", s.DeadAtReturnPct, s.DeadAtReturn, s.Fetches),
				s.Fetches > 0 && s.DeadAtReturnPct >= BugDeadPct, false)
			add("acks refused with 'Invalid lock token'", ">= 1",
				fmt.Sprint(s.InvalidLockAcks), s.InvalidLockAcks >= 1, false)
			add("max attempt_count", fmt.Sprintf("> max_attempts (%d)", s.MaxAttempts),
				fmt.Sprint(s.MaxAttemptCount), s.ExceededMaxAttempts, false)
		} else {
			add("leases returned", fmt.Sprintf(">= %d", minFixLeases), fmt.Sprint(s.Fetches), s.Fetches >= minFixLeases, false)
			add("leases dead at return", "0",
				fmt.Sprintf("%d of %d", s.DeadAtReturn, s.Fetches), s.DeadAtReturn == 0, false)
			limit := int64(FixReturnAgeP50Pct) * s.LockTimeoutMs / 100
			add("lease used up when the function returned (database clock), p50",
				fmt.Sprintf("<= %d%% of the lock timeout (%d ms)", FixReturnAgeP50Pct, limit),
				returnAge(s), s.ReturnAgeSamples > 0 && s.ReturnAgeP50Ms <= limit, false)
			add("leases expired in delivery (reported, not judged)", "-",
				fmt.Sprintf("%d (%d in a delivery shorter than the lock timeout, %d taken over before their row's reader read them; longest delivery %d ms)",
					s.ExpiredInDelivery, s.ExpiredInShortDelivery, s.LostInDelivery, s.DeliveryMaxMs),
				true, true)
			add("refused acks of leases still valid when the ack ran", "0",
				fmt.Sprintf("%d (of %d refused)", s.RefusedWhileValidAcks, s.InvalidLockAcks), s.RefusedWhileValidAcks == 0, false)
			add("refused acks of leases that had run out (reported, not judged)", "-",
				lateAcks(s), true, true)
			// The function raises attempt_count only through a lease dead
			// at return or an ack refused while valid, both judged above;
			// past max_attempts without either, late acks (a delivery or a
			// turn outlasting the lease on a busy machine) did it.
			add("max attempt_count (reported, not judged: raised by the function only through the two checks above)",
				fmt.Sprintf("<= max_attempts (%d)", s.MaxAttempts),
				fmt.Sprint(s.MaxAttemptCount), !s.ExceededMaxAttempts, true)
		}
		ok := r.Conservation == "ok"
		conserved = conserved && ok
		add("messages conserved (advisory)", "ok", r.Conservation, ok, true)
	}
	return OrganicVerdict{Verdict: j.verdict(), Conserved: conserved}
}

func returnAge(s dispatch.Summary) string {
	if s.ReturnAgeSamples == 0 {
		return "not read"
	}
	return fmt.Sprintf("p50 %d ms (p99 %d, max %d, of %d leases)", s.ReturnAgeP50Ms, s.ReturnAgeP99Ms, s.ReturnAgeMaxMs, s.ReturnAgeSamples)
}

// lateAcks describes the acks of s refused after their lease ran out:
// how many, where the lease ran out, how late (ms past locked_until) and,
// for those that ran out while the caller processed the turn, how long
// that took.
func lateAcks(s dispatch.Summary) string {
	if s.RefusedLateAcks == 0 {
		return "0"
	}
	out := fmt.Sprintf("%d (ran out: %d at return, %d in delivery, %d in processing)",
		s.RefusedLateAcks, s.LateAtReturn, s.LateInDelivery, s.LateInProcessing)
	if s.LatenessSamples > 0 {
		out += fmt.Sprintf("; late by min/p50/max %d/%d/%d ms", s.LatenessMinMs, s.LatenessP50Ms, s.LatenessMaxMs)
	}
	if s.LateInProcessing > 0 {
		out += fmt.Sprintf("; processing p50/max %d/%d ms", s.LateProcessingP50Ms, s.LateProcessingMaxMs)
	}
	return out
}

// LockTimeoutFactor is how many uncontended fetch times the organic
// repro's calibrated lock timeout lasts. 3.5 while the fix's verdict
// needed the delivery of a 1.25 MB row to fit in the lease; since the fix
// is judged on the lease it hands over (used at return, refused acks by
// cause), the shorter timeout only makes 19's convoy outlast more leases:
// at 3.5, 1 busy-loop run of 10 left 19 at attempt_count 9 after 30 s.
const LockTimeoutFactor = 2.5
