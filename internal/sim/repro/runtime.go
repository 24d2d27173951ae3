package repro

// The runtime repro, held-key form: the seed's symptoms with the real
// duroxide runtime (upstream.AddonPackage), not the model. One
// orchestration of one turn; another session holds its instance's advisory
// key, the key each side's fetch actually takes (upstream's
// hashtext(instance_id); its candidate's and the pack's, scoped to the
// schema), for longer than the runtime's orchestration lock timeout, again
// and again: the deterministic form of the convoy ahead of it. On a schema
// made by upstream's runner every fetch that waited returns a lease already
// expired, its ack is refused ("Invalid lock token") and attempt_count
// climbs; upstream's candidate and the pack's latest only try the key, skip
// the instance while it is held and complete it as soon as it is free.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/settings"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// RuntimeLockTimeout is the runtime's orchestration lock timeout: its
// default, which the addon does not let a program change.
const RuntimeLockTimeout = 5 * time.Second

// RuntimeConfig is the runtime repro's input.
type RuntimeConfig struct {
	// Hold is how long the other session holds the key each time (must
	// exceed RuntimeLockTimeout).
	Hold time.Duration
	// Holds is how many times it takes the key; the runtime's poison
	// threshold (attempt_count above 10) needs 11.
	Holds int
}

// RuntimeDefaults is the repro's default: three holds of 7 s.
func RuntimeDefaults() RuntimeConfig { return defaultsOf[RuntimeConfig]() }

// settings are the runtime repro's settings, bound to c: each one's
// default, least value and flag.
func (c *RuntimeConfig) settings() *settings.List {
	l := settings.New("runtime repro: ")
	l.Duration(&c.Hold, "runtime-hold", 7*time.Second, 0).Flag("runtime-hold", fmt.Sprintf(
		"runtime: how long another session holds the instance's advisory key each time (above the runtime's %v lock timeout)", RuntimeLockTimeout))
	l.Int(&c.Holds, "runtime-holds", 3, 1).Flag("runtime-holds", "runtime: how many times it holds the key (11 passes the runtime's poison threshold)")
	return l
}

// Register adds the runtime repro's flags to fs, bound to c, its values as
// their defaults.
func (c *RuntimeConfig) Register(fs *flag.FlagSet) { c.settings().Register(fs) }

// Validate refuses settings that cannot show the symptom.
func (c RuntimeConfig) Validate() error {
	if err := c.settings().Check(); err != nil {
		return err
	}
	if c.Hold <= RuntimeLockTimeout {
		return fmt.Errorf("runtime repro: the hold (%v) must exceed the runtime's lock timeout (%v)", c.Hold, RuntimeLockTimeout)
	}
	return nil
}

// RuntimeHold is one time the other session held the key.
type RuntimeHold struct {
	HeldMs int64 `json:"held_ms"`
	// FetchWaited: a session of the runtime queued on the key meanwhile.
	FetchWaited bool `json:"fetch_waited"`
	// FetchesSeen counts the runtime's fetch_orchestration_item calls seen
	// starting while the key was held (pg_stat_activity, sampled): on a
	// side whose fetch only tries the key, the calls that found it held.
	FetchesSeen int `json:"fetches_seen"`
	// AttemptCount is the instance's queued message's attempt_count as the
	// hold ended (-1: no message queued).
	AttemptCount int64 `json:"attempt_count"`
}

