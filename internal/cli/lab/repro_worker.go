package lab

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/internal/cli"
	"github.com/duroxide-pg/migrations/internal/sim/repro"
)

// workerPair is --worker-versions: the versions worker-minimal compares,
// by default the pack's pair (repro.WorkerVersions), which the worker
// repro compares and does not let change.
type workerPair struct {
	flag string
	// pack is the pack's pair as the flag writes it ("" when the pack has
	// none, for the reason packErr).
	pack    string
	packErr error
	// versions is flag, parsed (nil until a repro needs it).
	versions []int64
}

// parse reads the flag once.
func (w *workerPair) parse() error {
	if w.versions != nil {
		return nil
	}
	if w.flag == "" {
		return cli.Usagef("repro: %v", w.packErr)
	}
	var out []int64
	for _, f := range strings.Split(w.flag, ",") {
		v, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || v < 1 || v > migrations.Latest() {
			return cli.Usagef("--worker-versions %q: give two schema versions between 1 and %d (the pack's latest)", w.flag, migrations.Latest())
		}
		out = append(out, v)
	}
	if len(out) != 2 {
		return cli.Usagef("--worker-versions %q: give exactly two versions, the buggy one then the fixed one", w.flag)
	}
	w.versions = out
	return nil
}

// workerMinimalRepro is repro.WorkerMinimalRepro at each of
// --worker-versions.
type workerMinimalRepro struct{ pair *workerPair }

func (*workerMinimalRepro) name() string { return "worker-minimal" }
func (*workerMinimalRepro) summary() string {
	return "a stale activity lease and a fetch that waits on its session row, at each of two versions; and upstream's batched fetch with a stale timestamp, before and after migrate up"
}
func (*workerMinimalRepro) needsUpstream() bool { return true }

func (m *workerMinimalRepro) register(fs *flag.FlagSet) {
	bug, fix, err := repro.WorkerVersions()
	m.pair.packErr = err
	if err == nil {
		m.pair.pack = fmt.Sprintf("%d,%d", bug, fix)
	}
	fs.StringVar(&m.pair.flag, "worker-versions", m.pair.pack, "worker-minimal: schema versions to compare, the buggy one then the fixed one")
}

// validate parses --worker-versions when this repro runs or the flag is
// given (a bad flag is refused whatever runs).
func (m *workerMinimalRepro) validate(chosen bool) error {
	if m.pair.flag != "" || chosen {
		return m.pair.parse()
	}
	return nil
}

// run runs the pair, then the batched fetch (repro.WorkerBatchedRepro):
// two parts, each with its verdict.
func (m *workerMinimalRepro) run(ctx context.Context, in *scenarioRun) (outcome, error) {
	res, err := repro.WorkerMinimalRepro(ctx, in.db, m.pair.versions)
	pair, err := reproPart("worker_minimal", res, err, repro.PrintWorkerMinimal,
		func(r *repro.Report, res repro.WorkerMinimalResults) { r.WorkerMinimal = res })
	if err != nil {
		return outcome{}, err
	}
	batched, err := repro.WorkerBatchedRepro(ctx, in.db, in.provider)
	batch, err := reproPart("worker_batched", batched, err, repro.PrintWorkerBatched,
		func(r *repro.Report, res repro.WorkerBatchedResults) { r.WorkerBatched = res })
	if err != nil {
		return outcome{parts: []part{pair}}, err
	}
	return outcome{parts: []part{pair, batch}}, nil
}

// workerRepro is repro.WorkerRepro: simulated activity workers on the
// pack's pair of versions.
type workerRepro struct {
	pair *workerPair
	cfg  repro.WorkerConfig
}

func (*workerRepro) name() string { return "worker" }
func (*workerRepro) summary() string {
	return "simulated activity workers on the pack's pair of worker versions"
}
func (*workerRepro) needsUpstream() bool { return false }

func (w *workerRepro) register(fs *flag.FlagSet) {
	w.cfg = repro.WorkerDefaults()
	w.cfg.Register(fs)
}

func (w *workerRepro) validate(chosen bool) error {
	if chosen {
		if err := w.pair.parse(); err != nil {
			return err
		}
	}
	if err := w.cfg.CheckSettings(); err != nil {
		return usageOf(err)
	}
	if chosen && w.pair.pack == "" {
		return cli.Usagef("repro: the worker repro compares the pack's pair: %v", w.pair.packErr)
	}
	if chosen && w.pair.flag != w.pair.pack {
		return cli.Usagef("the worker repro compares versions %s only; drop --worker-versions or use `repro worker-minimal`", strings.ReplaceAll(w.pair.pack, ",", " and "))
	}
	return nil
}

func (w *workerRepro) run(ctx context.Context, in *scenarioRun) (outcome, error) {
	res, err := repro.WorkerRepro(ctx, in.db, w.cfg, in.progress)
	return onePart(reproPart("worker", res, err, repro.PrintWorker,
		func(r *repro.Report, res repro.WorkerResult) { r.Worker = &res }))
}
