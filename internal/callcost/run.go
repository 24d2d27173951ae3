package callcost

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/duroxide-pg/migrations/internal/reportfile"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/stats"
)

// The variants of the latest, by what they take away.
const (
	noSetSearchPath = "no SET search_path"
	noHeadUpkeep    = "no head upkeep"
)

// Sides are upstream's side and the pack's latest; Run adds the latest's
// variants.
type Sides struct {
	Upstream, Latest Side
}

func (s Sides) all() []Side {
	noSet := s.Latest
	noSet.Name, noSet.Alter, noSet.SearchPath = s.Latest.Name+", "+noSetSearchPath, WithoutSetSearchPath, true
	noUpkeep := s.Latest
	noUpkeep.Name, noUpkeep.Alter = s.Latest.Name+", "+noHeadUpkeep, WithoutHeadUpkeep
	return []Side{s.Upstream, s.Latest, noSet, noUpkeep}
}

// Result is one cell on one side, over the rounds.
type Result struct {
	Cell     string   `json:"cell"`
	Function string   `json:"function"`
	Side     string   `json:"side"`
	Samples  []Sample `json:"rounds"`
	// Us and FirstMs are the rounds' medians; Spread is half the range of
	// Us over the rounds, against Us.
	Us      float64 `json:"us"`
	Spread  float64 `json:"spread"`
	FirstMs float64 `json:"first_ms"`
	// Parts are each function's own time per call, medians over rounds,
	// costliest first.
	Parts []Part `json:"parts"`
}

// Run runs every cell on every side, rounds times, the sides' order
// turning by one each round: a new schema per cell, side and round, made,
// seeded, measured over calls calls on a new session, dropped. progress,
// when not nil, gets a line per round.
func Run(ctx context.Context, src *dbconn.Source, sides Sides, cells []Cell, calls, rounds int, progress func(string)) ([]Result, error) {
	if calls < 1 || rounds < 1 {
		return nil, fmt.Errorf("callcost: calls %d and rounds %d: at least 1 each", calls, rounds)
	}
	admin, err := src.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("callcost: %w", err)
	}
	defer admin.Close(context.Background())
	all := sides.all()
	out := make([]Result, 0, len(cells)*len(all))
	for _, cell := range cells {
		for _, side := range all {
			out = append(out, Result{Cell: cell.Name, Function: cell.Function, Side: side.Name})
		}
	}
	for r := 0; r < rounds; r++ {
		if progress != nil {
			progress(fmt.Sprintf("round %d of %d", r+1, rounds))
		}
		for i, cell := range cells {
			for k := range all {
				j := (k + r) % len(all)
				schema := fmt.Sprintf("calls_%d_%d_%d", r+1, i+1, j+1)
				s, err := runOne(ctx, admin, src, all[j], cell, schema, calls)
				if err != nil {
					return nil, err
				}
				res := &out[i*len(all)+j]
				res.Samples = append(res.Samples, s)
			}
		}
	}
	for i := range out {
		summarize(&out[i])
	}
	return out, nil
}

func runOne(ctx context.Context, admin *pgx.Conn, src *dbconn.Source, side Side, cell Cell, schema string, calls int) (Sample, error) {
	defer func() {
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	}()
	if err := side.Make(ctx, src, schema); err != nil {
		return Sample{}, fmt.Errorf("callcost: make %s: %w", side.Name, err)
	}
	if side.Alter != nil {
		if err := side.Alter(ctx, admin, schema); err != nil {
			return Sample{}, err
		}
	}
	if cell.seed != "" {
		// The schema first on the search_path: a variant's triggers have no
		// SET clause of their own.
		quoted := pgx.Identifier{schema}.Sanitize()
		seed := "BEGIN; SET LOCAL search_path = " + quoted + "; " + fmt.Sprintf(cell.seed, quoted, Warm+calls) + "; COMMIT"
		if _, err := admin.Exec(ctx, seed); err != nil {
			return Sample{}, fmt.Errorf("callcost: seed %s: %w", cell.Name, err)
		}
	}
	if _, err := admin.Exec(ctx, "ANALYZE"); err != nil {
		return Sample{}, fmt.Errorf("callcost: analyze: %w", err)
	}
	return measure(ctx, src, side, cell, schema, calls)
}