// RuntimeSide is what one side did.
type RuntimeSide struct {
	Side   string `json:"side"`
	Schema string `json:"schema"`
	// Made says what built the schema.
	Made string `json:"made"`
	// HeldKey is the advisory key the other session holds: the one this
	// side's fetch takes.
	HeldKey string        `json:"held_key"`
	Holds   []RuntimeHold `json:"holds"`
	// CompletedAfterHold is the number of holds after which the
	// orchestration had completed, 0 when it completed only once the key
	// was let go for good.
	CompletedAfterHold int    `json:"completed_after_hold"`
	Status             string `json:"status"`
	Error              string `json:"error,omitempty"`
	WaitedMs           int64  `json:"waited_ms"`
	// RefusedTurns counts the turns whose ack was refused ("Invalid lock
	// token"): the runtime's "ack_orchestration_item failed" lines less
	// those of the failure event it then tries to commit in their place
	// ("Failed to commit failure event"). A poison turn's refused ack
	// counts too.
	RefusedTurns      int            `json:"refused_turns"`
	InvalidLockTokens int            `json:"invalid_lock_token_lines"`
	LeaseLines        int            `json:"lease_kind_lines"`
	PoisonLines       int            `json:"poison_lines"`
	Tally             map[string]int `json:"warn_error_by_kind"`
	// Sample is the first few lines of the lease kind.
	Sample []string `json:"sample,omitempty"`
	// Leases are the leases its fetches returned, as the server saw them
	// (the lease probe).
	Leases FetchLeases `json:"fetch_leases"`
	// Tries is how many runs the side took: a run that did not meet the
	// form's condition proves nothing and is run again, up to
	// RuntimeTries (the figures are the last run's).
	Tries int `json:"tries"`
}

// RuntimeTries bounds the runs of one side of the held-key form.
const RuntimeTries = 3

// exercised reports whether the side ran under the form's condition: on
// upstream's side, a runtime fetch queued on the held key in every hold;
// on a side whose fetch only tries the key, a runtime fetch found it held
// during the first hold.
func (s RuntimeSide) exercised(holds int) bool {
	if s.Side == SideUpstream {
		if len(s.Holds) != holds {
			return false
		}
		for _, h := range s.Holds {
			if !h.FetchWaited {
				return false
			}
		}
		return true
	}
	return len(s.Holds) > 0 && s.Holds[0].FetchesSeen > 0
}

// clean reports whether the side ran the orchestration as a fix should:
// no line of the lease kind, no lease dead at return, completed once the
// first hold ended.
func (s RuntimeSide) clean() bool {
	return s.LeaseLines == 0 && s.Leases.DeadAtReturn == 0 && s.Status == "Completed" && s.CompletedAfterHold == 1
}

// retry reports whether a run of the side proves nothing and is worth
// another: it did not meet the condition, and (on a side that must be
// fixed) nothing went wrong.
func (s RuntimeSide) retry(holds int) bool {
	if s.Side == SideUpstream {
		return !s.exercised(holds)
	}
	return !s.exercised(holds) && s.clean()
}

// RuntimeResult is the runtime repro's outcome.
type RuntimeResult struct {
	Addon         string `json:"addon"`
	HoldMs        int64  `json:"hold_ms"`
	Holds         int    `json:"holds"`
	LockTimeoutMs int64  `json:"lock_timeout_ms"`
	// The sides and the verdict (OK: reproduced on upstream, fixed on the
	// pack). Reproduced: upstream refused an ack after every hold,
	// attempt_count climbed by one a hold, and the orchestration did not
	// complete while the key was being held. Fixed: the pack logged no
	// line of the lease kind and completed after the first hold.
	sidesVerdict[RuntimeSide]
}

func (s RuntimeSide) key() string { return s.Side }

