package sim

import (
	"bytes"
	"fmt"
	"html"
	"math"
	"strings"
)

// A small hand-written SVG plotter: axes with ticks, lines, points with labels, a legend. Output is
// plain SVG 1.1 that browsers and GitHub render; every number is formatted with a fixed precision so
// the bytes depend only on the data.

type plot struct {
	b                      bytes.Buffer
	w, h                   float64 // canvas
	left, right, top, bot  float64 // margins
	xmin, xmax, ymin, ymax float64
	legend                 int
}

func newPlot(title, xlabel, ylabel string, xmin, xmax, ymin, ymax float64) *plot {
	p := &plot{w: 900, h: 420, left: 70, right: 230, top: 40, bot: 55}
	p.xmin, p.xmax = xmin, xmax
	p.ymin, p.ymax = ymin, ymax
	if p.xmax <= p.xmin {
		p.xmax = p.xmin + 1
	}
	if p.ymax <= p.ymin {
		p.ymax = p.ymin + 1
	}
	fmt.Fprintf(&p.b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", p.w, p.h, p.w, p.h)
	fmt.Fprintf(&p.b, `<rect x="0" y="0" width="%.0f" height="%.0f" fill="white"/>`+"\n", p.w, p.h)
	fmt.Fprintf(&p.b, `<text x="%.1f" y="22" text-anchor="middle" font-size="15" font-weight="bold">%s</text>`+"\n", p.left+(p.w-p.left-p.right)/2, esc(title))
	p.axes(xlabel, ylabel)
	return p
}

func esc(s string) string { return html.EscapeString(s) }

func (p *plot) X(x float64) float64 {
	return p.left + (x-p.xmin)/(p.xmax-p.xmin)*(p.w-p.left-p.right)
}

func (p *plot) Y(y float64) float64 {
	return p.h - p.bot - (y-p.ymin)/(p.ymax-p.ymin)*(p.h-p.top-p.bot)
}

// ticks returns round tick values covering [lo, hi], about n of them.
func ticks(lo, hi float64, n int) []float64 {
	span := hi - lo
	if span <= 0 {
		return []float64{lo}
	}
	raw := span / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var t []float64
	for v := math.Ceil(lo/step-1e-9) * step; v <= hi+step*1e-9; v += step {
		t = append(t, math.Round(v/step)*step)
	}
	return t
}

// niceMax rounds a maximum up to a tick.
func niceMax(x float64) float64 {
	if x <= 0 {
		return 1
	}
	t := ticks(0, x, 5)
	step := x
	if len(t) > 1 {
		step = t[1] - t[0]
	}
	return math.Ceil(x/step-1e-9) * step
}

func fmtTick(v float64) string {
	if v == 0 {
		return "0"
	}
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

func (p *plot) axes(xlabel, ylabel string) {
	x0, x1, y0, y1 := p.X(p.xmin), p.X(p.xmax), p.Y(p.ymin), p.Y(p.ymax)
	for _, v := range ticks(p.ymin, p.ymax, 6) {
		y := p.Y(v)
		fmt.Fprintf(&p.b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e5e5e5"/>`+"\n", x0, y, x1, y)
		fmt.Fprintf(&p.b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-6, y+4, fmtTick(v))
	}
	for _, v := range ticks(p.xmin, p.xmax, 8) {
		x := p.X(v)
		fmt.Fprintf(&p.b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e5e5e5"/>`+"\n", x, y0, x, y1)
		fmt.Fprintf(&p.b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x, y0+18, fmtTick(v))
	}
	fmt.Fprintf(&p.b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#333"/>`+"\n", x0, y1, x1-x0, y0-y1)
	fmt.Fprintf(&p.b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", (x0+x1)/2, p.h-12, esc(xlabel))
	fmt.Fprintf(&p.b, `<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">%s</text>`+"\n", (y0+y1)/2, (y0+y1)/2, esc(ylabel))
}

// line draws a polyline through (xs[i], ys[i]); step draws it as a staircase.
func (p *plot) line(xs, ys []float64, color string, width float64, dash string, step bool) {
	var pts strings.Builder
	for i := range xs {
		if step && i > 0 {
			fmt.Fprintf(&pts, "%.1f,%.1f ", p.X(xs[i]), p.Y(ys[i-1]))
		}
		fmt.Fprintf(&pts, "%.1f,%.1f ", p.X(xs[i]), p.Y(ys[i]))
	}
	d := ""
	if dash != "" {
		d = fmt.Sprintf(` stroke-dasharray="%s"`, dash)
	}
	fmt.Fprintf(&p.b, `<polyline fill="none" stroke="%s" stroke-width="%.1f"%s points="%s"/>`+"\n", color, width, d, strings.TrimSpace(pts.String()))
}

// point draws a dot with a label above it (below with below set).
func (p *plot) point(x, y float64, color, label string, below bool) {
	fmt.Fprintf(&p.b, `<circle cx="%.1f" cy="%.1f" r="4.5" fill="%s" stroke="white"/>`+"\n", p.X(x), p.Y(y), color)
	dy := -8.0
	if below {
		dy = 17
	}
	if label != "" {
		fmt.Fprintf(&p.b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", p.X(x), p.Y(y)+dy, esc(label))
	}
}

// region shades a rectangle in data coordinates (clipped to the axes).
func (p *plot) region(x0, x1, y0, y1 float64, color, label string) {
	x0, x1 = max(x0, p.xmin), min(x1, p.xmax)
	y0, y1 = max(y0, p.ymin), min(y1, p.ymax)
	if x1 <= x0 || y1 <= y0 {
		return
	}
	fmt.Fprintf(&p.b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" fill-opacity="0.35"/>`+"\n",
		p.X(x0), p.Y(y1), p.X(x1)-p.X(x0), p.Y(y0)-p.Y(y1), color)
	if label != "" {
		fmt.Fprintf(&p.b, `<text x="%.1f" y="%.1f" fill="#2e7d32">%s</text>`+"\n", p.X(x0)+4, p.Y(y1)+14, esc(label))
	}
}

// key adds a legend entry drawn as a line, a dot ("dot") or a box ("box").
func (p *plot) key(color, dash, label, shape string) {
	x := p.w - p.right + 16
	y := p.top + 10 + float64(p.legend)*20
	p.legend++
	switch shape {
	case "dot":
		fmt.Fprintf(&p.b, `<circle cx="%.1f" cy="%.1f" r="4.5" fill="%s"/>`+"\n", x+11, y, color)
	case "box":
		fmt.Fprintf(&p.b, `<rect x="%.1f" y="%.1f" width="22" height="12" fill="%s" fill-opacity="0.35"/>`+"\n", x, y-6, color)
	default:
		d := ""
		if dash != "" {
			d = fmt.Sprintf(` stroke-dasharray="%s"`, dash)
		}
		fmt.Fprintf(&p.b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2.5"%s/>`+"\n", x, y, x+22, y, color, d)
	}
	fmt.Fprintf(&p.b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", x+28, y+4, esc(label))
}

func (p *plot) bytes() []byte {
	p.b.WriteString("</svg>\n")
	return p.b.Bytes()
}

// maxPoints bounds the points of a time series in a plot; longer series are bucketed.
const maxPoints = 720

// PoolSVG plots the pool's reserved cores against the load over time.
func PoolSVG(r *Result, title string) []byte {
	n := len(r.Pool)
	per := max(1, (n+maxPoints-1)/maxPoints)
	var ts, reserved, demand, load, static, oracle []float64
	top := 1.0
	for i := 0; i < n; i += per {
		j := min(n, i+per)
		var rs, dm, ld, st, or float64
		for k, s := range r.Pool[i:j] {
			rs = max(rs, s.Reserved) // a bucket shows its most cores: nothing paid for is hidden
			dm = max(dm, s.Demand)
			ld += s.Load
			st = max(st, s.Static)
			if i+k < len(r.Oracle) {
				or += r.Oracle[i+k]
			}
		}
		ld /= float64(j - i)
		or /= float64(j - i)
		ts = append(ts, r.Pool[i].T/60)
		reserved, demand, load, static = append(reserved, rs), append(demand, dm), append(load, ld), append(static, st)
		oracle = append(oracle, or)
		top = max(top, rs, dm, ld, st, or)
	}
	xmax := 1.0
	if n > 0 {
		xmax = r.Pool[n-1].T / 60
	}
	p := newPlot(title, "time (minutes)", "cores", 0, xmax, 0, niceMax(top*1.05))
	p.line(ts, static, "#9e9e9e", 1.5, "6 4", true)
	p.line(ts, demand, "#ef6c00", 1.5, "", true)
	p.line(ts, load, "#43a047", 1, "", false)
	p.line(ts, oracle, "#8e24aa", 1, "2 2", false)
	p.line(ts, reserved, "#1565c0", 2.5, "", true)
	p.key("#1565c0", "", "pool (reserved)", "")
	p.key("#ef6c00", "", "decider demand", "")
	p.key("#43a047", "", "mean load", "")
	p.key("#9e9e9e", "6 4", "static provisioning", "")
	p.key("#8e24aa", "2 2", "realistic oracle (runtimes)", "")
	return p.bytes()
}

// FrontierSVG plots cost (the whole service's, per GB summed, against the realistic oracle's)
// against mean slowdown, a point per value of the swept knob, with the goal region shaded.
func FrontierSVG(sw *Sweep, title string) []byte {
	var xs, ys []float64
	xmax, ymax := 1.5, 2.5
	for _, pt := range sw.Points {
		x, y := pt.Result.OracleRatio(), 100*pt.Result.Slowdown.Mean
		xs, ys = append(xs, x), append(ys, y)
		if !math.IsInf(x, 0) { // no step completed: drawn at the right edge
			xmax = max(xmax, x)
		}
		ymax = max(ymax, y)
	}
	right := niceMax(xmax * 1.1)
	for i, x := range xs {
		xs[i] = min(x, right)
	}
	p := newPlot(title, "core-seconds per GB summed, x the realistic oracle's", "mean step slowdown, %", 0, right, 0, niceMax(ymax*1.15))
	p.region(0, GoalOracle, 0, GoalSlowdown*100, "#a5d6a7", "goal")
	p.line(xs, ys, "#90a4ae", 1.5, "4 3", false)
	for i, pt := range sw.Points {
		p.point(xs[i], ys[i], "#c62828", pt.Value, i%2 == 1)
	}
	p.key("#c62828", "", "one run per "+sw.Knob, "dot")
	p.key("#a5d6a7", "", fmt.Sprintf("goal: <= %.2fx the oracle, <= %.0f%% mean", GoalOracle, GoalSlowdown*100), "box")
	return p.bytes()
}
