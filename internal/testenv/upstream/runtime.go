package upstream

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/duroxide-pg/migrations/internal/dbconn"
)

// runtimeDriver is the project's own wrapper of the addon's raw exports
// (tools/upstream/runtime.js): it runs the real duroxide runtime and its
// client on one schema and answers in JSON.
const runtimeDriver = "runtime.js"

// RuntimeOptions are the runtime's options the driver passes on
// (JsRuntimeOptions; zero fields take the runtime's defaults, except the
// poll interval, which the driver sets to 10 ms).
type RuntimeOptions struct {
	OrchestrationConcurrency int      `json:"orchestrationConcurrency,omitempty"`
	WorkerConcurrency        int      `json:"workerConcurrency,omitempty"`
	DispatcherPollIntervalMs int      `json:"dispatcherPollIntervalMs,omitempty"`
	WorkerTagFilter          string   `json:"workerTagFilter,omitempty"`
	WorkerTagFilterTags      []string `json:"workerTagFilterTags,omitempty"`
}

// Scenario is one thing the driver does with the client (runtime.js,
// `scenarios`): Name picks it; Key names its result and its instance id
// (default Name). The numeric fields are the scenario's parameters (zero:
// the driver's default).
type Scenario struct {
	Name       string `json:"name"`
	Key        string `json:"key,omitempty"`
	Count      int    `json:"count,omitempty"`
	DelayMs    int    `json:"delayMs,omitempty"`
	Turns      int    `json:"turns,omitempty"`
	Tag        string `json:"tag,omitempty"`
	InstanceID string `json:"instanceId,omitempty"`
	TimeoutMs  int64  `json:"timeoutMs,omitempty"`
	// Sequential starts the load's instances one after another, each once
	// the one before has completed (scenario load only).
	Sequential bool `json:"sequential,omitempty"`
	// SignalFile is a file the scenario appends a JSON line to at each of
	// its steps ({"event": ..., "atMs": ...}; scenario eventBacklog:
	// "subscribed", "raised", "done"), so that a caller working against the
	// runtime from outside can time its actions to the client's.
	SignalFile string `json:"signalFile,omitempty"`
	// UntilFile ends scenario idle once the file exists (at most the
	// scenario's wait).
	UntilFile string `json:"untilFile,omitempty"`
}

// RuntimeRun is one run of the driver: one runtime process on one schema.
type RuntimeRun struct {
	Schema    string
	Runtime   RuntimeOptions
	Scenarios []Scenario
	// Prefix starts every instance id (runs on one schema need distinct ones).
	Prefix string
	// Wait bounds each scenario's wait for its instances (default 2 min).
	Wait time.Duration
	// FinalState asks for the client's view of the whole database after
	// every scenario (queue depths, system metrics).
	FinalState bool
	// PoolMax is the size of the provider's connection pool, passed to the
	// driver's process as DUROXIDE_PG_POOL_MAX (0: the provider's default,
	// 10, or whatever the environment already says).
	PoolMax int
	// ApplicationName names the runtime's connections
	// (pg_stat_activity.application_name), so that a caller injecting
	// faults finds them; empty leaves the DSN's. It needs a DSN in URL
	// form, the only one the provider reads.
	ApplicationName string
	// Via is a DSN (URL form) the runtime connects with instead of src's:
	// the same database through PgBouncer. The harness's own statements
	// still go to src.
	Via string
	// Env are environment entries ("NAME=value") the driver's process
	// gets on top of this process's (libfaketime's, to skew its clock).
	Env []string
	// ActivityRuns asks for the executions of the driver's Square activity
	// by instance, execution and input (RuntimeResult.ActivityRuns).
	ActivityRuns bool
}

// envPoolMax is the variable duroxide-pg reads its pool size from.
const envPoolMax = "DUROXIDE_PG_POOL_MAX"

// Outcome is what the client saw of one scenario: status ("Completed",
// "Failed", "Running", "DriverError", ...), output, error, and the
// scenario's own observations, as the driver's JSON decodes.
type Outcome map[string]any

// Status is the instance's final status.
func (o Outcome) Status() string { s, _ := o["status"].(string); return s }

// Output is the completed instance's output.
func (o Outcome) Output() string { s, _ := o["output"].(string); return s }

// Error is the failed instance's error (or the driver's).
func (o Outcome) Error() string { s, _ := o["error"].(string); return s }

// LogLine is one WARN or ERROR record of the runtime's log.
type LogLine struct {
	Level   string            `json:"level"`
	Target  string            `json:"target"`
	Message string            `json:"message"`
	Fields  map[string]string `json:"fields,omitempty"`
}

