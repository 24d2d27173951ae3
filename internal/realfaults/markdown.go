package realfaults

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
)

// tableHeader is the header of the scenarios' table: one row per scenario
// and side.
const tableHeader = `| scenario | faults injected | side | started | completed | wrong | twice | failed: runtime's class | failed: other | lost | activity runs beyond one | WARN/ERROR lines | client retries | wall s |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|`

// Row is one run of a scenario, for the table.
type Row struct {
	Scenario string
	Report   *Report
}

// Table renders rows as a Markdown table, one line per scenario and side.
func Table(rows []Row) string {
	var b strings.Builder
	b.WriteString(tableHeader + "\n")
	for _, row := range rows {
		for _, s := range row.Report.Sides {
			other := 0
			for _, n := range s.Unclassified {
				other += n
			}
			lines := 0
			for _, n := range s.Logs {
				lines += n
			}
			fmt.Fprintf(&b, "| %s | %d | %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %.1f |\n",
				row.Scenario, row.Report.Injected, s.Side.Name, s.Orchestrations, s.Completed, s.Wrong, s.Twice,
				s.Failed-other, other, s.Lost, s.ActivityRunsBeyondOne, lines, s.ClientErrors, float64(s.WallMs)/1000)
		}
	}
	return b.String()
}

// LogKinds lists every WARN/ERROR kind the rows logged, with its count per
// side over all rows and the first line of the kind, as a Markdown list.
func LogKinds(rows []Row) string {
	type tally struct {
		bySide map[string]int
		sample string
	}
	kinds := map[string]*tally{}
	var sides []string
	for _, row := range rows {
		for _, s := range row.Report.Sides {
			if !slices.Contains(sides, s.Side.Name) {
				sides = append(sides, s.Side.Name)
			}
			for kind, n := range s.Logs {
				k := kinds[kind]
				if k == nil {
					k = &tally{bySide: map[string]int{}, sample: s.LogSamples[kind]}
					kinds[kind] = k
				}
				k.bySide[s.Side.Name] += n
			}
		}
	}
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		k := kinds[name]
		var counts []string
		for _, side := range sides {
			counts = append(counts, fmt.Sprintf("%s %d", side, k.bySide[side]))
		}
		fmt.Fprintf(&b, "- `%s` (%s)\n", oneLine(name), strings.Join(counts, ", "))
	}
	return b.String()
}

// oneLine keeps a log kind on one Markdown line, without backticks.
func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	s = strings.ReplaceAll(s, "`", "'")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// The markers of the generated section in a document.
const (
	BeginMarker = "<!-- realfaults report: begin (harness-lab soak --runtime --each --doc writes it) -->"
	EndMarker   = "<!-- realfaults report: end -->"
)

// ReplaceSection writes body between the markers of the document at path.
func ReplaceSection(path, body string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	begin := bytes.Index(doc, []byte(BeginMarker))
	end := bytes.Index(doc, []byte(EndMarker))
	if begin < 0 || end < begin {
		return errors.New(path + ": no section marked " + BeginMarker + " ... " + EndMarker)
	}
	var out bytes.Buffer
	out.Write(doc[:begin+len(BeginMarker)])
	out.WriteString("\n" + body)
	out.Write(doc[end:])
	return os.WriteFile(path, out.Bytes(), 0o644)
}

// BulkTable renders a bulk run as a Markdown table: one line per
// operation, a column per side, then what the concurrent runtime saw.
func BulkTable(r *BulkReport) string {
	var b strings.Builder
	b.WriteString("| operation |")
	for _, s := range r.Sides {
		fmt.Fprintf(&b, " %s |", s.Side.Name)
	}
	b.WriteString("\n|---|")
	for range r.Sides {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	if len(r.Sides) > 0 {
		for i, st := range r.Sides[0].Steps {
			fmt.Fprintf(&b, "| %s |", st.Name)
			for _, s := range r.Sides {
				if i >= len(s.Steps) {
					b.WriteString(" |")
					continue
				}
				cell := s.Steps[i]
				if cell.Error != "" {
					fmt.Fprintf(&b, " failed: %s |", oneLine(cell.Error))
				} else {
					fmt.Fprintf(&b, " ok, %.1f s |", float64(cell.Ms)/1000)
				}
			}
			b.WriteString("\n")
		}
	}
	fmt.Fprintf(&b, "\nMeanwhile another runtime process ran its load %d times on a schema of its own: %d runs left an instance incomplete, %d of its lines said \"out of shared memory\".\n",
		r.LiveRuns, r.LiveIncomplete, len(r.LiveOutOfMemory))
	return b.String()
}
