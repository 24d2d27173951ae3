package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/duroxide-pg/migrations/internal/packfacts"

	"github.com/duroxide-pg/migrations/internal/dbconn"
)

// OldestVersion is the oldest pack version the simulated dispatchers are
// run on: the version before the pack's fix of fetch_orchestration_item,
// the one the repros and the fault scenarios report (older versions'
// functions are not simulated).
func OldestVersion() (int64, error) {
	bug, _, err := packfacts.FetchFix()
	return bug, err
}

// SoakOptions describe a soak: rounds of mixed faults on one schema.
type SoakOptions struct {
	// Schema holds the duroxide-pg objects; every round EMPTIES and
	// reseeds it.
	Schema string
	// Duration is the whole soak, Round one round (each draws new
	// parameters from Seed's sequence and reseeds); a last round shorter
	// than 1 s is not run.
	Duration, Round time.Duration
	// Seed seeds the rounds' parameters.
	Seed uint64
	// Restart restarts the server; when set, every third round also
	// restarts it once.
	Restart func(ctx context.Context) error
	// OnRound, when set, is told of each round as it ends (n from 1).
	OnRound func(n int, res *Result)
}

// SoakSummary adds up a soak's rounds. Field names are stable (JSON).
type SoakSummary struct {
	ElapsedS      float64          `json:"elapsed_s"`
	Rounds        int              `json:"rounds"`
	FetchCalls    int              `json:"fetch_calls"`
	Fetches       int              `json:"fetches"`
	CommittedAcks int              `json:"committed_acks"`
	InvalidAcks   int              `json:"invalid_lock_acks"`
	DeadLeases    int              `json:"dead_leases"`
	MaxAttempt    int              `json:"max_attempt_count"`
	Faults        Counts           `json:"faults"`
	Checks        int              `json:"invariants_checked"`
	Messages      int              `json:"messages_checked"`
	Violations    int              `json:"violations"`
	ByInvariant   map[string]int   `json:"violations_by_invariant"`
	First         []string         `json:"first_violations,omitempty"`
	RoundConfigs  []Config         `json:"round_configs"`
	RoundResults  []SoakRoundBrief `json:"round_results"`
}

// SoakRoundBrief is one round in a few numbers.
type SoakRoundBrief struct {
	Fetches    int `json:"fetches"`
	Faults     int `json:"faults"`
	Violations int `json:"violations"`
}

// add counts one round in.
func (s *SoakSummary) add(res *Result) {
	s.Rounds++
	s.FetchCalls += res.Summary.FetchCalls
	s.Fetches += res.Report.Leases
	s.CommittedAcks += res.Report.CommittedAcks
	s.InvalidAcks += res.Summary.InvalidLockAcks
	s.DeadLeases += res.Report.DeadLeases
	s.MaxAttempt = max(s.MaxAttempt, res.Report.MaxAttemptCount)
	s.Faults.Add(res.Faults)
	s.Checks += res.Report.Checks
	s.Messages += res.Report.Messages
	s.Violations += len(res.Report.Violations)
	for _, v := range res.Report.Violations {
		s.ByInvariant[v.Invariant]++
		if len(s.First) < 10 {
			s.First = append(s.First, fmt.Sprintf("round %d: %s", s.Rounds, v))
		}
	}
	s.RoundConfigs = append(s.RoundConfigs, res.Config)
	s.RoundResults = append(s.RoundResults, SoakRoundBrief{res.Report.Leases, int(res.Faults.Total()), len(res.Report.Violations)})
}

// Soak runs rounds of mixed faults against the schema at src for
// opts.Duration and adds them up. The error is for a round that could not
// be made (or ctx ending); violations are in the summary.
func Soak(ctx context.Context, src *dbconn.Source, opts SoakOptions) (*SoakSummary, error) {
	sum := &SoakSummary{ByInvariant: map[string]int{}}
	rng := rand.New(rand.NewPCG(opts.Seed, 1))
	start := time.Now()
	for time.Since(start) < opts.Duration && ctx.Err() == nil {
		d := min(opts.Round, opts.Duration-time.Since(start))
		if d < time.Second {
			break
		}
		sc := mixed(rng, d, opts.Restart != nil && sum.Rounds%3 == 2)
		sc.Config.Schema = opts.Schema
		if sc.NeedsRestart {
			sc.Config.Restart = opts.Restart
		}
		res, err := Run(ctx, src, sc.Config, sc.Checks)
		if err != nil {
			return sum, fmt.Errorf("soak round %d: %w", sum.Rounds+1, err)
		}
		sum.add(res)
		if opts.OnRound != nil {
			opts.OnRound(sum.Rounds, res)
		}
	}
	if err := ctx.Err(); err != nil {
		return sum, err
	}
	sum.ElapsedS = time.Since(start).Seconds()
	return sum, nil
}
