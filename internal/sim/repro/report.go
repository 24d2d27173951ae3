package repro

import (
	"bytes"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/duroxide-pg/migrations/internal/sim/axis"
	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
)

// Files WriteReport writes.
const (
	ReportFile    = "report.md"
	HistogramFile = "remaining_lease.svg"
)

// Histogram counts the remaining lease at return (ms) of the fetches that
// returned a row, in bins (LoMs, HiMs]. Values below the first bin's LoMs
// are counted in the first bin and values above the last bin's HiMs in the
// last; 0 is always a bin edge, so a bin is either all dead (HiMs <= 0) or
// all live (LoMs >= 0). Lost counts leases gone before they could be read
// (dead too).
type Histogram struct {
	BinWidthMs int64 `json:"bin_width_ms"`
	Bins       []Bin `json:"bins"`
	Lost       int   `json:"lost"`
	Dead       int   `json:"dead"` // remaining <= 0, Lost not included
	Live       int   `json:"live"` // remaining > 0
}

// Bin is one histogram bar.
type Bin struct {
	LoMs  int64 `json:"lo_ms"`
	HiMs  int64 `json:"hi_ms"`
	Count int   `json:"count"`
}

const histogramBins = 32

// histRange picks the axis for values: from min(p0.5, 0) to
// max(p99.5, timeout), in "nice" bins aligned on 0.
func histRange(values []int64, timeoutMs int64) (lo, hi, width int64) {
	sorted := append([]int64(nil), values...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	lo, hi = 0, max(timeoutMs, 1)
	if len(sorted) > 0 {
		lo = min(lo, dispatch.Percentile(sorted, 0.5))
		hi = max(hi, dispatch.Percentile(sorted, 99.5))
	}
	width = niceWidth(float64(hi-lo) / histogramBins)
	// Bins are (a, b]: the lowest value must lie above the first edge.
	lo = floorDiv(lo-1, width) * width
	hi = -floorDiv(-hi, width) * width
	return lo, hi, width
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// niceWidth is a bin width for a span of w: w rounded up to 1, 2 or 5
// times a power of ten, at least 1 (bins are whole milliseconds).
func niceWidth(w float64) int64 { return int64(axis.Step(max(w, 1))) }

func buildHistogram(values []int64, lost int, lo, hi, width int64) Histogram {
	h := Histogram{BinWidthMs: width, Lost: lost}
	n := int((hi - lo) / width)
	if n < 1 {
		n = 1
	}
	for i := 0; i < n; i++ {
		h.Bins = append(h.Bins, Bin{LoMs: lo + int64(i)*width, HiMs: lo + int64(i+1)*width})
	}
	for _, v := range values {
		if v <= 0 {
			h.Dead++
		} else {
			h.Live++
		}
		// (a, b]: bin index ceil((v-lo)/width) - 1.
		i := int(-floorDiv(-(v-lo), width)) - 1
		h.Bins[min(max(i, 0), n-1)].Count++
	}
	return h
}

// remainingHistogram is the histogram of one run's remaining lease at
// return, on its own axis.
func remainingHistogram(events []dispatch.Event, timeoutMs int64) Histogram {
	values, lost := dispatch.Remaining(events)
	lo, hi, w := histRange(values, timeoutMs)
	return buildHistogram(values, lost, lo, hi, w)
}

// organicRows are the rows of the organic scenario's side-by-side table.
func organicRows() []rowDef[dispatch.Summary] {
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	triple := func(s dispatch.Summary, p1, p50, p99 int64) string {
		if s.RemainingSamples == 0 {
			return "-"
		}
		return fmt.Sprintf("%d / %d / %d ms", p1, p50, p99)
	}
	return []rowDef[dispatch.Summary]{
		{"fetches returning a lease", func(s dispatch.Summary) string {
			return fmt.Sprintf("%d (of %d calls)", s.Fetches, s.FetchCalls)
		}},
		{"dead at return (database clock)", func(s dispatch.Summary) string {
			return fmt.Sprintf("%d (%.1f%%)", s.DeadAtReturn, s.DeadAtReturnPct)
		}},
		{"expired in delivery (longest)", func(s dispatch.Summary) string { return countAndMs(s.ExpiredInDelivery, s.DeliveryMaxMs) }},
		{"invalid-lock acks", func(s dispatch.Summary) string {
			return fmt.Sprintf("%d (%.1f%% of fetches)", s.InvalidLockAcks, s.InvalidLockAckPct)
		}},
		{"refused acks: lease valid / run out", func(s dispatch.Summary) string {
			late := fmt.Sprint(s.RefusedLateAcks)
			if s.LatenessSamples > 0 {
				late += fmt.Sprintf(" (late p50 %d, max %d ms)", s.LatenessP50Ms, s.LatenessMaxMs)
			}
			return fmt.Sprintf("%d / %s", s.RefusedWhileValidAcks, late)
		}},
		{"max attempt_count (> max_attempts?)", func(s dispatch.Summary) string {
			return fmt.Sprintf("%d (> %d: %s)", s.MaxAttemptCount, s.MaxAttempts, yes(s.ExceededMaxAttempts))
		}},
		{"remaining lease p1 / p50 / p99", func(s dispatch.Summary) string {
			return triple(s, s.RemainingP1Ms, s.RemainingP50Ms, s.RemainingP99Ms)
		}},
		{"lease used at return p50 / p99 / max", func(s dispatch.Summary) string {
			if s.ReturnAgeSamples == 0 {
				return "-"
			}
			return fmt.Sprintf("%d / %d / %d ms", s.ReturnAgeP50Ms, s.ReturnAgeP99Ms, s.ReturnAgeMaxMs)
		}},
		{"lease age on arrival p50 / p99 / max", func(s dispatch.Summary) string {
			return triple(s, s.LeaseAgeP50Ms, s.LeaseAgeP99Ms, s.LeaseAgeMaxMs)
		}},
		{"completed turns/s", func(s dispatch.Summary) string {
			return fmt.Sprintf("%.1f (%d in %.1f s)", s.TurnsPerSec, s.CompletedTurns, s.ElapsedS)
		}},
		{"fetch latency p50 / p99", func(s dispatch.Summary) string {
			return fmt.Sprintf("%.1f / %.1f ms", s.FetchLatencyP50Ms, s.FetchLatencyP99Ms)
		}},
		{"fetch errors (deadlocks)", func(s dispatch.Summary) string {
			return fmt.Sprintf("%d (%d)", s.FetchErrors, s.Deadlocks)
		}},
		{"poison acks (ok)", func(s dispatch.Summary) string {
			return fmt.Sprintf("%d (%d)", s.PoisonAcks, s.PoisonAcksOK)
		}},
	}
}

// PrintTable writes the side-by-side table of res to w.
func PrintTable(w io.Writer, res OrganicResult) error {
	header, rows := sideBySide(res.Runs, organicRows())
	lock := fmt.Sprintf("lock timeout %d ms", res.Settings.LockTimeoutMs)
	if c := res.Calibration; c != nil {
		lock += fmt.Sprintf(" (%g x an uncontended fetch, %.1f ms)", c.Factor, c.FetchMs)
	}
	return printSideBySide(w, header, rows, res.Verdict.Verdict, SideUpstream, SidePack,
		fmt.Sprintf("%d dispatchers, %d instance(s) x %d events, %s, %.0f s per side",
			res.Settings.Dispatchers, res.Settings.Instances, res.Settings.HistoryEvents, lock, res.Settings.DurationS))
}

// organicMarkdown renders res as a Markdown section; histogramFile, when
// not empty, is the SVG to link.
func organicMarkdown(res OrganicResult, histogramFile string) string {
	var b strings.Builder
	s := res.Settings
	ran := fmt.Sprintf("%d simulated orchestration dispatchers (one connection each, the runtime's loop: "+
		"p_now_ms minted just before each fetch, version filter 0..1029, %d ms minimum poll interval, "+
		"renewal every ceil(timeout/2) s, poison ack past max_attempts %d, failure ack after a refused ack) "+
		"on %d running instance(s) with %d history events of ~%d bytes each; lock timeout %d ms, "+
		"turn time %d ms, clock skew ±%d ms, %.0f s per side.",
		s.Dispatchers, s.PollIntervalMs, s.MaxAttempts, s.Instances, s.HistoryEvents, s.EventBytes,
		s.LockTimeoutMs, s.TurnTimeMs, s.SkewMs, s.DurationS)
	calibrated := ""
	if c := res.Calibration; c != nil {
		calibrated = fmt.Sprintf("The lock timeout was calibrated on this machine: one uncontended fetch of a hot instance "+
			"took %.1f ms (median of %d, schema %s), and the timeout is %g times that, rounded up: %d ms. "+
			"At upstream's latest a lease dies when the caller waited longer than that in the call; at the pack only if delivering the row "+
			"took longer.", c.FetchMs, c.Samples, c.Schema, c.Factor, c.LockTimeoutMs)
	}
	writeSection(&b, "Organic scenario: the runtime's dispatch loop on "+runList(res.Runs), ran, calibrated, res.Runs, organicRows())
	b.WriteString("\n")
	for _, r := range res.Runs {
		fmt.Fprintf(&b, "- %s: %s\n", r.Label(), r.Made)
	}
	fmt.Fprintf(&b, "\n\"Lease age at return\": how long before the row reached the caller its lease started "+
		"(caller clock at return minus locked_until plus the timeout). At upstream's latest the lease starts at p_now_ms, before the "+
		"call, so its age is the whole call including every wait; upstream's candidate carries p_now_ms forward by the time spent "+
		"in the call up to the claim, so its age is the rest of the call (loading the history) and the delivery; at the pack it "+
		"starts when the function is done, so its age is the time to deliver the row (serialise, send, parse the history) plus "+
		"any scheduling stall. Upstream's candidate (and it amended) is reported, not judged.\n")
	b.WriteString("\n\"Dead on arrival\": the lease's locked_until was already at or before the caller's clock " +
		"when the row reached the caller (or the lease had already been taken over before it could be read: " +
		"dead at return when that read failed, expired in delivery when it ran, since a takeover needs the lease to " +
		"have run out), " +
		"so every ack of that turn is refused with 'Invalid lock token' and the message comes back with a higher " +
		"attempt_count. It splits in two: \"dead at return\", already expired by the database clock when the " +
		"function returned (what the function controls, and what the fix removes), and \"expired in delivery\", " +
		"alive at return but outlived by the row's delivery to the caller (a large history on a busy machine); " +
		"the verdict judges the first and reports the second. \"Lease used at return\": how much of its lease the " +
		"fetch had used up when the function returned, by the database clock, over the leases read after their " +
		"row arrived (a lease taken over in its delivery has no age of its own: the delivery's doing, a starved " +
		"dispatcher, counted with the leases expired in delivery); at the fix its median must " +
		fmt.Sprintf("stay within %d%% of the lock timeout. attempt_count is judged below the fix only: ", FixReturnAgeP50Pct) +
		"at the fix the function raises it only through a lease dead at return or an ack refused while valid.\n")
	b.WriteString("\n\"Refused acks\": acks refused with 'Invalid lock token', judged at the ack's clock, the later of " +
		"the p_now_ms it passed and the database clock read in its round trip just before it ran (a lower bound of the " +
		"clock at its check). \"Lease valid\": locked_until was still after that clock, so the schema refused a " +
		"lease that had not run out (judged: none at the fix). \"Run out\": the lease had ended by then, before " +
		"the fetch returned, during the row's delivery or during the caller's processing of the turn (reported with " +
		"how late, not judged).\n\n")
	if histogramFile != "" {
		fmt.Fprintf(&b, "![Remaining lease at return, per side](%s)\n\n", histogramFile)
	}
	writeVerdictMarkdown(&b, res.Verdict.Verdict, SideUpstream, SidePack)
	if !res.Verdict.Conserved {
		b.WriteString("\nA message was processed twice (or lost): ack_orchestration_item validates the lease against the " +
			"caller's p_now_ms with a plain read and locks nothing, so a fetch can take the instance over while an ack " +
			"that passed its check is still running; the ack commits without consuming the batch and the taker " +
			"processes it again. This is not part of the fetch fix's verdict.\n")
	}
	return b.String()
}

// reportTitle heads report.md.
const reportTitle = "# duroxide-pg fetch_orchestration_item: lease dead on arrival at upstream, valid at the pack\n\n"

// WriteReport writes dir/report.md (the organic section under a title) and
// dir/remaining_lease.svg, creating dir.
func WriteReport(dir string, res OrganicResult) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var svg bytes.Buffer
	if err := writeHistogramSVG(&svg, res); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, HistogramFile), svg.Bytes(), 0o644); err != nil {
		return err
	}
	md := reportTitle + organicMarkdown(res, HistogramFile)
	return os.WriteFile(filepath.Join(dir, ReportFile), []byte(md), 0o644)
}

