// Package realfaults runs the real duroxide runtime (through the project's
// driver, tools/upstream/runtime.js) on several schemas at once while it
// injects faults into the database they share: backends terminated, a
// server restart. Each side (a schema: upstream's as its runner made it,
// the pack's latest) runs the same load, and the report says, per side,
// what the client saw: orchestrations completed with the expected output,
// lost, completed twice or with a wrong output, failed (by the runtime's
// failure classes), activity executions beyond one, and the runtime's
// WARN and ERROR lines by kind.
//
// internal/sim/faults injects the same faults into the project's
// simulator; this package checks the real runtime.
package realfaults

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// Side is one schema the load runs on.
type Side struct {
	// Name labels the side in the report ("upstream", "pack").
	Name   string
	Schema string
}

// Fault injects one kind of fault while the load runs.
type Fault interface {
	// Name says what the fault does, for the report.
	Name() string
	// Inject injects faults into the runtimes whose connections carry the
	// application names apps until ctx ends, and returns how many it
	// injected. An error ends the run.
	Inject(ctx context.Context, apps []string) (int, error)
}

// Load is what every side runs: Orchestrations instances of the driver's
// Mixed orchestration (an activity, a timer, a fan-out of three and its
// fan-in), started at once; the fault runs from the moment every side has
// started them, for FaultFor.
type Load struct {
	Orchestrations int
	// TimerMs is the Mixed orchestration's timer.
	TimerMs int
	// FaultFor bounds the fault's run (zero: as long as the load runs).
	FaultFor time.Duration
	// Deadline is how long each side waits for its instances to reach a
	// terminal state; one that has not is lost.
	Deadline time.Duration
	// Runtime are the runtime's options (concurrency).
	Runtime upstream.RuntimeOptions
	// Clocks are the runtime processes of every side, by their clock's
	// offset from the database's (libfaketime on the node process): the
	// first starts the load and waits for it, the others work on it until
	// the first is done. Empty: one process on the database's clock.
	Clocks []time.Duration
}

// processes are the load's clocks, one process on the database's clock
// when it names none.
func (l Load) processes() []time.Duration {
	if len(l.Clocks) == 0 {
		return []time.Duration{0}
	}
	return l.Clocks
}

// SideReport is what one side's client and log showed.
type SideReport struct {
	Side Side
	// Orchestrations is how many were started.
	Orchestrations int
	// Completed with the expected output.
	Completed int
	// Wrong completed with another output.
	Wrong int
	// Failed reached Failed; Failures counts them by error text.
	Failed   int
	Failures map[string]int
	// Lost did not reach a terminal state within the deadline.
	Lost int
	// Twice are executions whose history records more than one terminal
	// event.
	Twice int
	// ActivityRuns counts executions of the scheduled activities (four per
	// orchestration), ActivityRunsBeyondOne those beyond the first of each:
	// duroxide runs an activity at least once.
	ActivityRuns          int
	ActivityRunsBeyondOne int
	// ClientErrors counts the client calls that failed and were retried.
	ClientErrors int
	// Logs are the runtime's WARN and ERROR lines by kind, LogSamples the
	// first line of each kind, fields included.
	Logs       map[string]int
	LogSamples map[string]string
	// Unclassified are the failures outside the runtime's own failure
	// classes (RuntimeClass).
	Unclassified map[string]int
	// WallMs is the side's time from its first start to its last status.
	WallMs int64
	// Processes are the side's runtime processes, the load's first.
	Processes []Process
}

// Process is one runtime process of a side.
type Process struct {
	// Clock is the offset asked for; Measured the offset its report showed.
	Clock, Measured time.Duration
	// Turns are the orchestration turns it ran, ActivityRuns the
	// activities it executed.
	Turns, ActivityRuns int
}

// Report is one run: the fault, how many it injected, and every side.
type Report struct {
	Fault    string
	Injected int
	// Clocks are the runtime processes' clock offsets, on every side.
	Clocks []time.Duration
	Sides  []SideReport
}

