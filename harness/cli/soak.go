package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"text/tabwriter"
	"time"

	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/harness/sim/faults"
	"github.com/duroxide-pg/migrations/harness/sim/invariant"
	"github.com/duroxide-pg/migrations/harness/testenv/pgtest"
	migrations "github.com/duroxide-pg/migrations/sql"
)

// soakSummary is what soak prints and --json writes.
type soakSummary struct {
	Version       int64            `json:"version"`
	Backend       string           `json:"backend"`
	ElapsedS      float64          `json:"elapsed_s"`
	Rounds        int              `json:"rounds"`
	FetchCalls    int              `json:"fetch_calls"`
	Fetches       int              `json:"fetches"`
	CommittedAcks int              `json:"committed_acks"`
	InvalidAcks   int              `json:"invalid_lock_acks"`
	DeadLeases    int              `json:"dead_leases"`
	MaxAttempt    int              `json:"max_attempt_count"`
	Faults        faults.Counts    `json:"faults"`
	Checks        int              `json:"invariants_checked"`
	Messages      int              `json:"messages_checked"`
	Violations    int              `json:"violations"`
	ByInvariant   map[string]int   `json:"violations_by_invariant"`
	First         []string         `json:"first_violations,omitempty"`
	RoundConfigs  []faults.Config  `json:"round_configs"`
	RoundResults  []soakRoundBrief `json:"round_results"`
	RestartsNote  string           `json:"restarts_note,omitempty"`
}

type soakRoundBrief struct {
	Fetches    int `json:"fetches"`
	Faults     int `json:"faults"`
	Violations int `json:"violations"`
}

