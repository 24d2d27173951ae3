package planshape

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/duroxide-pg/migrations/internal/reportfile"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/stats"
)

// Side is a schema state the cells run on.
type Side struct {
	// Name labels the side in reports ("upstream 1..21 and 23", "pack 0031").
	Name string
	// Make brings the (new) schema to the side's state.
	Make func(ctx context.Context, src *dbconn.Source, schema string) error
}

// Result is one cell on one side.
type Result struct {
	Cell  string `json:"cell"`
	Side  string `json:"side"`
	Rows  int    `json:"unneeded_rows"`
	Calls []Call `json:"calls"`
	// EarlyRows and SteadyRows: Early and Steady; EarlyUs and SteadyUs the
	// median time of a call in calls 2-5 and in calls 6 on.
	EarlyRows  int64   `json:"early_rows"`
	SteadyRows int64   `json:"steady_rows"`
	EarlyUs    float64 `json:"early_us"`
	SteadyUs   float64 `json:"steady_us"`
	Cliff      bool    `json:"cliff"`
}

// Run runs every cell on every side: a new schema per cell and side, made,
// seeded with rows unneeded rows, measured on a new session, dropped.
// progress, when not nil, gets a line per cell and side.
func Run(ctx context.Context, src *dbconn.Source, sides []Side, cells []Cell, rows int, progress func(string)) ([]Result, error) {
	if rows < 1 {
		return nil, fmt.Errorf("planshape: rows %d: at least 1", rows)
	}
	admin, err := src.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("planshape: %w", err)
	}
	defer admin.Close(context.Background())
	var out []Result
	for i, cell := range cells {
		for j, side := range sides {
			if progress != nil {
				progress(fmt.Sprintf("%s on %s", cell.Name, side.Name))
			}
			schema := fmt.Sprintf("plans_%d_%d", i+1, j+1)
			r, err := runOne(ctx, admin, src, side, cell, schema, rows)
			if err != nil {
				return nil, err
			}
			out = append(out, r)
		}
	}
	return out, nil
}

func runOne(ctx context.Context, admin *pgx.Conn, src *dbconn.Source, side Side, cell Cell, schema string, rows int) (Result, error) {
	r := Result{Cell: cell.Name, Side: side.Name, Rows: rows}
	defer func() {
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	}()
	if err := side.Make(ctx, src, schema); err != nil {
		return r, fmt.Errorf("planshape: make %s: %w", side.Name, err)
	}
	if err := cell.Seed(ctx, admin, schema, rows); err != nil {
		return r, err
	}
	conn, err := src.Connect(ctx)
	if err != nil {
		return r, fmt.Errorf("planshape: %w", err)
	}
	defer conn.Close(context.Background())
	if r.Calls, err = cell.Measure(ctx, conn, schema); err != nil {
		return r, err
	}
	r.EarlyRows, r.SteadyRows, r.Cliff = Early(r.Calls), Steady(r.Calls), Cliff(r.Calls)
	r.EarlyUs, r.SteadyUs = medianUs(r.Calls[1:5]), medianUs(r.Calls[5:])
	return r, nil
}

func medianUs(calls []Call) float64 {
	v := make([]float64, len(calls))
	for i, c := range calls {
		v[i] = c.Micros
	}
	return stats.Median(v)
}

// ReportFile and JSONFile are the files WriteReport writes.
const (
	ReportFile = "plans.md"
	JSONFile   = "plans.json"
)

// Table is the results as a Markdown table, one row per cell and side.
func Table(results []Result) string {
	var b strings.Builder
	b.WriteString("| cell | side | rows read a call, calls 2-5 (most) | calls 6-10 (most) | 6-10 / 2-5 | µs a call, calls 2-5 (median) | calls 6-10 (median) | cliff |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		ratio := "n/a"
		if r.EarlyRows > 0 {
			ratio = fmt.Sprintf("%.2fx", float64(r.SteadyRows)/float64(r.EarlyRows))
		}
		cliff := "no"
		if r.Cliff {
			cliff = "**yes**"
		}
		fmt.Fprintf(&b, "| %s (%d) | %s | %d | %d | %s | %.0f | %.0f | %s |\n",
			r.Cell, r.Rows, r.Side, r.EarlyRows, r.SteadyRows, ratio, r.EarlyUs, r.SteadyUs, cliff)
	}
	return b.String()
}

// Targets is the target of judged's cells, met or missed: from its 6th call
// on, a call reads at most twice what calls 2-5 read.
func Targets(results []Result, judged string) string {
	var b strings.Builder
	b.WriteString("| target | want | got | |\n|---|---|---|---|\n")
	for _, r := range results {
		if r.Side != judged {
			continue
		}
		verdict := "met"
		if r.Cliff {
			verdict = "missed"
		}
		fmt.Fprintf(&b, "| %s, %s: rows read from the 6th call on | <= 2x calls 2-5 (+100) | %d against %d | %s |\n",
			judged, r.Cell, r.SteadyRows, r.EarlyRows, verdict)
	}
	return b.String()
}

// WriteReport writes the results into dir as Markdown (ReportFile) and
// JSON (JSONFile); server names the PostgreSQL they ran on, judged the side
// the targets are for.
func WriteReport(dir, server, judged string, results []Result) error {
	md := fmt.Sprintf("# Queue reads, call after call: no generic-plan cliff\n\n%s; %s; `harness-lab bench --scenarios plans`. "+
		"Each row: a new schema in the side's state, the unneeded rows of the cell's kind (and 30 rows the call can take, but in the "+
		"empty polls and the renewals), then ten calls on one new session, each in a transaction rolled back so that every call finds "+
		"the same rows. PL/pgSQL plans a statement for its arguments on its first five calls in a session and may keep a generic plan "+
		"from the 6th. Rows read: pg_stat_xact_user_tables (sequential reads and index fetches) around the call; times: the client's, "+
		"for reading only (`migrations_test/generic_plan_test.go` asserts the rows, never a time).\n\n## Targets\n\n%s\n## Cells\n\n%s",
		time.Now().UTC().Format("2006-01-02"), server, Targets(results, judged), Table(results))
	return reportfile.Write(dir, ReportFile, md, JSONFile, results)
}