// runtimeClasses are the failures the runtime makes of a fault on its own
// account, whatever the schema: their texts, as the client reports them.
// docs/RELIABILITY.md describes each.
var runtimeClasses = []struct {
	name string
	text *regexp.Regexp
}{
	{"a terminated connection during an ack (non-retryable in duroxide-pg)",
		regexp.MustCompile(`(?i)terminating connection|server closed the connection|connection reset|broken pipe|unexpected eof|connection refused|shutting down|the database system is (starting|shutting)`)},
}

// RuntimeClass names the runtime's own failure class of a failed
// orchestration's error text, or "" when it is none of them.
func RuntimeClass(errorText string) string {
	for _, c := range runtimeClasses {
		if c.text.MatchString(errorText) {
			return c.name
		}
	}
	return ""
}

// Target is the database the sides' schemas are in.
type Target struct {
	// DB is the database; the report and the faults' sessions use it.
	DB *dbconn.Source
	// Via is a DSN (URL form) the runtime connects with instead of DB's:
	// the same database through PgBouncer.
	Via string
}

// Run runs load on every side at once, on target's database, injects
// fault (nil: none) while it runs, and reports per side. Each side's
// schema must exist and hold a duroxide-pg schema the runtime can run on.
func Run(ctx context.Context, p *upstream.Provider, target Target, sides []Side, fault Fault, load Load) (*Report, error) {
	src := target.DB
	if len(sides) == 0 {
		return nil, errors.New("realfaults: no side")
	}
	dir, err := os.MkdirTemp("", "duroxide-realfaults-")
	if err != nil {
		return nil, fmt.Errorf("realfaults: %w", err)
	}
	defer os.RemoveAll(dir)
	clocks := load.processes()
	env := make([][]string, len(clocks))
	for j, offset := range clocks {
		if env[j], err = faketimeEnv(offset); err != nil {
			return nil, err
		}
	}
	apps := make([]string, len(sides))
	signals := make([]string, len(sides))
	// results[i][j] is side i's process j.
	results := make([][]*upstream.RuntimeResult, len(sides))
	errs := make([][]error, len(sides))
	var wg sync.WaitGroup
	for i, s := range sides {
		apps[i] = "duroxide-realfaults-" + s.Name
		signals[i] = filepath.Join(dir, s.Name+".signals")
		stop := filepath.Join(dir, s.Name+".stop")
		results[i] = make([]*upstream.RuntimeResult, len(clocks))
		errs[i] = make([]error, len(clocks))
		for j := range clocks {
			run := upstream.RuntimeRun{
				Schema: s.Schema, Runtime: load.Runtime, ApplicationName: apps[i], Env: env[j], Via: target.Via,
				Prefix: "faults-", Wait: load.Deadline, ActivityRuns: true,
				Scenarios: []upstream.Scenario{{
					Name: "faultLoad", Key: s.Name, Count: load.Orchestrations, DelayMs: load.TimerMs,
					SignalFile: signals[i],
				}},
			}
			if j > 0 {
				run.Scenarios = []upstream.Scenario{{Name: "idle", Key: fmt.Sprintf("%s-helper-%d", s.Name, j), UntilFile: stop}}
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i][j], errs[i][j] = p.RunRuntime(ctx, src, run)
				if j == 0 {
					// The load is over: the side's other processes end.
					_ = os.WriteFile(stop, nil, 0o600)
				}
			}()
		}
	}
	runsDone := make(chan struct{})
	go func() { wg.Wait(); close(runsDone) }()

	report := &Report{Fault: "none", Clocks: clocks}
	var faultErr error
	if fault != nil {
		report.Fault = fault.Name()
		if waitSignals(ctx, signals, "started", runsDone) {
			// The fault runs while the load does, for at most FaultFor.
			var fctx context.Context
			var cancel context.CancelFunc
			if load.FaultFor > 0 {
				fctx, cancel = context.WithTimeout(ctx, load.FaultFor)
			} else {
				fctx, cancel = context.WithCancel(ctx)
			}
			go func() {
				select {
				case <-runsDone:
					cancel()
				case <-fctx.Done():
				}
			}()
			report.Injected, faultErr = fault.Inject(fctx, apps)
			cancel()
		}
	}
	<-runsDone
	for i, s := range sides {
		for j := range clocks {
			if errs[i][j] != nil {
				return nil, fmt.Errorf("realfaults: side %s, process %d (clock %+v): %w", s.Name, j, clocks[j], errs[i][j])
			}
		}
	}
	if faultErr != nil {
		return nil, fmt.Errorf("realfaults: %s: %w", report.Fault, faultErr)
	}

	conn, err := src.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("realfaults: %w", err)
	}
	defer conn.Close(context.Background())
	for i, s := range sides {
		side, err := sideReport(ctx, conn, s, clocks, results[i])
		if err != nil {
			return nil, err
		}
		report.Sides = append(report.Sides, side)
	}
	return report, nil
}

