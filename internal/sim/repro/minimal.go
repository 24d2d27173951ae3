// Package repro shows the bugs the pack fixes and their absence after the
// fixes. The orchestration repros compare sides (Side): upstream's latest
// as its own runner makes it, upstream's candidate fix of its issue #21
// (our port), and the pack's latest: the lease defect of
// fetch_orchestration_item with the minimal, deterministic repro (a stale
// caller timestamp), the organic one (many dispatchers) and the real
// runtime (a held key, a pool wait). The worker queue's repros compare the
// pack's versions just before and with its worker fixes (WorkerVersions:
// read from sql/). Each comes with its verdict, its tables and its report
// sections.
package repro

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/upstream"
)

// MinimalConfig is the minimal repro's input.
type MinimalConfig struct {
	// StaleMs is how far behind the database clock the caller's p_now_ms
	// is (default 10 s: the seed's repro).
	StaleMs int64
	// LockTimeoutMs is the lock timeout passed to fetch (default 5000).
	LockTimeoutMs int64
	// Filter is the version filter (the runtime always passes one).
	Filter *orch.VersionRange
}

func (c *MinimalConfig) defaults() {
	if c.StaleMs == 0 {
		c.StaleMs = 10_000
	}
	if c.LockTimeoutMs == 0 {
		c.LockTimeoutMs = 5_000
	}
}

// StaleFetch is what one schema did with a fetch whose p_now_ms was
// StaleMs behind the database clock, then an ack with the returned token
// and a current p_now_ms: the minimal repros' first scenario, for the
// orchestration queue (Minimal) and the worker queue (WorkerMinimal).
type StaleFetch struct {
	Schema string `json:"schema"`
	// Version is the pack's version of the schema (0 for a side upstream's
	// runner made).
	Version int64 `json:"version,omitempty"`
	// Side and Made say which side of a comparison of sides it is.
	Side          string `json:"side,omitempty"`
	Made          string `json:"made,omitempty"`
	StaleMs       int64  `json:"stale_ms"`
	LockTimeoutMs int64  `json:"lock_timeout_ms"`
	// Fetched is false when fetch returned no row (which is itself a
	// failure of the repro).
	Fetched bool `json:"fetched"`
	// RemainingMs is locked_until minus the database clock when the
	// function returned.
	RemainingMs int64  `json:"remaining_ms"`
	AckOK       bool   `json:"ack_ok"`
	AckError    string `json:"ack_error,omitempty"`
}

// Bug reports the symptom before the fix: a lease already expired when
// returned, and the ack refused.
func (r StaleFetch) Bug() bool {
	return r.Fetched && r.RemainingMs <= 0 && !r.AckOK
}

// Fixed reports the behaviour of the fix: a full lease (at least the
// timeout minus 100 ms by the database clock) and a successful ack.
func (r StaleFetch) Fixed() bool {
	return r.Fetched && r.RemainingMs >= r.LockTimeoutMs-100 && r.AckOK
}

func (r StaleFetch) version() int64 { return r.Version }

// ack is the ack's outcome as the tables show it: "ok", what refused it
// (refused), or "-" when nothing was fetched.
func (r StaleFetch) ack(refused string) string {
	switch {
	case r.AckOK:
		return "ok"
	case r.AckError != "":
		return refused
	}
	return "-"
}

// MinimalResult is what one schema did with a stale caller timestamp.
type MinimalResult struct {
	StaleFetch
	Instance string `json:"instance"`
}

// Minimal enqueues one visible message for a fresh instance in schema,
// fetches it with p_now_ms StaleMs behind the database clock, reads the
// lease against the database clock, and acks with the token and a fresh
// timestamp, as the runtime would after its turn.
func Minimal(ctx context.Context, q orch.Querier, schema string, version int64, cfg MinimalConfig) (MinimalResult, error) {
	cfg.defaults()
	c := orch.New(schema)
	res := MinimalResult{Instance: pgtest.UniqueName("repro-minimal-"),
		StaleFetch: StaleFetch{Schema: schema, Version: version, StaleMs: cfg.StaleMs, LockTimeoutMs: cfg.LockTimeoutMs}}
	dbNow, err := orch.DBNowMs(ctx, q)
	if err != nil {
		return res, fmt.Errorf("read database clock: %w", err)
	}
	// Visible well before the stale timestamp, so both versions see it.
	visible := time.UnixMilli(dbNow - cfg.StaleMs - 60_000)
	if err := c.Enqueue(ctx, q, res.Instance, orch.StartWorkItem(res.Instance, "ReproMinimal", "1.0.0", 1), visible); err != nil {
		return res, err
	}
	dbNow, err = orch.DBNowMs(ctx, q)
	if err != nil {
		return res, err
	}
	item, err := c.Fetch(ctx, q, dbNow-cfg.StaleMs, cfg.LockTimeoutMs, cfg.Filter)
	if err != nil {
		return res, err
	}
	if item == nil || item.InstanceID != res.Instance {
		return res, nil
	}
	res.Fetched = true
	lease, err := c.ReadLease(ctx, q, item.LockToken)
	if err != nil {
		return res, err
	}
	res.RemainingMs = lease.LockedUntilMs - lease.DBNowMs
	ackNow, err := orch.DBNowMs(ctx, q)
	if err != nil {
		return res, err
	}
	if err := c.AckItem(ctx, q, item.LockToken, ackNow, orch.Ack{}); err != nil {
		if !orch.IsInvalidLockToken(err) {
			return res, err
		}
		res.AckError = "Invalid lock token"
	} else {
		res.AckOK = true
	}
	return res, nil
}