func runSoak(ctx context.Context, env *Env, args []string) error {
	fs := newFlags(env, "soak")
	duration := fs.Duration("duration", 5*time.Minute, "how long to soak")
	round := fs.Duration("round", 20*time.Second, "length of one round (each round draws new parameters and reseeds)")
	dsn := fs.String("dsn", "", "use this existing server (a database is created and dropped) instead of a throwaway one")
	version := fs.Int64("version", 0, "schema version to soak (default: the pack's latest)")
	seed := fs.Uint64("seed", 0, "seed of the rounds' parameters (0: from the clock)")
	noRestart := fs.Bool("no-restart", false, "never restart the server (restarts need the local backend anyway)")
	jsonOut := fs.String("json", "", "also write the summary as JSON to this file")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	latest := migrations.Latest()
	switch {
	case len(pos) > 0:
		return usagef("soak takes no arguments, got %q (run `harness soak -h`)", pos[0])
	case *duration <= 0:
		return usagef("--duration must be positive, e.g. --duration 5m")
	case *round < time.Second:
		return usagef("--round must be at least 1s, e.g. --round 20s")
	case *version < 0 || *version > latest:
		return usagef("--version %d: the pack has 1..%d", *version, latest)
	case *version != 0 && *version < 19:
		return usagef("--version %d: the simulated dispatchers call version 19's functions; use 19..%d", *version, latest)
	}
	if *version == 0 {
		*version = latest
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}

	srv, err := obtainServer(ctx, *dsn)
	if err != nil {
		return err
	}
	defer srv.Close(context.Background())
	name, err := srv.CreateDatabase(ctx, "harness_soak_", "")
	if err != nil {
		return err
	}
	dbDSN := srv.DSN(name)
	const schema = "duroxide_soak"
	if err := migrate.To(ctx, dbDSN, schema, *version); err != nil {
		return err
	}

	sum := soakSummary{Version: *version, Backend: string(srv.Backend()), ByInvariant: map[string]int{}}
	canRestart := srv.Backend() == pgtest.Local && !*noRestart
	if !canRestart {
		sum.RestartsNote = "no server restarts: "
		if *noRestart {
			sum.RestartsNote += "--no-restart"
		} else {
			sum.RestartsNote += "only the local backend's server can be restarted"
		}
	}
	fmt.Fprintf(env.Stderr, "harness: soak of version %d for %v (%s backend, rounds of %v, seed %d)\n", *version, *duration, srv.Backend(), *round, *seed)
	rng := rand.New(rand.NewPCG(*seed, 1))
	start := time.Now()
	for time.Since(start) < *duration && ctx.Err() == nil {
		d := min(*round, *duration-time.Since(start))
		if d < time.Second {
			break
		}
		sc := faults.Mixed(rng, d, canRestart && sum.Rounds%3 == 2)
		sc.Config.Schema = schema
		if sc.NeedsRestart {
			sc.Config.Restart = srv.Restart
		}
		res, err := faults.Run(ctx, dbDSN, sc.Config, sc.Checks)
		if err != nil {
			return fmt.Errorf("soak round %d: %w", sum.Rounds+1, err)
		}
		sum.Rounds++
		sum.FetchCalls += res.Summary.FetchCalls
		sum.Fetches += res.Report.Leases
		sum.CommittedAcks += res.Report.CommittedAcks
		sum.InvalidAcks += res.Summary.InvalidLockAcks
		sum.DeadLeases += res.Report.DeadLeases
		sum.MaxAttempt = max(sum.MaxAttempt, res.Report.MaxAttemptCount)
		sum.Faults.KillsInjected += res.Faults.KillsInjected
		sum.Faults.KillsMidFetch += res.Faults.KillsMidFetch
		sum.Faults.KillsMidAck += res.Faults.KillsMidAck
		sum.Faults.Crashes += res.Faults.Crashes
		sum.Faults.Timeouts += res.Faults.Timeouts
		sum.Faults.Restarts += res.Faults.Restarts
		sum.Faults.ConnLost += res.Faults.ConnLost
		sum.Faults.Reconnects += res.Faults.Reconnects
		sum.Checks += res.Report.Checks
		sum.Messages += res.Report.Messages
		sum.Violations += len(res.Report.Violations)
		for _, v := range res.Report.Violations {
			sum.ByInvariant[v.Invariant]++
			if len(sum.First) < 10 {
				sum.First = append(sum.First, fmt.Sprintf("round %d: %s", sum.Rounds, v))
			}
		}
		sum.RoundConfigs = append(sum.RoundConfigs, res.Config)
		sum.RoundResults = append(sum.RoundResults, soakRoundBrief{res.Report.Leases, int(res.Faults.Total()), len(res.Report.Violations)})
		fmt.Fprintf(env.Stderr, "round %d (%d dispatchers, %d instances, T %v, skew %v..%v): %s\n", sum.Rounds,
			res.Config.Dispatchers, res.Config.Instances, res.Config.LockTimeout, res.Config.SkewFor(0), res.Config.SkewFor(res.Config.Dispatchers-1), res.Line())
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sum.ElapsedS = time.Since(start).Seconds()

	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\t\n", k, v) }
	fmt.Fprintf(env.Stdout, "soak: version %d, %d rounds in %.0f s (%s backend)\n\n", sum.Version, sum.Rounds, sum.ElapsedS, sum.Backend)
	row("fetch calls", sum.FetchCalls)
	row("fetches returning a lease", sum.Fetches)
	row("committed acks", sum.CommittedAcks)
	row("invalid-lock acks", sum.InvalidAcks)
	row("dead leases (caller's clock)", sum.DeadLeases)
	row("max attempt_count", sum.MaxAttempt)
	row("faults injected", sum.Faults.Total())
	row("  backends killed (mid-fetch / mid-ack)", fmt.Sprintf("%d (%d / %d)", sum.Faults.KillsInjected, sum.Faults.KillsMidFetch, sum.Faults.KillsMidAck))
	row("  dispatcher crashes after fetch", sum.Faults.Crashes)
	row("  statement/lock timeouts", sum.Faults.Timeouts)
	row("  server restarts", sum.Faults.Restarts)
	row("connections lost / reconnects", fmt.Sprintf("%d / %d", sum.Faults.ConnLost, sum.Faults.Reconnects))
	row("invariants checked", sum.Checks)
	row("messages checked", sum.Messages)
	row("violations", sum.Violations)
	for _, inv := range []string{invariant.Exclusion, invariant.Conservation, invariant.Progress, invariant.DeadLease} {
		row("  "+inv, sum.ByInvariant[inv])
	}
	tw.Flush()
	if sum.RestartsNote != "" {
		fmt.Fprintf(env.Stdout, "\nnote: %s\n", sum.RestartsNote)
	}
	for _, v := range sum.First {
		fmt.Fprintf(env.Stdout, "violation: %s\n", v)
	}
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(sum, "", "  ")
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if sum.Violations > 0 {
		return failure{fmt.Sprintf("soak: %d invariant violation(s) at version %d", sum.Violations, sum.Version)}
	}
	if sum.Fetches == 0 {
		return failure{"soak: no fetch returned a lease; nothing was checked"}
	}
	fmt.Fprintln(env.Stdout, "\nverdict: every invariant held")
	return nil
}