// Kind is what the tallies count the line under: its level, target and
// message (the message is a fixed text; the variable parts are fields).
func (l LogLine) Kind() string { return l.Level + " " + l.Target + ": " + l.Message }

// Text is the line as one string, fields sorted.
func (l LogLine) Text() string {
	keys := make([]string, 0, len(l.Fields))
	for k := range l.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(l.Kind())
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%s", k, l.Fields[k])
	}
	return b.String()
}

// leaseText matches the runtime's words about a lock lease: a refused
// token, an expired lock, a lost lease. Whole words only: a schema named
// e2e_released_upgrade is not a lease.
var leaseText = regexp.MustCompile(`(?i)\block token\b|\block\b.*\b(lost|expired)\b|\blease[sd]?\b`)

// statementFields are the fields where the runtime quotes SQL (sqlx's slow
// statement warning): a statement naming a schema or a function is not a
// line about a lease.
var statementFields = map[string]bool{"db.statement": true, "summary": true}

// Lease reports whether the line is of the lease kind ("Invalid lock
// token", "lock expired", ...), read from its message and every field but
// the SQL it quotes.
func (l LogLine) Lease() bool {
	if leaseText.MatchString(l.Message) {
		return true
	}
	for k, v := range l.Fields {
		if !statementFields[k] && leaseText.MatchString(k+" "+v) {
			return true
		}
	}
	return false
}

// InvalidLockToken reports whether the line carries the seed's symptom.
func (l LogLine) InvalidLockToken() bool { return strings.Contains(l.Text(), "Invalid lock token") }

// RuntimeResult is what one run of the driver gave.
type RuntimeResult struct {
	Results map[string]Outcome `json:"results"`
	// RunMs is the time from the first scenario's start to the last one's end.
	RunMs int64 `json:"runMs"`
	// WallMs is the process's time to the report, provider connection included.
	WallMs int64 `json:"wallMs"`
	// NowMs is the process's clock when it reported (epoch ms), and
	// ClockOffset its difference from this process's clock when the report
	// was read (libfaketime's offset, give or take the report's delivery).
	NowMs       int64         `json:"nowMs"`
	ClockOffset time.Duration `json:"-"`
	// Turns is the number of orchestration turns the driver ran (create calls).
	Turns   int                `json:"turns"`
	Metrics map[string]float64 `json:"metrics"`
	Final   map[string]any     `json:"final,omitempty"`
	// ActivityRuns are the executions of the driver's Square activity by
	// "instance#execution#input", when the run asked for them.
	ActivityRuns map[string]int `json:"activityRuns,omitempty"`
	// Logs are the runtime's WARN and ERROR lines, in order.
	Logs []LogLine `json:"-"`
	// SetAside lists the versions of _duroxide_migrations the addon does
	// not know (above AddonNewest, and 22: upstream's branch files) taken
	// out while the provider
	// connected and put back once it had: the addon refuses a schema that
	// records a version it does not know.
	SetAside []int64 `json:"-"`
}

// Tally counts the WARN and ERROR lines by kind.
func (r *RuntimeResult) Tally() map[string]int {
	out := map[string]int{}
	for _, l := range r.Logs {
		out[l.Kind()]++
	}
	return out
}

// LeaseLines are the lines of the lease kind.
func (r *RuntimeResult) LeaseLines() []LogLine {
	var out []LogLine
	for _, l := range r.Logs {
		if l.Lease() {
			out = append(out, l)
		}
	}
	return out
}

// InvalidLockTokens counts the lines carrying "Invalid lock token".
func (r *RuntimeResult) InvalidLockTokens() int {
	n := 0
	for _, l := range r.Logs {
		if l.InvalidLockToken() {
			n++
		}
	}
	return n
}

// driver finds runtime.js in tools/upstream.
func (p *Provider) driver() (string, error) {
	dir, err := toolsDir()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, runtimeDriver)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%w: %v", errUnavailable, err)
	}
	return path, nil
}

