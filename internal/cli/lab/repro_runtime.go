package lab

import (
	"context"
	"flag"
	"slices"
	"strings"

	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/sim/repro"
)

// The runtime repro's forms (--form).
const (
	runtimeFormHeldKey = "held-key"
	runtimeFormPool    = "pool"
	runtimeFormAll     = "all"
)

func runtimeForms() []string { return []string{runtimeFormHeldKey, runtimeFormPool, runtimeFormAll} }

// runtimeRepro is the real runtime on every side, in --form's forms:
// repro.RuntimeRepro (another session holds the instance's advisory key)
// and repro.RuntimePoolRepro (the runtime's pooled connections wait).
type runtimeRepro struct {
	fromUpstream
	form string
	held repro.RuntimeConfig
	pool repro.RuntimePoolConfig
}

func (*runtimeRepro) name() string { return "runtime" }
func (*runtimeRepro) summary() string {
	return "the real runtime on every side: a held advisory key, pooled connections that wait"
}

func (r *runtimeRepro) register(fs *flag.FlagSet) {
	r.held, r.pool = repro.RuntimeDefaults(), repro.RuntimePoolDefaults()
	r.held.Register(fs)
	fs.StringVar(&r.form, "form", runtimeFormAll, "runtime: the form to run: held-key (another session holds the instance's advisory key), pool (another session makes the runtime's pooled connections wait; no advisory lock), or all")
	r.pool.Register(fs)
}

func (r *runtimeRepro) validate(bool) error {
	if !slices.Contains(runtimeForms(), r.form) {
		return cli.Usagef("--form %q: use %s", r.form, strings.Join(runtimeForms(), ", "))
	}
	if err := r.held.Validate(); err != nil {
		return usageOf(err)
	}
	return usageOf(r.pool.Validate())
}

// run runs each form --form names, held-key first, each its own section
// of the output and its own verdict ("runtime", "runtime_pool").
func (r *runtimeRepro) run(ctx context.Context, in *scenarioRun) (outcome, error) {
	var out outcome
	if r.form == runtimeFormHeldKey || r.form == runtimeFormAll {
		res, err := repro.RuntimeRepro(ctx, in.db, in.provider, r.held, in.sides, in.progress)
		p, err := reproPart("runtime", res, err, repro.PrintRuntime, func(r *repro.Report, res repro.RuntimeResult) { r.Runtime = &res })
		if err != nil {
			return out, err
		}
		out.parts = append(out.parts, p)
	}
	if r.form == runtimeFormPool || r.form == runtimeFormAll {
		res, err := repro.RuntimePoolRepro(ctx, in.db, in.provider, r.pool, in.sides, in.progress)
		p, err := reproPart("runtime_pool", res, err, repro.PrintRuntimePool, func(r *repro.Report, res repro.RuntimePoolResult) { r.RuntimePool = &res })
		if err != nil {
			return out, err
		}
		out.parts = append(out.parts, p)
	}
	return out, nil
}
