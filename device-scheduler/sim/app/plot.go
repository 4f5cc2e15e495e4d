package app

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/kubegpu/kubegpu/device-scheduler/sim"
)

// writePlot draws the mean allocation curve of each policy: GPU allocation
// (% of capacity) against arrived workload (% of capacity).
func writePlot(path, title string, sums []sim.Summary) error {
	p := plot.New()
	p.Title.Text = "GPU allocation vs arrived workload: " + title
	p.X.Label.Text = "Arrived workload (% of GPU capacity)"
	p.Y.Label.Text = "GPU allocation (% of capacity)"
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	ideal, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: 100, Y: 100}, {X: 130, Y: 100}})
	if err != nil {
		return err
	}
	ideal.Color = color.Gray{Y: 160}
	ideal.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
	p.Add(ideal)
	p.Legend.Add("ideal", ideal)
	for i, s := range sums {
		xys := meanCurve(s.Runs)
		if len(xys) == 0 {
			continue
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("plot %s: %w", s.Policy, err)
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		if s.Policy == sim.PolicyKubegpu {
			l.Width = vg.Points(2.5)
		}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s (%.2f%% unallocated at 130%%)", policyLabel(s.Policy), s.UnallocAt130.Mean), l)
	}
	p.X.Min, p.Y.Min = 60, 60
	p.Y.Max = 100
	if err := p.Save(9*vg.Inch, 6*vg.Inch, path); err != nil {
		return fmt.Errorf("write plot: %w", err)
	}
	return nil
}

// meanCurve averages the runs' curves where all of them have a value.
func meanCurve(runs []sim.Run) plotter.XYs {
	var xys plotter.XYs
	for a := 0; ; a++ {
		var sum float64
		n := 0
		for _, r := range runs {
			if v := r.AllocAt(a); !math.IsNaN(v) {
				sum += v
				n++
			}
		}
		if n == 0 || n < len(runs) {
			return xys
		}
		xys = append(xys, plotter.XY{X: float64(a), Y: sum / float64(n)})
	}
}