// RunRuntime runs the real duroxide runtime on dsn's database and run's
// schema: the real provider connects (its runner applies any upstream
// migration the schema does not record: none on a schema the pack took to
// its latest version), the runtime starts with run.Runtime, the client
// runs every scenario at once, and the runtime shuts down. dsn is handed
// to the driver on its stdin, not its command line. Rows of versions the
// addon does not know (upstream's candidate fix) are set aside while the
// provider connects (RuntimeResult.SetAside).
func (p *Provider) RunRuntime(ctx context.Context, src *dbconn.Source, run RuntimeRun) (*RuntimeResult, error) {
	driver, err := p.driver()
	if err != nil {
		return nil, err
	}
	if run.Schema == "" {
		return nil, errors.New("runtime run: no schema")
	}
	wait := run.Wait
	if wait <= 0 {
		wait = 2 * time.Minute
	}
	logDir, err := os.MkdirTemp("", "duroxide-runtime-")
	if err != nil {
		return nil, fmt.Errorf("runtime run: %w", err)
	}
	defer os.RemoveAll(logDir)
	logFile := filepath.Join(logDir, "runtime.log")
	dsn, err := withApplicationName(cmp.Or(run.Via, src.DSN()), run.ApplicationName)
	if err != nil {
		return nil, fmt.Errorf("runtime run: %w", err)
	}
	req, err := json.Marshal(map[string]any{
		"dsn": dsn, "schema": run.Schema, "logFile": logFile, "runtime": run.Runtime,
		"scenarios": run.Scenarios, "prefix": run.Prefix, "timeoutMs": wait.Milliseconds(),
		"finalState": run.FinalState, "activityRuns": run.ActivityRuns,
	})
	if err != nil {
		return nil, fmt.Errorf("runtime run: %w", err)
	}
	// The process's own bound: every scenario's wait, the provider's
	// connection and the shutdown.
	ctx, cancel := context.WithTimeout(ctx, wait+2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.node, driver, p.addon)
	cmd.Stdin = bytes.NewReader(req)
	if run.PoolMax > 0 || len(run.Env) > 0 {
		// The rest of the environment as it is; a later entry wins.
		cmd.Env = append(os.Environ(), run.Env...)
		if run.PoolMax > 0 {
			cmd.Env = append(cmd.Env, fmt.Sprintf("%s=%d", envPoolMax, run.PoolMax))
		}
	}
	var stdout bytes.Buffer
	stderr := newConnectedWriter()
	cmd.Stdout = &stdout
	cmd.Stderr = stderr
	held, err := setAside(ctx, src, run.Schema)
	if err != nil {
		return nil, err
	}
	runErr := cmd.Start()
	exited := make(chan struct{})
	if runErr == nil {
		go func() { runErr = cmd.Wait(); close(exited) }()
	} else {
		close(exited)
	}
	var setAsideVersions []int64
	if held != nil {
		setAsideVersions = held.Version
		stderr.waitConnected(exited, 2*time.Minute)
		if err := held.restore(ctx); err != nil {
			<-exited
			return nil, err
		}
	}
	<-exited
	readAt := time.Now()
	logs, logErr := readLog(logFile)
	var res RuntimeResult
	var fatal struct {
		Fatal string `json:"fatal"`
	}
	out := bytes.TrimSpace(stdout.Bytes())
	_ = json.Unmarshal(out, &fatal)
	switch {
	case fatal.Fatal != "":
		return nil, fmt.Errorf("duroxide runtime (%s) on schema %s: %s", AddonPackage, run.Schema, fatal.Fatal)
	case runErr != nil:
		return nil, fmt.Errorf("duroxide runtime (%s) on schema %s: %w: %s", AddonPackage, run.Schema, runErr, tail(stderr.String()))
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, fmt.Errorf("duroxide runtime (%s) on schema %s: reading its report: %w: %s", AddonPackage, run.Schema, err, tail(string(out)))
	}
	if logErr != nil {
		return nil, fmt.Errorf("duroxide runtime (%s) on schema %s: reading its log: %w", AddonPackage, run.Schema, logErr)
	}
	res.Logs = logs
	res.SetAside = setAsideVersions
	res.ClockOffset = time.Duration(res.NowMs-readAt.UnixMilli()) * time.Millisecond
	return &res, nil
}

// withApplicationName returns dsn with its application_name set to name
// (dsn as it is when name is empty).
func withApplicationName(dsn, name string) (string, error) {
	if name == "" {
		return dsn, nil
	}
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", errors.New("an application name needs a DSN in URL form (postgres://...)")
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// readLog reads the runtime's JSON log and keeps its WARN and ERROR lines.
func readLog(path string) ([]LogLine, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // nothing was logged
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []LogLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		var rec struct {
			Level  string                     `json:"level"`
			Target string                     `json:"target"`
			Fields map[string]json.RawMessage `json:"fields"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			// A line that is not JSON (a panic's text) counts as an ERROR.
			out = append(out, LogLine{Level: "ERROR", Target: "unparsed", Message: sc.Text()})
			continue
		}
		if rec.Level != "WARN" && rec.Level != "ERROR" {
			continue
		}
		line := LogLine{Level: rec.Level, Target: rec.Target, Fields: map[string]string{}}
		for k, v := range rec.Fields {
			var s string
			if json.Unmarshal(v, &s) != nil {
				s = string(v)
			}
			if k == "message" {
				line.Message = s
			} else {
				line.Fields[k] = s
			}
		}
		out = append(out, line)
	}
	return out, sc.Err()
}

func tail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return s
}
