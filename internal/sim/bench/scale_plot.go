package bench

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"strings"
)

// curveSeries is one line of the K curve: one side, one seeding, one call.
type curveSeries struct {
	name, color, dash string
	pts               []curvePoint
}

type curvePoint struct {
	k  int
	ms float64
}

// scaleCurve is the series of the K curve: for each seeding and side, the
// steady one-row fetch (solid) and the steady empty fetch (dashed), from
// the medians of the blocked cells.
func scaleCurve(cells []ScaleCell) []curveSeries {
	colors := map[string]map[string]string{
		seedSpread: {sideBefore: "#d62728", sideAfter: "#1f77b4"},
		seedFanIn:  {sideBefore: "#ff7f0e", sideAfter: "#2ca02c"},
	}
	var out []curveSeries
	for _, seeding := range []string{seedSpread, seedFanIn} {
		bc := blockedCells(cells, seeding)
		if len(bc) == 0 {
			continue
		}
		for _, side := range []string{sideBefore, sideAfter} {
			for _, call := range []struct{ name, key, dash string }{{"one-row", "row_fetch_steady_ms", ""}, {"empty", "empty_fetch_steady_ms", "6,4"}} {
				s := curveSeries{name: fmt.Sprintf("%s, %s (schema %d), %s", seeding, side, bc[0].Version(side), call.name),
					color: colors[seeding][side], dash: call.dash}
				for _, c := range bc {
					if f := c.Figure(call.key); f != nil {
						if v := sideOf(f, side); v != nil && *v > 0 {
							s.pts = append(s.pts, curvePoint{c.Blocked, *v})
						}
					}
				}
				if len(s.pts) > 0 {
					out = append(out, s)
				}
			}
		}
	}
	return out
}

func sideOf(f *Figure, side string) *float64 {
	if side == sideBefore {
		return f.Before
	}
	return f.After
}

// scaleSVG draws the K curve: steady fetch latency (median over the
// rounds) against K, log-log, for each seeding and side, one-row solid
// and empty dashed; a hand-written SVG like throughputSVG.
func scaleSVG(w io.Writer, r *Result) error {
	series := scaleCurve(r.Scale)
	if len(series) == 0 {
		return fmt.Errorf("bench: no scale figures to plot")
	}
	const (
		width, height         = 760.0, 440.0
		left, right, top, bot = 70.0, 280.0, 40.0, 50.0
	)
	minK, maxK, minV, maxV := math.MaxInt, 0, math.Inf(1), 0.0
	for _, s := range series {
		for _, p := range s.pts {
			minK, maxK = min(minK, p.k), max(maxK, p.k)
			minV, maxV = min(minV, p.ms), max(maxV, p.ms)
		}
	}
	lx0, lx1 := math.Log10(float64(minK)), math.Log10(float64(maxK))
	if lx1-lx0 < 1e-9 {
		lx0, lx1 = lx0-0.5, lx1+0.5
	}
	ly0, ly1 := math.Floor(math.Log10(minV)), math.Ceil(math.Log10(maxV))
	if ly1 <= ly0 {
		ly1 = ly0 + 1
	}
	px := func(k int) float64 {
		return left + (width-left-right)*(math.Log10(float64(k))-lx0)/(lx1-lx0)
	}
	py := func(v float64) float64 { return height - bot - (height-top-bot)*(math.Log10(v)-ly0)/(ly1-ly0) }
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" text-anchor="middle" font-size="14">fetch latency (steady state, median of %d rounds) against blocked messages K, log-log</text>`+"\n",
		(width-right+left)/2+40, r.Settings.Rounds)
	for e := ly0; e <= ly1+1e-9; e++ {
		v := math.Pow(10, e)
		y := py(v)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, width-right, y)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, strings.TrimSuffix(fmt.Sprintf("%g", v), ".0"))
	}
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, height-bot, width-right, height-bot)
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, top, left, height-bot)
	seen := map[int]bool{}
	for _, s := range series {
		for _, p := range s.pts {
			if seen[p.k] {
				continue
			}
			seen[p.k] = true
			x := px(p.k)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", x, height-bot, x, height-bot+5)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x, height-bot+18, count(p.k))
		}
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">blocked messages K</text>`+"\n", left+(width-left-right)/2, height-12)
	fmt.Fprintf(&b, `<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">ms per call</text>`+"\n", top+(height-top-bot)/2, top+(height-top-bot)/2)
	for i, s := range series {
		dash := ""
		if s.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, s.dash)
		}
		var path []string
		for _, p := range s.pts {
			path = append(path, fmt.Sprintf("%.1f,%.1f", px(p.k), py(p.ms)))
		}
		if len(path) > 1 {
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", s.color, dash, strings.Join(path, " "))
		}
		for _, p := range s.pts {
			v := p.ms
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s K=%s: %s ms</title></circle>`+"\n",
				px(p.k), py(p.ms), s.color, s.name, count(p.k), num(&v))
		}
		ly := top + 10 + float64(i)*20
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n", width-right+12, ly, width-right+40, ly, s.color, dash)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", width-right+46, ly+4, s.name)
	}
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}
