package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/sim/faults"
	"github.com/duroxide-pg/migrations/internal/sim/invariant"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
)

// soakSummary is what soak prints and --json writes: faults.Soak's sum
// and where it ran.
type soakSummary struct {
	Version int64  `json:"version"`
	Backend string `json:"backend"`
	faults.SoakSummary
	RestartsNote string `json:"restarts_note,omitempty"`
}

func runSoak(ctx context.Context, env *cli.Env, args []string) error {
	fs := cli.NewFlags(env, "soak")
	duration := fs.Duration("duration", 5*time.Minute, "how long to soak")
	round := fs.Duration("round", 20*time.Second, "length of one round (each round draws new parameters and reseeds)")
	dsn := fs.String("dsn", "", "use this existing server (a database is created and dropped) instead of a throwaway one")
	version := fs.Int64("version", 0, "schema version to soak (default: the pack's latest)")
	seed := fs.Uint64("seed", 0, "seed of the rounds' parameters (0: from the clock)")
	noRestart := fs.Bool("no-restart", false, "never restart the server (restarts need the local backend anyway)")
	jsonOut := fs.String("json", "", "also write the summary as JSON to this file")
	realRuntime := fs.Bool("runtime", false, "soak the real duroxide runtime instead of the simulator: backends terminated, server and PgBouncer restarts, mixed, on upstream's schema and the pack's latest (docs/RELIABILITY.md)")
	each := fs.Bool("each", false, "with --runtime: run every scenario once (the clock cells too) instead of mixed rounds for --duration")
	orchestrations := fs.Int("orchestrations", 300, "with --runtime: orchestrations per side and round")
	doc := fs.String("doc", "", "with --runtime: write the table into this document's marked section (docs/RELIABILITY.md)")
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if *realRuntime {
		switch {
		case len(pos) > 0:
			return cli.Usagef("soak takes no arguments, got %q (run `harness-lab soak -h`)", pos[0])
		case *duration <= 0:
			return cli.Usagef("--duration must be positive, e.g. --duration 5m")
		case *orchestrations < 1 || *orchestrations > 10000:
			return cli.Usagef("--orchestrations %d: use 1..10000", *orchestrations)
		case *version != 0:
			return cli.Usagef("--version: soak --runtime runs the pack's latest against upstream's schema")
		}
		if *seed == 0 {
			*seed = uint64(time.Now().UnixNano())
		}
		return runRuntimeSoak(ctx, env, runtimeSoak{dsn: *dsn, duration: *duration, orchestrations: *orchestrations,
			each: *each, doc: *doc, seed: *seed})
	}
	if *each || *doc != "" {
		return cli.Usagef("--each and --doc go with --runtime")
	}
	latest := migrations.Latest()
	oldest, err := faults.OldestVersion()
	if err != nil {
		return cli.Usagef("soak: %v", err)
	}
	switch {
	case len(pos) > 0:
		return cli.Usagef("soak takes no arguments, got %q (run `harness-lab soak -h`)", pos[0])
	case *duration <= 0:
		return cli.Usagef("--duration must be positive, e.g. --duration 5m")
	case *round < time.Second:
		return cli.Usagef("--round must be at least 1s, e.g. --round 20s")
	case *version < 0 || *version > latest:
		return cli.Usagef("--version %d: the pack has 1..%d", *version, latest)
	case *version != 0 && *version < oldest:
		return cli.Usagef("--version %d: the simulated dispatchers run on version %d's functions and later; use %d..%d", *version, oldest, oldest, latest)
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
	const schema = "duroxide_soak"
	db, err := migratedDatabase(ctx, srv, "harness_soak_", schema, *version)
	if err != nil {
		return err
	}

	opts := faults.SoakOptions{Schema: schema, Duration: *duration, Round: *round, Seed: *seed,
		OnRound: func(n int, res *faults.Result) {
			c := res.Config
			fmt.Fprintf(env.Stderr, "round %d (%d dispatchers, %d instances, T %v, skew %v..%v): %s\n", n,
				c.Dispatchers, c.Instances, c.LockTimeout, c.SkewFor(0, c.Dispatchers), c.SkewFor(c.Dispatchers-1, c.Dispatchers), res.Line())
		}}
	sum := soakSummary{Version: *version, Backend: string(srv.Backend())}
	switch {
	case *noRestart:
		sum.RestartsNote = "no server restarts: --no-restart"
	case srv.Backend() != pgtest.Local:
		sum.RestartsNote = "no server restarts: only the local backend's server can be restarted"
	default:
		opts.Restart = srv.Restart
	}
	fmt.Fprintf(env.Stderr, "harness-lab: soak of version %d for %v (%s backend, rounds of %v, seed %d)\n", *version, *duration, srv.Backend(), *round, *seed)
	soaked, err := faults.Soak(ctx, db, opts)
	if err != nil {
		return err
	}
	sum.SoakSummary = *soaked

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
		return cli.Failure{Msg: fmt.Sprintf("soak: %d invariant violation(s) at version %d", sum.Violations, sum.Version)}
	}
	if sum.Fetches == 0 {
		return cli.Failure{Msg: "soak: no fetch returned a lease; nothing was checked"}
	}
	fmt.Fprintln(env.Stdout, "\nverdict: every invariant held")
	return nil
}
