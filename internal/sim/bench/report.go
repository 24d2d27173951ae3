package bench

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/duroxide-pg/migrations/internal/reportfile"

	"github.com/duroxide-pg/migrations/internal/sim/axis"
)

// Files WriteReport writes.
const (
	ReportFile = "report.md"
	ChartFile  = "throughput.svg"
	JSONFile   = "bench.json"
)

// num formats a figure: "n/a" for nil, integers without decimals, others
// with 3 significant digits at least one decimal.
func num(v *float64) string {
	if v == nil {
		return "n/a"
	}
	x := *v
	switch {
	case x == math.Trunc(x) && math.Abs(x) < 1e9:
		return fmt.Sprintf("%.0f", x)
	case math.Abs(x) >= 100:
		return fmt.Sprintf("%.0f", x)
	case math.Abs(x) >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}

// ratioText formats the ratio of f: "2.31x", or what makes it undefined.
func ratioText(r, num_, den *float64) string {
	switch {
	case r != nil:
		return fmt.Sprintf("%.2fx", *r)
	case num_ == nil || den == nil:
		return "n/a"
	case *num_ == 0:
		return "0 / 0"
	default:
		return "x / 0"
	}
}

func withUnit(v *float64, unit string) string {
	s := num(v)
	if v == nil || unit == "" || unit == "1/s" {
		return s
	}
	return s + " " + unit
}

// figureHeader is the header of a table of figureRows.
func figureHeader(withBare bool) []string {
	header := []string{"cell", "figure", sideBefore, sideAfter, sideAfter + "/" + sideBefore}
	if withBare {
		header = append(header, sideBare, sideAfter+"/"+sideBare)
	}
	return header
}

// figureRows are the table rows of one cell's figures: the cell's name on
// the first row only, the figure's label (from label), the medians before
// and after, their ratio, and with withBare the bare and the ratio
// to it (empty where the figure has none).
func figureRows(name string, figs []Figure, label func(key string) string, withBare bool) [][]string {
	var rows [][]string
	for j, f := range figs {
		if j > 0 {
			name = ""
		}
		row := []string{name, label(f.Key), withUnit(f.Before, f.Unit), withUnit(f.After, f.Unit), ratioText(f.Ratio, f.After, f.Before)}
		if withBare {
			if f.Bare != nil {
				row = append(row, withUnit(f.Bare, f.Unit), ratioText(f.RatioToBare, f.After, f.Bare))
			} else {
				row = append(row, "", "")
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// tableRows are the rows of the stdout table and of the report.
func tableRows(cells []Cell, withBare bool) (header []string, rows [][]string) {
	defs := dispatchFigures()
	for i := range cells {
		rows = append(rows, figureRows(cells[i].Name(), cells[i].Figures, func(key string) string { return labelIn(defs, key) }, withBare)...)
	}
	return figureHeader(withBare), rows
}

// printRows writes header and rows as aligned text, a blank line before
// every cell but the first (a row naming its cell starts one).
func printRows(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t")+"\t")
	for i, row := range rows {
		if row[0] != "" && i > 0 {
			fmt.Fprintln(tw, strings.Repeat("\t", len(row)))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	return tw.Flush()
}

// writeMarkdownTable writes header and rows as a markdown table.
func writeMarkdownTable(b *strings.Builder, header []string, rows [][]string) {
	b.WriteString("| " + strings.Join(header, " | ") + " |\n|" + strings.Repeat("---|", len(header)) + "\n")
	for _, row := range rows {
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
}

// compared are the schema versions the dispatcher and migrate cells of r
// compare, before and after the fix (the scale cells' when only they ran,
// Versions when no cell ran, 0 and 0 on a pack without the fix).
func (r *Result) compared() (before, after int64) {
	if len(r.Cells) > 0 {
		return r.Cells[0].BeforeVersion, r.Cells[0].AfterVersion
	}
	if len(r.Scale) > 0 {
		return r.Scale[0].BeforeVersion, r.Scale[0].AfterVersion
	}
	before, after, _ = Versions()
	return before, after
}

func hasBare(r *Result) bool {
	for _, c := range r.Cells {
		for _, f := range c.Figures {
			if f.Bare != nil {
				return true
			}
		}
	}
	return false
}

// PrintTable writes the medians, ratios and targets as aligned text.
func PrintTable(w io.Writer, r *Result) error {
	before, after := r.compared()
	if err := printRuntimeTable(w, r.Runtime, r.Settings.Rounds); err != nil {
		return err
	}
	if r.Runtime != nil {
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "bench: fetch_orchestration_item before (schema %d) and after (schema %d) its fix, medians of %d rounds (before, after alternating), %s per cell; server %s (%s backend)\n",
		before, after, r.Settings.Rounds, secs(r.Settings.DurationS), r.Server.Version, r.Server.Backend)
	if len(r.Cells) > 0 {
		fmt.Fprintln(w)
		header, rows := tableRows(r.Cells, hasBare(r))
		if err := printRows(w, header, rows); err != nil {
			return err
		}
	}
	if err := printWorkerTable(w, r.Worker); err != nil {
		return err
	}
	if err := printScaleTable(w, r.Scale); err != nil {
		return err
	}
	if len(r.Targets) > 0 {
		fmt.Fprintln(w, "\ntargets (reported, not asserted):")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, t := range r.Targets {
			got := "got " + t.Got
			if t.Reason != "" {
				got += " (why: " + t.Reason + ")"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", targetMark(t), t.Name, "want "+t.Want, got)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if r.HotCalibration != nil {
		fmt.Fprintf(w, "\nhot lock timeout: %d ms%s\n", r.Settings.HotLockTimeoutMs, hotCalibrationText(r))
	}
	fmt.Fprintf(w, "\nserver CPU: %s; total run time %s\n", r.Server.CPU, secs(r.TotalS))
	return nil
}

func targetMark(t Target) string {
	switch {
	case !t.Measured:
		return "[ -- ]"
	case t.Met:
		return "[ met]"
	default:
		return "[MISS]"
	}
}

func secs(s float64) string {
	if s >= 60 {
		return fmt.Sprintf("%dm%02.0fs", int(s)/60, math.Mod(s, 60))
	}
	return fmt.Sprintf("%.1f s", s)
}

// markdown renders the report; plot is the file name of the throughput
// plot ("" for none).
func markdown(r *Result, plot string) string {
	var b strings.Builder
	s := r.Settings
	before, after := r.compared()
	if r.Runtime != nil {
		fmt.Fprintf(&b, "# Benchmark: what duroxide-pg users run today (upstream's schema, made by its own runner) against the pack's latest (%04d)\n\n"+
			"The headline is the real runtime's section below: the step a user takes by adopting the pack. The per-fix comparisons (schema %d against %d, and the worker and scale scenarios) follow it.\n\n",
			r.Runtime.LatestVersion, before, after)
	} else {
		fmt.Fprintf(&b, "# Benchmark: schema %d against %d\n\n", before, after)
	}
	fmt.Fprintf(&b, "Run %s on PostgreSQL %s (%s backend, %d CPUs), %d rounds, %s per cell, "+
		"before (schema %d) and after (schema %d, the fix of fetch_orchestration_item) alternating in every round; "+
		"every figure is the median over the rounds, the ratio is after's median over before's. Total run time %s. "+
		"Server CPU: %s. See docs/BENCH.md for the method.\n\n",
		r.StartedAt.Format("2006-01-02 15:04 UTC"), r.Server.Version, r.Server.Backend, r.Server.CPUs,
		s.Rounds, secs(s.DurationS), before, after, secs(r.TotalS), r.Server.CPU)
	if len(r.Targets) > 0 {
		b.WriteString("## Targets\n\nReported, not asserted.\n\n| target | want | got | |\n|---|---|---|---|\n")
		for _, t := range r.Targets {
			mark := "missed"
			switch {
			case !t.Measured:
				mark = "not measured"
			case t.Met:
				mark = "met"
			}
			if t.Reason != "" {
				mark += ": " + t.Reason
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", t.Name, t.Want, t.Got, mark)
		}
		b.WriteString("\n")
	}
	if r.Runtime != nil {
		b.WriteString(runtimeMarkdown(r.Runtime, s.Rounds, s.RuntimeWait))
		b.WriteString("## Per-fix comparisons\n\nEach scenario below compares the versions just before and with one fix of the pack, on the model of the runtime (package dispatch), not the real one.\n\n")
	}
	if plot != "" && r.Cell(backlog, firstOr(s.BacklogDispatchers)) != nil {
		fmt.Fprintf(&b, "## Backlog throughput against N\n\n![completed cycles/s against dispatchers, backlog](%s)\n\n", plot)
	}
	b.WriteString("## Figures\n\n")
	desc := map[string]string{
		backlog: fmt.Sprintf("%d instances, one pending message and a %d-event history (~%d bytes per event) each, lock timeout %d ms; each ack enqueues the instance's next message.",
			s.BacklogInstances, s.BacklogHistory, s.EventBytes, s.BacklogLockTimeoutMs),
		ScenarioHot: fmt.Sprintf("one instance with a %d-event history that always has a message, %d dispatchers, lock timeout %d ms%s.",
			s.HotHistory, s.HotDispatchers, s.HotLockTimeoutMs, hotCalibrationText(r)),
		queueOnly: fmt.Sprintf("%d instances without history, lock timeout %d ms; bare: the bare single-statement dequeue (UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1), DELETE + INSERT of the next message as the ack) on the same tables.",
			s.QueueInstances, s.QueueLockTimeoutMs),
		ScenarioMigrate: fmt.Sprintf("wall time of Up 0 -> %d (%s column) and 0 -> %d (%s column), each on a fresh database.",
			before, sideBefore, after, sideAfter),
	}
	for _, sc := range allScenarios() {
		var cells []Cell
		for _, c := range r.Cells {
			if c.Scenario == sc {
				cells = append(cells, c)
			}
		}
		if len(cells) == 0 {
			continue
		}
		fmt.Fprintf(&b, "### %s\n\n%s\n\n", sc, desc[sc])
		header, rows := tableRows(cells, sc == queueOnly)
		writeMarkdownTable(&b, header, rows)
		b.WriteString("\n")
	}
	b.WriteString(workerMarkdown(r.Worker, s))
	scalePlot := ""
	if len(scaleCurve(r.Scale)) > 0 {
		scalePlot = ScaleFile
	}
	b.WriteString(scaleMarkdown(r.Scale, s, scalePlot))
	b.WriteString("## Per round\n\nCompleted cycles/s of every run (migrate: wall time), round by round.\n\n| cell | side | ")
	for i := 1; i <= s.Rounds; i++ {
		fmt.Fprintf(&b, "round %d |", i)
		if i < s.Rounds {
			b.WriteString(" ")
		}
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", s.Rounds) + "\n")
	for i := range r.Cells {
		c := &r.Cells[i]
		key := "cycles_per_s"
		if c.Scenario == ScenarioMigrate {
			key = "wall_ms"
		}
		def := defByKey(dispatchFigures(), key)
		for _, side := range []string{sideBefore, sideAfter, sideBare} {
			var vals []string
			for _, rs := range c.Rounds {
				if rs.Side == side {
					vals = append(vals, withUnit(def.get(&rs.Sample), def.Unit))
				}
			}
			if len(vals) == 0 {
				continue
			}
			fmt.Fprintf(&b, "| %s | %s | %s |\n", c.Name(), side, strings.Join(vals, " | "))
		}
	}
	return b.String()
}

// hotCalibrationText says how the hot lock timeout was calibrated ("" for
// a fixed one).
func hotCalibrationText(r *Result) string {
	c := r.HotCalibration
	if c == nil {
		return " (fixed)"
	}
	return fmt.Sprintf(" (calibrated at start like the organic repro: %g x the median of %d uncontended fetches of the hot instance, %.1f ms)",
		c.Factor, c.Samples, c.FetchMs)
}

func firstOr(ns []int) int {
	if len(ns) == 0 {
		return 0
	}
	return ns[0]
}

// WriteReport writes dir/report.md, dir/throughput.svg and dir/bench.json,
// creating dir.
func WriteReport(dir string, r *Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var svg bytes.Buffer
	plot := ""
	if err := throughputSVG(&svg, r); err == nil {
		plot = ChartFile
		if err := os.WriteFile(filepath.Join(dir, ChartFile), svg.Bytes(), 0o644); err != nil {
			return err
		}
	}
	if len(scaleCurve(r.Scale)) > 0 {
		var curve bytes.Buffer
		if err := scaleSVG(&curve, r); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, ScaleFile), curve.Bytes(), 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, ReportFile), []byte(markdown(r, plot)), 0o644); err != nil {
		return err
	}
	return WriteJSON(filepath.Join(dir, JSONFile), r)
}

// WriteJSON writes r as indented JSON to path.
func WriteJSON(path string, r *Result) error { return reportfile.WriteJSON(path, r) }

// throughputSVG draws completed cycles/s (median) against N for both
// versions of the backlog scenario: a hand-written SVG line plot, linear
// axes, each point labelled with its value.
func throughputSVG(w io.Writer, r *Result) error {
	type pt struct {
		n             int
		before, after *float64
	}
	var pts []pt
	for i := range r.Cells {
		c := &r.Cells[i]
		if c.Scenario != backlog {
			continue
		}
		if f := c.Figure("cycles_per_s"); f != nil {
			pts = append(pts, pt{c.Dispatchers, f.Before, f.After})
		}
	}
	if len(pts) == 0 {
		return fmt.Errorf("bench: no backlog figures to plot")
	}
	before, after := r.compared()
	const (
		width, height         = 640.0, 400.0
		left, right, top, bot = 70.0, 130.0, 40.0, 50.0
	)
	maxN, maxV := 1, 0.0
	for _, p := range pts {
		maxN = max(maxN, p.n)
		for _, v := range []*float64{p.before, p.after} {
			if v != nil {
				maxV = max(maxV, *v)
			}
		}
	}
	step := axis.Step(maxV / 5)
	top_ := math.Max(step, math.Ceil(maxV/step)*step)
	px := func(n int) float64 { return left + (width-left-right)*float64(n)/float64(maxN) }
	py := func(v float64) float64 { return height - bot - (height-top-bot)*v/top_ }
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" text-anchor="middle" font-size="14">backlog: completed fetch+ack cycles/s against dispatchers (median of %d rounds)</text>`+"\n",
		width/2, r.Settings.Rounds)
	// Grid and y labels.
	for v := 0.0; v <= top_+step/2; v += step {
		y := py(v)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, width-right, y)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, num(&v))
	}
	// Axes and x labels.
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, height-bot, width-right, height-bot)
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, top, left, height-bot)
	for _, p := range pts {
		x := px(p.n)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", x, height-bot, x, height-bot+5)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%d</text>`+"\n", x, height-bot+18, p.n)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">dispatchers (N)</text>`+"\n", left+(width-left-right)/2, height-12)
	fmt.Fprintf(&b, `<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">cycles/s</text>`+"\n", top+(height-top-bot)/2, top+(height-top-bot)/2)
	series := []struct {
		name, color string
		get         func(pt) *float64
	}{
		{fmt.Sprintf("version %d", before), "#d62728", func(p pt) *float64 { return p.before }},
		{fmt.Sprintf("version %d", after), "#1f77b4", func(p pt) *float64 { return p.after }},
	}
	for i, s := range series {
		var path []string
		for _, p := range pts {
			if v := s.get(p); v != nil {
				path = append(path, fmt.Sprintf("%.1f,%.1f", px(p.n), py(*v)))
			}
		}
		if len(path) > 1 {
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", s.color, strings.Join(path, " "))
		}
		for _, p := range pts {
			if v := s.get(p); v != nil {
				x, y := px(p.n), py(*v)
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>`+"\n", x, y, s.color)
				dy := -8.0
				if i == 0 {
					dy = 16
				}
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="%s">%s</text>`+"\n", x, y+dy, s.color, num(v))
			}
		}
		ly := top + 10 + float64(i)*20
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/>`+"\n", width-right+12, ly, width-right+32, ly, s.color)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", width-right+38, ly+4, s.name)
	}
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}
