package main

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// logTicks marks a log axis at 1, 2 and 5 times the powers of ten, with
// the other integer multiples as minor ticks.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for k := int(math.Floor(math.Log10(lo))); k <= int(math.Ceil(math.Log10(hi))); k++ {
		for m := 1; m < 10; m++ {
			v := float64(m) * math.Pow10(k)
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = strconv.FormatFloat(v, 'g', -1, 64)
			}
			ticks = append(ticks, t)
		}
	}
	if len(ticks) == 0 {
		ticks = append(ticks, plot.Tick{Value: lo, Label: strconv.FormatFloat(lo, 'g', 3, 64)})
	}
	return ticks
}

// cdfPoints bounds the points of one CDF line.
const cdfPoints = 400

// msec converts d to milliseconds, at least a microsecond (log axes
// cannot show 0).
func msec(d time.Duration) float64 { return math.Max(float64(d)/1e6, 1e-3) }

// PlotTTFTCDF writes a PNG of every policy's TTFT CDF at one level, TTFT
// on a log axis; a contended run's legend entry is marked "(!)" (see
// policyLabel; Report.ttftCDFTitle names them in the title).
func PlotTTFTCDF(path, title string, l Level) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "time to first token (ms, wall clock, log scale)"
	p.Y.Label.Text = "fraction of requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = logTicks{}
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top = false
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	lines := 0
	for i, s := range l.Summaries {
		n := len(s.TTFTs)
		if n == 0 {
			continue
		}
		step := max(1, n/cdfPoints)
		var xys plotter.XYs
		for j := 0; j < n; j += step {
			xys = append(xys, plotter.XY{X: msec(s.TTFTs[j]), Y: float64(j+1) / float64(n)})
		}
		if last := n - 1; last%step != 0 {
			xys = append(xys, plotter.XY{X: msec(s.TTFTs[last]), Y: 1})
		}
		line, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("plot %s: %w", s.Policy, err)
		}
		line.Color = plotutil.Color(i)
		line.Dashes = plotutil.Dashes(i)
		line.Width = vg.Points(1.5)
		p.Add(line)
		p.Legend.Add(policyLabel(s), line)
		lines++
	}
	if lines == 0 {
		return fmt.Errorf("plot %s: no completed request", path)
	}
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}

// PlotSweep writes a PNG of each policy's mean TTFT against offered load.
func PlotSweep(path, title string, levels []Level, policies []string) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "offered load (x the trace's rate at engine speed)"
	p.Y.Label.Text = "mean time to first token (ms, wall clock, log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = logTicks{}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	for i, name := range policies {
		var xys plotter.XYs
		for _, l := range levels {
			if s, ok := l.policy(name); ok && s.Completed > 0 {
				xys = append(xys, plotter.XY{X: l.Load, Y: msec(s.TTFTMean)})
			}
		}
		if len(xys) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return fmt.Errorf("plot %s: %w", name, err)
		}
		line.Color, points.Color = plotutil.Color(i), plotutil.Color(i)
		line.Dashes = plotutil.Dashes(i)
		points.Shape = plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add(name, line, points)
	}
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}
