package repro

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// The tables every repro renders: side by side, one column per version, as
// aligned text on stdout and as Markdown in the report.

// rowDef is one row of a side-by-side table: its label and how each
// column's value (a run's summary, a minimal repro's result) fills its
// cell.
type rowDef[T any] struct {
	label string
	cell  func(T) string
}

// rowsOf are the rows of values side by side, one column per value: per
// def its label, then its cell of each value.
func rowsOf[T any](values []T, defs []rowDef[T]) [][]string {
	var rows [][]string
	for _, d := range defs {
		row := []string{d.label}
		for _, v := range values {
			row = append(row, d.cell(v))
		}
		rows = append(rows, row)
	}
	return rows
}

// sideBySide is the table of runs: a header naming each run ("v19
// (worker_v19)", "upstream (organic_upstream)"), then one row per def.
func sideBySide[S, E any](runs []SchemaRun[S, E], defs []rowDef[S]) (header []string, rows [][]string) {
	header = []string{""}
	var summaries []S
	for _, r := range runs {
		header = append(header, fmt.Sprintf("%s (%s)", r.Label(), r.Schema))
		summaries = append(summaries, r.Summary)
	}
	return header, rowsOf(summaries, defs)
}

// printSideBySide writes a scenario's table as aligned text, then its
// verdict v between the runs named bug and fix, then settings (a line of
// text).
func printSideBySide(w io.Writer, header []string, rows [][]string, v Verdict, bug, fix string, settings string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	verdict := "FAIL"
	if v.OK {
		verdict = "ok"
	}
	fmt.Fprintf(tw, "verdict\treproduced at %s: %v\tclean at %s: %v\t(%s)\n", bug, v.Reproduced, fix, v.Fixed, verdict)
	fmt.Fprintf(tw, "settings\t%s\n", settings)
	return tw.Flush()
}

// writeSection writes the head of a simulated scenario's Markdown section:
// its title, what ran, how its lock timeout was calibrated (when it was:
// calibrated is not empty), and its runs side by side (defs).
func writeSection[S, E any](b *strings.Builder, title, ran, calibrated string, runs []SchemaRun[S, E], defs []rowDef[S]) {
	fmt.Fprintf(b, "## %s\n\n%s\n\n", title, ran)
	if calibrated != "" {
		fmt.Fprintf(b, "%s\n\n", calibrated)
	}
	header, rows := sideBySide(runs, defs)
	writeMarkdownTable(b, header, rows)
}

// writeMarkdownTable writes header and rows as a Markdown table.
func writeMarkdownTable(b *strings.Builder, header []string, rows [][]string) {
	b.WriteString("| " + strings.Join(header, " | ") + " |\n|" + strings.Repeat("---|", len(header)) + "\n")
	for _, r := range rows {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
}

// writeVerdictMarkdown writes the checks of v as a Markdown section, then
// whether the bug showed at bug and the fix was clean at fix.
func writeVerdictMarkdown(b *strings.Builder, v Verdict, bug, fix string) {
	b.WriteString("### Verdict\n\n| run | criterion | want | got | pass |\n|---|---|---|---|---|\n")
	for _, c := range v.Checks {
		pass := "yes"
		switch {
		case !c.Pass && c.Advisory:
			pass = "no (advisory)"
		case !c.Pass:
			pass = "**NO**"
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", runLabel(c.Version, c.Side), c.Name, c.Want, mdCell(c.Got), pass)
	}
	fmt.Fprintf(b, "\nReproduced at %s: **%v**. Clean at %s: **%v**.\n", bug, v.Reproduced, fix, v.Fixed)
}

// countAndMs is a count with the longest time of what it counts: "0", or
// "3 (250 ms)".
func countAndMs[N, M int | int64](n N, ms M) string {
	if n == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%d ms)", n, ms)
}

func mdCell(s string) string {
	s = strings.ReplaceAll(s, "|", "\\|")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// runList is "v19 and v28", or "upstream, candidate and pack": the runs'
// labels.
func runList[S, E any](runs []SchemaRun[S, E]) string {
	var vs []string
	for _, r := range runs {
		vs = append(vs, r.Label())
	}
	if len(vs) < 2 {
		return strings.Join(vs, "")
	}
	return strings.Join(vs[:len(vs)-1], ", ") + " and " + vs[len(vs)-1]
}

// pairResult is a minimal repro's result at one version: whether it shows
// the bug, or the fix.
type pairResult interface {
	Bug() bool
	Fixed() bool
	version() int64
}

// pairVerdict is the verdict of a minimal repro run at two versions: the
// first shows the bug and the second the fix.
func pairVerdict[R pairResult](results []R) bool {
	return len(results) == 2 && results[0].Bug() && results[1].Fixed()
}

// printPair writes a minimal repro's table (rows, the first its header)
// right-aligned, then its verdict line.
func printPair[R pairResult](w io.Writer, results []R, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	for _, row := range rows {
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(results) != 2 {
		return nil
	}
	_, err := fmt.Fprintf(w, "\nverdict: version %d %s; version %d %s\n",
		results[0].version(), choose(results[0].Bug(), "shows the bug", "does NOT show the bug"),
		results[1].version(), choose(results[1].Fixed(), "is fixed", "is NOT fixed"))
	return err
}

// versionHeader is the header row of a minimal repro's table: "version N"
// per result.
func versionHeader[R pairResult](results []R) []string {
	row := []string{""}
	for _, r := range results {
		row = append(row, fmt.Sprintf("version %d", r.version()))
	}
	return row
}

func choose(ok bool, yes, no string) string {
	if ok {
		return yes
	}
	return no
}