// RuntimeRepro makes the sides' schemas in src's database (MakeSides,
// prefix runtime) and runs the repro on each; upstream's and the pack's
// must be among them.
func RuntimeRepro(ctx context.Context, src *dbconn.Source, p *upstream.Provider, cfg RuntimeConfig, sides []string, progress func(string)) (RuntimeResult, error) {
	if err := cfg.Validate(); err != nil {
		return RuntimeResult{}, err
	}
	res := RuntimeResult{Addon: upstream.AddonPackage, HoldMs: cfg.Hold.Milliseconds(), Holds: cfg.Holds, LockTimeoutMs: RuntimeLockTimeout.Milliseconds()}
	var err error
	res.Sides, err = onSides(ctx, src, p, "runtime repro", "runtime", sides, func(side Side) (RuntimeSide, error) {
		var rs RuntimeSide
		for try := 1; try <= RuntimeTries; try++ {
			progress(fmt.Sprintf("runtime repro: %s (%s: %s), %d holds of %v, run %d", side.Key, side.Schema, side.Made, cfg.Holds, cfg.Hold, try))
			var err error
			rs, err = runtimeSide(ctx, src, p, side, cfg, try)
			rs.Tries = try
			if err != nil || !rs.retry(cfg.Holds) {
				return rs, err
			}
			progress(fmt.Sprintf("runtime repro: %s: the run did not meet the form's condition (a fetch queued on, or finding, the held key)", side.Key))
		}
		return rs, nil
	})
	if err != nil {
		return res, err
	}
	up, _ := res.Side(SideUpstream)
	pack, _ := res.Side(SidePack)
	res.Reproduced = reproducedOnRuntime(up, cfg)
	res.Fixed = pack.exercised(cfg.Holds) && pack.clean()
	return res, nil
}

// reproducedOnRuntime reports whether upstream's side showed the bug under
// the form's condition: a fetch queued on the key in every hold, each
// hold's lease from a timestamp older than the lock timeout and dead at
// return, an ack refused after every hold, attempt_count climbing by one a
// hold, and the orchestration not completed while the key was held.
func reproducedOnRuntime(s RuntimeSide, cfg RuntimeConfig) bool {
	if !s.exercised(cfg.Holds) || s.CompletedAfterHold != 0 || s.RefusedTurns < cfg.Holds {
		return false
	}
	if s.Leases.Stale < cfg.Holds || s.Leases.StaleDead != s.Leases.Stale {
		return false
	}
	for i, h := range s.Holds {
		if h.AttemptCount != int64(i) {
			return false
		}
	}
	return true
}

// instanceKey reads, over conn, the advisory key (one-key space) a side's
// fetch takes on instance in schema, and names it for people: upstream's
// latest hashes the id alone; upstream's candidate and the pack (0029 on)
// hash the schema's name, a dot and the id.
func instanceKey(ctx context.Context, conn *pgx.Conn, side, schema, instance string) (key int64, text string, err error) {
	if side == SideUpstream {
		err = conn.QueryRow(ctx, "SELECT hashtext($1::text)::bigint", instance).Scan(&key)
		return key, "hashtext(instance_id)", err
	}
	err = conn.QueryRow(ctx, "SELECT hashtext($1::text || '.' || $2::text)::bigint", schema, instance).Scan(&key)
	return key, "hashtext('<schema>' || '.' || instance_id)", err
}

// holder is a session that takes and lets go of one advisory key, the key
// the side's fetch takes on the instance.
type holder struct {
	conn *pgx.Conn
	pid  uint32
	key  int64
}

func (h *holder) lock(ctx context.Context) error {
	_, err := h.conn.Exec(ctx, "SELECT pg_advisory_lock($1)", h.key)
	return err
}

func (h *holder) unlock(ctx context.Context) error {
	_, err := h.conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", h.key)
	return err
}

