// Package repro reproduces the lease defect of fetch_orchestration_item at
// schema version 19 and shows its absence at 20: the minimal, deterministic
// repro (a stale caller timestamp) and the organic one (many dispatchers).
package repro

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/duroxide-pg/migrations/harness/sim/orch"
	"github.com/duroxide-pg/migrations/harness/testenv/pgtest"
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

// MinimalResult is what one schema did with a stale caller timestamp.
type MinimalResult struct {
	Schema        string `json:"schema"`
	Version       int64  `json:"version"`
	Instance      string `json:"instance"`
	StaleMs       int64  `json:"stale_ms"`
	LockTimeoutMs int64  `json:"lock_timeout_ms"`
	// Fetched is false when fetch returned no row (which is itself a
	// failure of the repro).
	Fetched bool `json:"fetched"`
	// RemainingMs is locked_until minus the database clock, read right
	// after fetch returned.
	RemainingMs int64  `json:"remaining_ms"`
	AckOK       bool   `json:"ack_ok"`
	AckError    string `json:"ack_error,omitempty"`
}

// Bug reports the version-19 symptom: a lease already expired when
// returned, and an ack refused with Invalid lock token.
func (r MinimalResult) Bug() bool {
	return r.Fetched && r.RemainingMs <= 0 && !r.AckOK
}

// Fixed reports the version-20 behaviour: a full lease (at least the
// timeout minus 100 ms by the database clock) and a successful ack.
func (r MinimalResult) Fixed() bool {
	return r.Fetched && r.RemainingMs >= r.LockTimeoutMs-100 && r.AckOK
}

// Minimal enqueues one visible message for a fresh instance in schema,
// fetches it with p_now_ms StaleMs behind the database clock, reads the
// lease against the database clock, and acks with the token and a fresh
// timestamp, as the runtime would after its turn.
func Minimal(ctx context.Context, q orch.Querier, schema string, version int64, cfg MinimalConfig) (MinimalResult, error) {
	cfg.defaults()
	c := orch.New(schema)
	res := MinimalResult{Schema: schema, Version: version, Instance: pgtest.UniqueName("repro-minimal-"),
		StaleMs: cfg.StaleMs, LockTimeoutMs: cfg.LockTimeoutMs}
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

// MinimalMarkdown renders the minimal repro's results as a Markdown section.
func MinimalMarkdown(results []MinimalResult) string {
	if len(results) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## Minimal scenario: a stale p_now_ms\n\n")
	fmt.Fprintf(&b, "One visible message; fetch with p_now_ms %d ms behind the database clock and a %d ms lock timeout; "+
		"remaining lease read against the database clock right after the call; then an ack with the returned token.\n\n",
		results[0].StaleMs, results[0].LockTimeoutMs)
	b.WriteString("|")
	for _, r := range results {
		fmt.Fprintf(&b, " | version %d", r.Version)
	}
	b.WriteString(" |\n|---")
	for range results {
		b.WriteString("|---")
	}
	b.WriteString("|\n| remaining lease at return (ms)")
	for _, r := range results {
		fmt.Fprintf(&b, " | %+d", r.RemainingMs)
	}
	b.WriteString(" |\n| ack with the returned token")
	for _, r := range results {
		ack := "ok"
		if !r.AckOK {
			ack = r.AckError
		}
		fmt.Fprintf(&b, " | %s", ack)
	}
	b.WriteString(" |\n")
	return b.String()
}
