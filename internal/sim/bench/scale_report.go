package bench

import (
	"fmt"
	"io"
	"strings"
)

// ScaleFile is the K curve WriteReport writes when the scale scenario ran.
const ScaleFile = "scale.svg"

// scaleTableRows are the rows of the scale cells' table.
func scaleTableRows(cells []ScaleCell) (header []string, rows [][]string) {
	defs := scaleFigures()
	for i := range cells {
		rows = append(rows, figureRows(cells[i].Name(), cells[i].Figures, func(key string) string { return labelIn(defs, key) }, false)...)
	}
	return figureHeader(false), rows
}

// scaleTitle says what the scale table compares.
func scaleTitle(cells []ScaleCell) string {
	return fmt.Sprintf("scale: fetch_orchestration_item against blocked messages (K) and completed instances (C), before (schema %d, before the first fetch fix) "+
		"and after (schema %d, the pack's latest), medians over the rounds", cells[0].BeforeVersion, cells[0].AfterVersion)
}

// printScaleTable writes the scale cells' medians and ratios.
func printScaleTable(w io.Writer, cells []ScaleCell) error {
	if len(cells) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\n%s\n\n", scaleTitle(cells))
	header, rows := scaleTableRows(cells)
	return printRows(w, header, rows)
}

// scaleMarkdown renders the scale cells as a markdown section, with the K
// curve when there is one (plot: its file name).
func scaleMarkdown(cells []ScaleCell, s Settings, plot string) string {
	if len(cells) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "### scale\n\n%s.\n\n", scaleTitle(cells))
	fmt.Fprintf(&b, "Blocked cells: K unclaimed visible messages of instances holding a live lease at the head of the queue, spread over %d instances "+
		"or all on one fan-in instance; the empty fetch has nothing claimable behind them, the one-row fetch %d claimable instances "+
		"(each call rolled back). Every figure is taken on one fresh session: early = median of calls %d-%d (custom plans), "+
		"steady = median of calls %d-%d (the plan the session settled on after PostgreSQL's 5 custom plans). "+
		"Idle cell: %d dispatchers polling the empty fetch every %d ms for %.1f s over the largest spread K. "+
		"Completed cells: C completed instances with %d history events each and one small claimable instance cycled fetch+ack (fetch and ack timed apart), "+
		"and one instance with a %d-event history (~%d bytes per event) fetched alone, each call rolled back: its fetch against the small instance's "+
		"is the cost of loading a history, the empty fetch that of the candidate search. "+
		"Every call passes the runtime's version filter.\n\n",
		s.ScaleSpreadInstances, s.ScaleClaimable, earlyFirstCall, earlyLastCall, steadyFirstCall, s.ScaleCalls,
		s.ScaleIdleDispatchers, s.PollIntervalMs, s.ScaleIdleDurationS, s.ScaleCompletedHistory, s.ScaleLargeHistory, s.EventBytes)
	if plot != "" {
		fmt.Fprintf(&b, "![fetch latency against K, both seedings, before and after](%s)\n\n", plot)
	}
	header, rows := scaleTableRows(cells)
	writeMarkdownTable(&b, header, rows)
	b.WriteString("\n")
	return b.String()
}