// MinimalRepro makes the minimal repro's sides in the database of src
// (MakeSides, prefix minimal) and runs it (RunMinimal).
func MinimalRepro(ctx context.Context, src *dbconn.Source, p *upstream.Provider, sides []string) (MinimalResults, error) {
	made, err := MakeSides(ctx, src, p, "minimal", sides)
	if err != nil {
		return nil, fmt.Errorf("minimal repro: %w", err)
	}
	return RunMinimal(ctx, src, made)
}

// RunMinimal runs Minimal on each side's schema, in the database of src,
// over one connection, with the runtime's version filter.
func RunMinimal(ctx context.Context, src *dbconn.Source, sides []Side) (MinimalResults, error) {
	conn, err := src.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("minimal repro: %w", err)
	}
	defer conn.Close(context.Background())
	var out []MinimalResult
	for _, side := range sides {
		r, err := Minimal(ctx, conn, side.Schema, 0, MinimalConfig{Filter: orch.RuntimeFilter()})
		if err != nil {
			return nil, fmt.Errorf("minimal repro on %s (%s): %w", side.Key, side.Schema, err)
		}
		r.Side, r.Made = side.Key, side.Made
		out = append(out, r)
	}
	return out, nil
}

// atEach runs run at each version, in order, and collects the results;
// what names the repro in errors.
func atEach[R any](versions []int64, what string, run func(v int64) (R, error)) ([]R, error) {
	var out []R
	for _, v := range versions {
		r, err := run(v)
		if err != nil {
			return nil, fmt.Errorf("%s at %d: %w", what, v, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// minimalExpectsFix reports whether the minimal repro expects a side to
// hand out a full lease: the pack's, and upstream's candidate with the
// amendment offered upstream. Upstream's latest and its candidate fix as it
// stands compute the lease from the caller's timestamp (the candidate adds
// only the time spent inside the call), so a stale one is their bug.
func minimalExpectsFix(side string) bool { return side == SidePack || side == SideAmended }

// MinimalResults are the minimal repro's results, one per side.
type MinimalResults []MinimalResult

// OK is the minimal repro's verdict: upstream's side and the pack's both
// ran, and every side shows what it should: the bug where the lease comes
// from the caller's timestamp (upstream, its candidate), the fix where it
// does not.
func (results MinimalResults) OK() bool {
	var up, pack bool
	for _, r := range results {
		up = up || r.Side == SideUpstream
		pack = pack || r.Side == SidePack
		if minimalExpectsFix(r.Side) != r.Fixed() || !minimalExpectsFix(r.Side) && !r.Bug() {
			return false
		}
	}
	return up && pack
}

// minimalRows are the minimal repro's side-by-side rows: a header, then
// label and one cell per side.
func minimalRows(results []MinimalResult) [][]string {
	header := []string{""}
	for _, r := range results {
		header = append(header, r.Side)
	}
	return append([][]string{header}, rowsOf(results, []rowDef[MinimalResult]{
		{"schema", func(r MinimalResult) string { return r.Schema }},
		{"row returned", func(r MinimalResult) string { return fmt.Sprint(r.Fetched) }},
		{"remaining lease at return (ms, db clock)", func(r MinimalResult) string { return fmt.Sprintf("%+d", r.RemainingMs) }},
		{"ack with the returned token", func(r MinimalResult) string { return r.ack(r.AckError) }},
	})...)
}

// minimalVerdictLine says, side by side, what each side showed.
func minimalVerdictLine(results []MinimalResult) string {
	var parts []string
	for _, r := range results {
		got := choose(r.Bug(), "shows the bug", "does NOT show the bug")
		if minimalExpectsFix(r.Side) {
			got = choose(r.Fixed(), "is fixed", "is NOT fixed")
		}
		parts = append(parts, r.Side+" "+got)
	}
	return strings.Join(parts, "; ")
}

// PrintMinimal writes the minimal repro's results side by side, with its
// settings, what made each side, and its verdict.
func PrintMinimal(w io.Writer, results MinimalResults) error {
	if len(results) == 0 {
		return nil
	}
	fmt.Fprintf(w, "minimal repro: fetch with p_now_ms %d ms stale, lock timeout %d ms, runtime version filter\n\n",
		results[0].StaleMs, results[0].LockTimeoutMs)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	for _, row := range minimalRows(results) {
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, r := range results {
		fmt.Fprintf(w, "  %s: %s\n", r.Side, r.Made)
	}
	_, err := fmt.Fprintf(w, "\nverdict: %s\n", minimalVerdictLine(results))
	return err
}

// minimalMarkdown renders the minimal repro's results as a Markdown section.
func minimalMarkdown(results []MinimalResult) string {
	if len(results) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## Minimal scenario: a stale p_now_ms\n\n")
	fmt.Fprintf(&b, "One visible message; fetch with p_now_ms %d ms behind the database clock and a %d ms lock timeout; "+
		"remaining lease read against the database clock right after the call; then an ack with the returned token.\n\n",
		results[0].StaleMs, results[0].LockTimeoutMs)
	rows := minimalRows(results)
	writeMarkdownTable(&b, rows[0], rows[1:])
	b.WriteString("\n")
	for _, r := range results {
		fmt.Fprintf(&b, "- %s: %s\n", r.Side, r.Made)
	}
	fmt.Fprintf(&b, "\nVerdict: %s.\n", minimalVerdictLine(results))
	return b.String()
}
