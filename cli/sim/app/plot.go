package app

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
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
	// kubegpu's lines first, so that the baselines they overlap stay visible.
	order := make([]int, 0, len(sums))
	for pass := 0; pass < 2; pass++ {
		for i, s := range sums {
			isKubegpu := s.Policy == sim.PolicyKubegpu || s.Policy == sim.PolicyKubegpuOnline
			if isKubegpu == (pass == 0) {
				order = append(order, i)
			}
		}
	}
	for _, i := range order {
		s := sums[i]
		xys := meanCurve(s.Runs)
		if len(xys) == 0 {
			continue
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("plot %s: %w", s.Policy, err)
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(1.5)
		switch s.Policy {
		case sim.PolicyKubegpu:
			l.Color, l.Width = color.Black, vg.Points(2.5)
		case sim.PolicyKubegpuOnline:
			l.Color, l.Width = color.Black, vg.Points(1.5)
			l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s (%.2f%% unallocated at 130%%)", policyLabel(s.Policy), s.UnallocAt130.Mean), l)
	}
	// Below 80% every policy allocates all that arrives; the legend sits in
	// the empty upper-left corner.
	p.X.Min, p.Y.Min = 60, 80
	p.Y.Max = 100
	if err := p.Save(9*vg.Inch, 6*vg.Inch, path); err != nil {
		return fmt.Errorf("write plot: %w", err)
	}
	return nil
}

// palette has a distinct colour for each baseline (Tableau 10).
var palette = []color.Color{
	color.RGBA{R: 0x4e, G: 0x79, B: 0xa7, A: 0xff}, color.RGBA{R: 0x59, G: 0xa1, B: 0x4f, A: 0xff},
	color.RGBA{R: 0xb0, G: 0x7a, B: 0xa1, A: 0xff}, color.RGBA{R: 0xed, G: 0xc9, B: 0x48, A: 0xff},
	color.RGBA{R: 0x76, G: 0xb7, B: 0xb2, A: 0xff}, color.RGBA{R: 0xe1, G: 0x57, B: 0x59, A: 0xff},
	color.RGBA{R: 0xf2, G: 0x8e, B: 0x2b, A: 0xff}, color.RGBA{R: 0x9c, G: 0x75, B: 0x5f, A: 0xff},
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