// runtimeSide runs the real runtime on side's schema (one orchestration
// dispatcher, one worker) while two holder sessions take the instance's
// key in turn: each queues on it behind the runtime's waiting fetch, so the
// fetch gets the key between two holds, as it would behind a convoy.
func runtimeSide(ctx context.Context, src *dbconn.Source, p *upstream.Provider, s Side, cfg RuntimeConfig, try int) (RuntimeSide, error) {
	side := RuntimeSide{Side: s.Key, Schema: s.Schema, Made: s.Made}
	schema := s.Schema
	instance := fmt.Sprintf("repro-runtime-%s-%d", schema, try)
	var hs [2]*holder
	for i := range hs {
		conn, err := src.Connect(ctx)
		if err != nil {
			return side, fmt.Errorf("runtime repro: key holder: %w", err)
		}
		defer conn.Close(context.Background())
		key, text, err := instanceKey(ctx, conn, s.Key, schema, instance)
		if err != nil {
			return side, fmt.Errorf("runtime repro: the key of %s: %w", instance, err)
		}
		side.HeldKey = text
		hs[i] = &holder{conn: conn, pid: conn.PgConn().PID(), key: key}
	}
	qschema := pgx.Identifier{schema}.Sanitize()
	probe, err := installLeaseProbe(ctx, hs[0].conn, schema)
	if err != nil {
		return side, err
	}
	since, err := probe.mark(ctx, hs[0].conn)
	if err != nil {
		return side, err
	}
	// fetchesSeen samples the runtime's fetch calls that started since
	// start (database clock) into seen.
	fetchesSeen := func(ctx context.Context, h *holder, start time.Time, seen map[string]bool) error {
		rows, err := h.conn.Query(ctx, `SELECT pid::text || ' ' || query_start::text FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> ALL($1) AND query_start >= $2
			  AND query LIKE '%fetch_orchestration_item%'`, []int64{int64(hs[0].pid), int64(hs[1].pid)}, start)
		if err != nil {
			return err
		}
		calls, err := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, c := range calls {
			seen[c] = true
		}
		return err
	}
	dbNow := func(ctx context.Context, h *holder) (time.Time, error) {
		var t time.Time
		err := h.conn.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t)
		return t, err
	}
	waiting := func(ctx context.Context, h *holder) (bool, error) {
		var n int
		err := h.conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND objsubid = 1 AND objid = ($1::bigint & 4294967295)::oid AND pid <> ALL($2)`,
			h.key, []int64{int64(hs[0].pid), int64(hs[1].pid)}).Scan(&n)
		return n > 0, err
	}
	completed := func(ctx context.Context, h *holder) (bool, error) {
		var status string
		err := h.conn.QueryRow(ctx, "SELECT e.status FROM "+qschema+".instances i JOIN "+qschema+
			".executions e ON e.instance_id = i.instance_id AND e.execution_id = i.current_execution_id WHERE i.instance_id = $1", instance).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return status == "Completed", err
	}
	attempts := func(ctx context.Context, h *holder) (int64, error) {
		var n int64
		err := h.conn.QueryRow(ctx, "SELECT coalesce(max(attempt_count), -1) FROM "+qschema+".orchestrator_queue WHERE instance_id = $1", instance).Scan(&n)
		return n, err
	}
	if err := hs[0].lock(ctx); err != nil {
		return side, fmt.Errorf("runtime repro: take the key: %w", err)
	}
	acquired := time.Now()
	type outcome struct {
		res *upstream.RuntimeResult
		err error
	}
	done := make(chan outcome, 1)
	wait := time.Duration(cfg.Holds+2)*cfg.Hold + 30*time.Second
	go func() {
		res, err := p.RunRuntime(ctx, src, upstream.RuntimeRun{
			Schema:    schema,
			Runtime:   upstream.RuntimeOptions{OrchestrationConcurrency: 1, WorkerConcurrency: 1},
			Scenarios: []upstream.Scenario{{Name: "single", InstanceID: instance}},
			Wait:      wait,
		})
		done <- outcome{res, err}
	}()
	cur := 0
	for hold := 0; hold < cfg.Holds; hold++ {
		h, next := hs[cur], hs[1-cur]
		var queued chan error // next's lock, queued behind the runtime's waiting fetch
		waited := false
		heldSince, err := dbNow(ctx, h)
		if err != nil {
			return side, fmt.Errorf("runtime repro: the database clock: %w", err)
		}
		seen := map[string]bool{}
		for time.Since(acquired) < cfg.Hold {
			if err := fetchesSeen(ctx, h, heldSince, seen); err != nil {
				return side, fmt.Errorf("runtime repro: pg_stat_activity: %w", err)
			}
			if !waited {
				w, err := waiting(ctx, h)
				if err != nil {
					return side, fmt.Errorf("runtime repro: pg_locks: %w", err)
				}
				if w {
					waited = true
					queued = make(chan error, 1)
					go func() { queued <- next.lock(ctx) }()
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		n, err := attempts(ctx, h)
		if err != nil {
			return side, fmt.Errorf("runtime repro: attempt_count: %w", err)
		}
		side.Holds = append(side.Holds, RuntimeHold{HeldMs: time.Since(acquired).Milliseconds(), FetchWaited: waited, FetchesSeen: len(seen), AttemptCount: n})
		if err := h.unlock(ctx); err != nil {
			return side, fmt.Errorf("runtime repro: let go of the key: %w", err)
		}
		last := hold == cfg.Holds-1
		if queued == nil {
			// Nobody queued on the key (the pack's fetch only tries it):
			// leave it free as long as a waiting fetch would have had it.
			time.Sleep(500 * time.Millisecond)
			if ok, err := completed(ctx, h); err != nil {
				return side, err
			} else if ok {
				side.CompletedAfterHold = hold + 1
				break
			}
			if last {
				break
			}
			queued = make(chan error, 1)
			go func() { queued <- next.lock(ctx) }()
		}
		if err := <-queued; err != nil {
			return side, fmt.Errorf("runtime repro: take the key again: %w", err)
		}
		if last {
			if err := next.unlock(ctx); err != nil {
				return side, err
			}
			break
		}
		acquired = time.Now()
		cur = 1 - cur
	}
	out := <-done
	if out.err != nil {
		return side, out.err
	}
	if side.Leases, err = probe.read(ctx, hs[0].conn, since, RuntimeLockTimeout.Milliseconds()); err != nil {
		return side, err
	}
	single := out.res.Results["single"]
	side.Status, side.Error = single.Status(), single.Error()
	if ms, ok := single["waitedMs"].(float64); ok {
		side.WaitedMs = int64(ms)
	}
	side.Tally = out.res.Tally()
	side.InvalidLockTokens = out.res.InvalidLockTokens()
	for _, l := range out.res.Logs {
		text := l.Text()
		if l.InvalidLockToken() && strings.Contains(l.Message, "ack_orchestration_item failed") {
			side.RefusedTurns++
		}
		if strings.Contains(l.Message, "Failed to commit failure event") {
			side.RefusedTurns--
		}
		if strings.Contains(strings.ToLower(text), "poison") {
			side.PoisonLines++
		}
		if l.Lease() {
			side.LeaseLines++
			if len(side.Sample) < 3 {
				side.Sample = append(side.Sample, text)
			}
		}
	}
	return side, nil
}

// PrintRuntime writes what the runtime repro is, then its table, one
// column per side.
func PrintRuntime(w io.Writer, r RuntimeResult) error {
	holds := r.Holds
	fmt.Fprintf(w, "runtime repro, held-key form: the real duroxide runtime (%s), one orchestration of one turn; another session holds the advisory key the side's fetch takes on its instance, %v at a time, up to %d times: the deterministic form (a held key standing in for the convoy ahead of it); the runtime's orchestration lock timeout is its default, %v\n\n",
		r.Addon, time.Duration(r.HoldMs)*time.Millisecond, holds, time.Duration(r.LockTimeoutMs)*time.Millisecond)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(name string, f func(RuntimeSide) string) {
		cells := []string{name}
		for _, s := range r.Sides {
			cells = append(cells, f(s))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	row("", func(s RuntimeSide) string { return s.Side })
	row("schema", func(s RuntimeSide) string { return s.Schema })
	row("key held", func(s RuntimeSide) string { return s.HeldKey })
	row("a runtime fetch queued on the key, per hold", func(s RuntimeSide) string {
		var parts []string
		for _, h := range s.Holds {
			parts = append(parts, map[bool]string{true: "yes", false: "no"}[h.FetchWaited])
		}
		return strings.Join(parts, " ")
	})
	row("runtime fetches seen starting while the key was held, per hold", func(s RuntimeSide) string {
		var parts []string
		for _, h := range s.Holds {
			parts = append(parts, fmt.Sprint(h.FetchesSeen))
		}
		return strings.Join(parts, " ")
	})
	row("leases from a timestamp older than the lock timeout (dead at return)", func(s RuntimeSide) string {
		return fmt.Sprintf("%d (%d)", s.Leases.Stale, s.Leases.StaleDead)
	})
	row("leases dead at return, in all", func(s RuntimeSide) string { return fmt.Sprint(s.Leases.DeadAtReturn) })
	row("attempt_count at the end of each hold", func(s RuntimeSide) string {
		var parts []string
		for _, h := range s.Holds {
			if h.AttemptCount < 0 {
				parts = append(parts, "-")
			} else {
				parts = append(parts, fmt.Sprint(h.AttemptCount))
			}
		}
		return strings.Join(parts, " ")
	})
	row(`turns whose ack was refused ("Invalid lock token")`, func(s RuntimeSide) string { return fmt.Sprint(s.RefusedTurns) })
	row("WARN/ERROR lines of the lease kind", func(s RuntimeSide) string { return fmt.Sprint(s.LeaseLines) })
	row(`"poison" lines`, func(s RuntimeSide) string { return fmt.Sprint(s.PoisonLines) })
	row("orchestration", func(s RuntimeSide) string {
		when := "only once the key was let go"
		if s.CompletedAfterHold > 0 {
			when = fmt.Sprintf("after hold %d", s.CompletedAfterHold)
		}
		text := fmt.Sprintf("%s %s, %.1f s after its start (runs it took: %d)", s.Status, when, float64(s.WaitedMs)/1000, s.Tries)
		if s.Error != "" {
			text += ": " + s.Error
		}
		return text
	})
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, s := range r.Sides {
		fmt.Fprintf(w, "  %s: %s\n", s.Side, s.Made)
	}
	for _, s := range r.Sides {
		for _, l := range s.Sample {
			fmt.Fprintf(w, "  %s: %s\n", s.Side, l)
		}
	}
	notExercised := func(s RuntimeSide) string {
		return fmt.Sprintf("NOT EXERCISED on %s (%d runs: %s)", sideName(s.Side), s.Tries,
			choose(s.Side == SideUpstream, "no fetch queued on the held key in every hold", "no fetch found the key held"))
	}
	up, _ := r.Side(SideUpstream)
	pack, _ := r.Side(SidePack)
	verdict := "NOT REPRODUCED on upstream"
	switch {
	case r.Reproduced:
		verdict = "reproduced on upstream"
	case !up.exercised(r.Holds):
		verdict = notExercised(up)
	}
	switch {
	case r.Fixed:
		verdict += ", fixed on the pack"
	case pack.clean() && !pack.exercised(r.Holds):
		verdict += ", " + notExercised(pack)
	default:
		verdict += ", NOT FIXED on the pack"
	}
	if c, ok := r.Side(SideCandidate); ok {
		verdict += "; upstream's candidate " + choose(c.clean(), "skips the held key and completes once it is free (reported)", "does NOT complete cleanly (reported)")
	}
	_, err := fmt.Fprintf(w, "\nverdict: %s\n", verdict)
	return err
}

// runtimeMarkdown renders r as a Markdown section: the table in a code block.
func runtimeMarkdown(r RuntimeResult) string {
	var b strings.Builder
	b.WriteString("## The real runtime (runtime repro)\n\n```\n")
	_ = PrintRuntime(&b, r)
	b.WriteString("```\n")
	return b.String()
}
