package benchharness

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/onebitd/onebitd/machine"
)

// Plot writes an SVG line chart of the decoder-facing handoff time (median,
// onebitd process) and onebitd's own handling (median, in-process) against
// prompt tokens, for both routes; each point has a whisker over its 95 %
// confidence interval where it has one.
func (h *HandoffResult) Plot(w io.Writer) error {
	const (
		width, height            = 760, 440
		left, right, top, bottom = 70, 240, 40, 50
	)
	type series struct {
		name, color, dash string
		pick              func(*HandoffRow) Summary
		route             string
	}
	all := []series{
		{"file: restore phase", "#c0392b", "", func(r *HandoffRow) Summary { return r.Handoff }, string(machine.RouteFile)},
		{"shared: share + adopt phases", "#2471a3", "", func(r *HandoffRow) Summary { return r.Handoff }, string(machine.RouteShared)},
		{"file: onebitd's own", "#c0392b", "6,4", func(r *HandoffRow) Summary { return r.Handling }, string(machine.RouteFile)},
		{"shared: onebitd's own", "#2471a3", "6,4", func(r *HandoffRow) Summary { return r.Handling }, string(machine.RouteShared)},
	}
	maxY := 0.0
	for _, s := range all {
		for _, n := range HandoffSizes {
			if row := h.Row(s.route, n); row != nil {
				sm := s.pick(row)
				maxY = math.Max(maxY, float64(max(sm.Median, sm.Hi))/1e6)
			}
		}
	}
	maxY = niceCeil(maxY)
	maxX := 14000.0
	px := func(tokens float64) float64 { return left + tokens/maxX*(width-left-right) }
	py := func(ms float64) float64 { return height - bottom - ms/maxY*(height-top-bottom) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15">Handoff time vs prompt length (median, 95 %% CI)</text>`+"\n", left)
	// axes and grid
	for i := 0; i <= 5; i++ {
		v := maxY * float64(i) / 5
		y := py(v)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, width-right, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, trimFloat(v))
	}
	for _, t := range []float64{0, 2000, 4000, 6000, 8000, 10000, 12000, 14000} {
		x := px(t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>`+"\n", x, top, x, height-bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%.0f</text>`+"\n", x, height-bottom+16, t)
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, height-bottom, width-right, height-bottom)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, top, left, height-bottom)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">prompt tokens</text>`+"\n", (left+width-right)/2, height-12)
	fmt.Fprintf(&b, `<text x="18" y="%d" text-anchor="middle" transform="rotate(-90 18 %d)">ms</text>`+"\n", (top+height-bottom)/2, (top+height-bottom)/2)
	for i, s := range all {
		var pts, whiskers []string
		for _, n := range HandoffSizes {
			if row := h.Row(s.route, n); row != nil {
				sm := s.pick(row)
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(float64(n)), py(float64(sm.Median)/1e6)))
				if sm.HasCI {
					x := px(float64(n))
					whiskers = append(whiskers, fmt.Sprintf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1"/>`,
						x, py(float64(sm.Lo)/1e6), x, py(float64(sm.Hi)/1e6), s.color))
				}
			}
		}
		if len(pts) == 0 {
			continue
		}
		dash := ""
		if s.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, s.dash)
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", s.color, dash, strings.Join(pts, " "))
		for _, p := range pts {
			xy := strings.Split(p, ",")
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", xy[0], xy[1], s.color)
		}
		for _, w := range whiskers {
			b.WriteString(w + "\n")
		}
		ly := top + 20 + 22*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", width-right+12, ly, width-right+40, ly, s.color, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", width-right+46, ly+4, xmlEscape(s.name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (1 for v <= 0).
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.3f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

func xmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "'", "&apos;", `"`, "&quot;").Replace(s)
}

// sortedUnits is the metric units in a stable order.
func sortedUnits(m map[string]float64) []string {
	us := make([]string, 0, len(m))
	for u := range m {
		us = append(us, u)
	}
	slices.Sort(us)
	return us
}