// writeHistogramSVG draws one histogram panel per run, one above the other
// on a common axis: bars at or below 0 ms (dead on arrival) in red, above
// in green, leases lost before they could be read as a separate dark bar.
func writeHistogramSVG(w io.Writer, res OrganicResult) error {
	const (
		width   = 820.0
		panelH  = 210.0
		left    = 70.0
		right   = 20.0
		top     = 40.0
		lostW   = 34.0
		gap     = 16.0
		bottomH = 40.0
	)
	n := len(res.Runs)
	height := top + float64(n)*(panelH+bottomH) + 10
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-size="15" font-weight="bold">Remaining lease when fetch_orchestration_item returned (locked_until − caller clock), lock timeout %d ms</text>`+"\n",
		left, res.Settings.LockTimeoutMs)
	for p, r := range res.Runs {
		h := r.Histogram
		y0 := top + float64(p)*(panelH+bottomH)
		plotL := left + lostW + gap
		plotW := width - right - plotL
		maxC := h.Lost
		for _, bin := range h.Bins {
			maxC = max(maxC, bin.Count)
		}
		if maxC == 0 {
			maxC = 1
		}
		yOf := func(c int) float64 { return y0 + panelH - float64(c)/float64(maxC)*(panelH-20) }
		s := r.Summary
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-weight="bold">%s</text>`+"\n", plotL, y0+12,
			html.EscapeString(fmt.Sprintf("%s (%s): %d leases, %d dead on arrival (%.1f%%), p50 %d ms",
				r.Label(), r.Schema, s.Fetches, s.DeadOnArrival, s.DeadOnArrivalPct, s.RemainingP50Ms)))
		// Axes.
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", left, y0+panelH, width-right, y0+panelH)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", left, y0+20, left, y0+panelH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%d</text>`+"\n", left-4, yOf(maxC)+4, maxC)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">0</text>`+"\n", left-4, y0+panelH+4)
		fmt.Fprintf(&b, `<text x="14" y="%.1f" transform="rotate(-90 14 %.1f)" text-anchor="middle">fetches</text>`+"\n",
			y0+panelH/2, y0+panelH/2)
		// Lost bar.
		if h.Lost > 0 {
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#7f0000"><title>%d leases lost before read</title></rect>`+"\n",
				left+4, yOf(h.Lost), lostW-8, y0+panelH-yOf(h.Lost), h.Lost)
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">lost</text>`+"\n", left+lostW/2, y0+panelH+16)
		if len(h.Bins) == 0 {
			continue
		}
		lo, hi := h.Bins[0].LoMs, h.Bins[len(h.Bins)-1].HiMs
		xOf := func(ms int64) float64 { return plotL + float64(ms-lo)/float64(hi-lo)*plotW }
		for _, bin := range h.Bins {
			if bin.Count == 0 {
				continue
			}
			color := "#2ca02c"
			if bin.HiMs <= 0 {
				color = "#d62728"
			}
			x1, x2 := xOf(bin.LoMs), xOf(bin.HiMs)
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>(%d, %d] ms: %d</title></rect>`+"\n",
				x1+0.5, yOf(bin.Count), math.Max(x2-x1-1, 1), y0+panelH-yOf(bin.Count), color, bin.LoMs, bin.HiMs, bin.Count)
		}
		// Zero and timeout markers.
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000" stroke-dasharray="4 3"/>`+"\n",
			xOf(0), y0+20, xOf(0), y0+panelH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" fill="#d62728">dead ≤ 0</text>`+"\n", xOf(0)-4, y0+32)
		if t := res.Settings.LockTimeoutMs; t > lo && t <= hi {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#555" stroke-dasharray="1 3"/>`+"\n",
				xOf(t), y0+20, xOf(t), y0+panelH)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#555">timeout</text>`+"\n", xOf(t)+3, y0+32)
		}
		// X ticks: about 8, on multiples of the bin width.
		step := h.BinWidthMs * int64(max(1, len(h.Bins)/8))
		for t := floorDiv(lo, step) * step; t <= hi; t += step {
			if t < lo {
				continue
			}
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", xOf(t), y0+panelH, xOf(t), y0+panelH+4)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%d</text>`+"\n", xOf(t), y0+panelH+16, t)
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">remaining lease at return (ms)</text>`+"\n",
			plotL+plotW/2, y0+panelH+32)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
