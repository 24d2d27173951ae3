package lab

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/repro"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
)

// organicRepro is repro.OrganicRepro: simulated dispatchers on hot
// instances, no stale timestamp injected, optionally through PgBouncer.
type organicRepro struct {
	fromUpstream
	cfg     repro.OrganicConfig
	bouncer string
}

func (*organicRepro) name() string { return "organic" }
func (*organicRepro) summary() string {
	return "simulated dispatchers on hot instances, no stale timestamp injected"
}

func (o *organicRepro) register(fs *flag.FlagSet) {
	o.cfg = repro.OrganicDefaults()
	o.cfg.Register(fs)
	fs.StringVar(&o.bouncer, "pgbouncer", "", "organic: the dispatchers connect through a PgBouncer started next to the server, in this pool mode (transaction, session or statement)")
}

func (o *organicRepro) validate(bool) error {
	if err := o.cfg.CheckSettings(); err != nil {
		return usageOf(err)
	}
	if o.bouncer != "" && !slices.Contains(pgtest.PoolModes(), o.bouncer) {
		return cli.Usagef("--pgbouncer %q: use a pool mode, one of %s", o.bouncer, strings.Join(pgtest.PoolModes(), ", "))
	}
	return nil
}

// run runs the organic repro in the repro database, its dispatchers
// connecting through a PgBouncer in --pgbouncer's mode when one is given.
func (o *organicRepro) run(ctx context.Context, in *scenarioRun) (outcome, error) {
	cfg := o.cfg
	if o.bouncer != "" {
		b, err := pgtest.StartPgBouncer(ctx, in.srv, o.bouncer)
		if err != nil {
			return outcome{}, fmt.Errorf("organic repro: %w", err)
		}
		defer b.Close()
		via, err := dbconn.Parse(b.DSN(in.dbName))
		if err != nil {
			return outcome{}, fmt.Errorf("organic repro: %w", err)
		}
		cfg.Via = via
		fmt.Fprintf(in.env.Stderr, "%s: the dispatchers connect through pgbouncer (%s pooling)\n", in.env.Program, o.bouncer)
	}
	res, err := repro.OrganicRepro(ctx, in.db, in.provider, cfg, in.sides, in.progress)
	return onePart(reproPart("organic", res, err, repro.PrintOrganic,
		func(r *repro.Report, res repro.OrganicResult) { r.Organic = &res }))
}