func summarize(r *Result) {
	us, first := make([]float64, len(r.Samples)), make([]float64, len(r.Samples))
	parts := map[string][]float64{}
	for i, s := range r.Samples {
		us[i], first[i] = s.Us, s.FirstMs
		for _, p := range s.Parts {
			parts[p.Function] = append(parts[p.Function], p.SelfUs)
		}
	}
	r.Us, r.FirstMs = stats.Median(us), stats.Median(first)
	if r.Us > 0 {
		r.Spread = (slices.Max(us) - slices.Min(us)) / 2 / r.Us
	}
	r.Parts = r.Parts[:0]
	for f, v := range parts {
		for len(v) < len(r.Samples) {
			v = append(v, 0) // a round where the function took no time
		}
		r.Parts = append(r.Parts, Part{Function: f, SelfUs: stats.Median(v)})
	}
	sort.Slice(r.Parts, func(a, b int) bool {
		if r.Parts[a].SelfUs != r.Parts[b].SelfUs {
			return r.Parts[a].SelfUs > r.Parts[b].SelfUs
		}
		return r.Parts[a].Function < r.Parts[b].Function
	})
}

// Table is the results as a markdown table, with each side's time against
// upstream's.
func Table(results []Result) string {
	var b strings.Builder
	b.WriteString("| call | side | µs a call (server, median) | spread | against upstream | first call on a new session (ms, client) | own µs a call, by function |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	base := map[string]float64{}
	for _, r := range results {
		if _, ok := base[r.Cell]; !ok {
			base[r.Cell] = r.Us // the first side of each cell is upstream's
		}
	}
	for _, r := range results {
		ratio := "n/a"
		if base[r.Cell] > 0 {
			ratio = fmt.Sprintf("%.2fx", r.Us/base[r.Cell])
		}
		parts := make([]string, len(r.Parts))
		for i, p := range r.Parts {
			parts[i] = fmt.Sprintf("%s %.1f", p.Function, p.SelfUs)
		}
		fmt.Fprintf(&b, "| %s | %s | %.1f | ±%.0f%% | %s | %.2f | %s |\n",
			r.Cell, r.Side, r.Us, 100*r.Spread, ratio, r.FirstMs, strings.Join(parts, ", "))
	}
	return b.String()
}

// Accounting is, per call, what the latest adds to upstream's time and
// how much of it each variant takes away (µs, server).
func Accounting(results []Result, latest string) string {
	var b strings.Builder
	b.WriteString("| call | upstream | latest | latest - upstream | of which the SET search_path clauses | of which the head upkeep | first call, latest - upstream (ms) |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	by := map[[2]string]Result{}
	var cells []string
	for _, r := range results {
		if _, ok := by[[2]string{r.Cell, ""}]; !ok {
			by[[2]string{r.Cell, ""}] = r // upstream's, the first side
			cells = append(cells, r.Cell)
		}
		by[[2]string{r.Cell, r.Side}] = r
	}
	for _, c := range cells {
		up, l := by[[2]string{c, ""}], by[[2]string{c, latest}]
		noSet, noUpkeep := by[[2]string{c, latest + ", " + noSetSearchPath}], by[[2]string{c, latest + ", " + noHeadUpkeep}]
		fmt.Fprintf(&b, "| %s | %.1f | %.1f | %+.1f | %+.1f | %+.1f | %+.2f |\n",
			c, up.Us, l.Us, l.Us-up.Us, l.Us-noSet.Us, l.Us-noUpkeep.Us, l.FirstMs-up.FirstMs)
	}
	return b.String()
}

// ReportFile and JSONFile are the files WriteReport writes.
const (
	ReportFile = "calls.md"
	JSONFile   = "calls.json"
)

// WriteReport writes the results into dir as markdown and JSON; server
// names the server, latest the latest's side.
func WriteReport(dir, server, latest string, calls, rounds int, results []Result) error {
	var b strings.Builder
	b.WriteString("# Where a call's server time goes, uncontended\n\n")
	fmt.Fprintf(&b, "%s; `harness-lab bench --scenarios calls`. Each cell: a new schema in the side's state, a new session, %d calls to warm it (the first timed by the client: it compiles the functions and loads their catalog entries), then %d calls, each its own transaction, measured by the server (pg_stat_user_functions, track_functions = 'all'): the called function's time, and each function's own time, triggers and helpers included. %d rounds, the sides' order turning each round; medians, and the spread (half the range over rounds, against the median). The variants of the latest each take one thing away: every function's SET search_path clause (their sessions set search_path to the schema instead, which costs what bodies naming the schema cost), or the queue heads' triggers (not a state to run: it shows what the upkeep costs).\n\n",
		server, Warm, calls, rounds)
	b.WriteString("## What the latest adds, and where\n\n")
	b.WriteString(Accounting(results, latest))
	b.WriteString("\n## Cells\n\n")
	b.WriteString(Table(results))
	return reportfile.Write(dir, ReportFile, b.String(), JSONFile, struct {
		Server  string   `json:"server"`
		Calls   int      `json:"calls"`
		Rounds  int      `json:"rounds"`
		Results []Result `json:"results"`
	}{server, calls, rounds, results})
}