// waitSignals waits until every signal file has a line of event, or until
// runsDone closes or ctx ends first (then false).
func waitSignals(ctx context.Context, files []string, event string, runsDone <-chan struct{}) bool {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		all := true
		for _, f := range files {
			if !hasSignal(f, event) {
				all = false
				break
			}
		}
		if all {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-runsDone:
			return false
		case <-tick.C:
		}
	}
}

func hasSignal(file, event string) bool {
	f, err := os.Open(file)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var line struct {
			Event string `json:"event"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Event == event {
			return true
		}
	}
	return false
}

// sideReport reads one side's results (its first process ran the load)
// and counts, in its schema, the executions with more than one terminal
// event.
func sideReport(ctx context.Context, conn *pgx.Conn, s Side, clocks []time.Duration, runs []*upstream.RuntimeResult) (SideReport, error) {
	out, ok := runs[0].Results[s.Name]
	if !ok {
		return SideReport{}, fmt.Errorf("realfaults: side %s: the driver reported no result", s.Name)
	}
	if out.Status() == "DriverError" {
		return SideReport{}, fmt.Errorf("realfaults: side %s: driver: %s", s.Name, out.Error())
	}
	r := SideReport{
		Side: s, Logs: map[string]int{}, LogSamples: map[string]string{}, Failures: map[string]int{}, Unclassified: map[string]int{},
		Orchestrations: number(out, "count"),
		Completed:      number(out, "completed"),
		Wrong:          number(out, "wrong"),
		Failed:         number(out, "failed"),
		Lost:           number(out, "lost"),
		ClientErrors:   number(out, "clientErrors"),
		WallMs:         int64(number(out, "wallMs")),
	}
	// Activity executions and log lines over every process of the side.
	ran := map[string]int{}
	for j, res := range runs {
		p := Process{Clock: clocks[j], Measured: res.ClockOffset.Round(time.Second), Turns: res.Turns}
		for _, n := range res.ActivityRuns {
			p.ActivityRuns += n
		}
		r.Processes = append(r.Processes, p)
		for _, l := range res.Logs {
			r.Logs[l.Kind()]++
			if _, ok := r.LogSamples[l.Kind()]; !ok {
				r.LogSamples[l.Kind()] = l.Text()
			}
		}
		for key, n := range res.ActivityRuns {
			if strings.HasPrefix(key, "faults-"+s.Name+"-") {
				ran[key] += n
			}
		}
	}
	for _, n := range ran {
		r.ActivityRuns += n
		r.ActivityRunsBeyondOne += n - 1
	}
	if failures, ok := out["failures"].(map[string]any); ok {
		for text, n := range failures {
			c, _ := n.(float64)
			r.Failures[text] = int(c)
			if RuntimeClass(text) == "" {
				r.Unclassified[text] = int(c)
			}
		}
	}
	history := pgx.Identifier{s.Schema, "history"}.Sanitize()
	err := conn.QueryRow(ctx, `SELECT count(*) FROM (
		SELECT instance_id, execution_id FROM `+history+`
		WHERE instance_id LIKE $1 AND event_type IN ('OrchestrationCompleted', 'OrchestrationFailed')
		GROUP BY instance_id, execution_id HAVING count(*) > 1) AS twice`,
		"faults-"+s.Name+"-%").Scan(&r.Twice)
	if err != nil {
		return SideReport{}, fmt.Errorf("realfaults: side %s: counting terminal events: %w", s.Name, err)
	}
	return r, nil
}

func number(o upstream.Outcome, key string) int {
	f, _ := o[key].(float64)
	return int(f)
}

// Problems lists what the pack's side must never show: an orchestration
// lost, completed twice or with a wrong output, or failed outside the
// runtime's own failure classes. Empty when the side is sound.
func (r SideReport) Problems() []string {
	var out []string
	if r.Lost > 0 {
		out = append(out, fmt.Sprintf("%d of %d orchestrations lost (not terminal at the deadline)", r.Lost, r.Orchestrations))
	}
	if r.Wrong > 0 {
		out = append(out, fmt.Sprintf("%d completed with a wrong output", r.Wrong))
	}
	if r.Twice > 0 {
		out = append(out, fmt.Sprintf("%d executions with more than one terminal event", r.Twice))
	}
	texts := make([]string, 0, len(r.Unclassified))
	for t := range r.Unclassified {
		texts = append(texts, t)
	}
	sort.Strings(texts)
	for _, t := range texts {
		out = append(out, fmt.Sprintf("%d failed outside the runtime's failure classes: %s", r.Unclassified[t], t))
	}
	if n := r.Completed + r.Wrong + r.Failed + r.Lost; n != r.Orchestrations {
		out = append(out, fmt.Sprintf("the counts add up to %d, not %d", n, r.Orchestrations))
	}
	return out
}

// String is one line per side, for a test's log.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d injected; runtime clocks %v\n", r.Fault, r.Injected, r.Clocks)
	for _, s := range r.Sides {
		fmt.Fprintf(&b, "  %s: %d started, %d completed, %d wrong, %d failed %v, %d lost, %d twice, %d activity runs (%d beyond one), %d client errors, %d ms; logs %v\n",
			s.Side.Name, s.Orchestrations, s.Completed, s.Wrong, s.Failed, s.Failures, s.Lost, s.Twice,
			s.ActivityRuns, s.ActivityRunsBeyondOne, s.ClientErrors, s.WallMs, s.Logs)
		for _, p := range s.Processes {
			fmt.Fprintf(&b, "    process at %v (measured %v): %d turns, %d activity runs\n", p.Clock, p.Measured, p.Turns, p.ActivityRuns)
		}
	}
	return b.String()
}

// MakeSides makes, in src's database, the two sides every scenario
// compares: upstream's schema as the real provider's own runner makes it
// (schema prefix + "upstream", the control) and the pack's latest (prefix
// + "pack"), and returns them in that order.
func MakeSides(ctx context.Context, p *upstream.Provider, src *dbconn.Source, prefix string) ([]Side, error) {
	up, pack := prefix+"upstream", prefix+"pack"
	if err := p.Migrate(ctx, src, up); err != nil {
		return nil, fmt.Errorf("realfaults: the real provider makes %s: %w", up, err)
	}
	r, err := migrate.Open(ctx, src.Config(), migrate.Options{Schema: pack})
	if err != nil {
		return nil, fmt.Errorf("realfaults: %w", err)
	}
	defer r.Close()
	if _, err := r.Up(ctx); err != nil {
		return nil, fmt.Errorf("realfaults: migrate up %s: %w", pack, err)
	}
	return []Side{{Name: "upstream", Schema: up}, {Name: "pack", Schema: pack}}, nil
}
