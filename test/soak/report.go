package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// report is the soak's outcome, written as OUT/report.json.
type report struct {
	Seed                int64          `json:"seed"`
	Duration            string         `json:"duration"`
	SimulatedNodes      int            `json:"simulatedNodes"`
	WorkloadsByKind     map[string]int `json:"workloadsByKind"`
	PodsScheduled       int            `json:"podsScheduled"`
	ChurnErrors         int            `json:"churnErrors"`
	Faults              int            `json:"faults"`
	FaultsByKind        map[string]int `json:"faultsByKind"`
	FaultEvents         []faultEvent   `json:"faultEvents"`
	FaultsSkipped       map[string]int `json:"faultsSkipped"`
	ReplicaRestarts     map[string]int `json:"replicaRestarts"`
	ReplicaFailedStarts map[string]int `json:"replicaFailedStarts"`
	// PendingJudgedSeconds is the time pending pods were judged for
	// stuck-pending (no disruptive fault under way or just over).
	PendingJudgedSeconds float64 `json:"pendingJudgedSeconds"`
	// RealNodeChecks counts the checks of the real node's containers and
	// RealNodeCheckFailures those that could not list them.
	RealNodeChecks        int                `json:"realNodeChecks"`
	RealNodeCheckFailures int                `json:"realNodeCheckFailures"`
	Violations            int                `json:"violations"`
	ViolationsKind        map[string]int     `json:"violationsByKind"`
	ViolationList         []violation        `json:"violationList"`
	CheckRounds           int                `json:"checkRounds"`
	Latency               map[string]latSum  `json:"schedulingLatency"`
	Growth                []growth           `json:"growth"`
	Thresholds            map[string]float64 `json:"thresholds"`

	series []*series
	start  time.Time
}

// latSum summarises the scheduling latencies of one condition (calm, or
// a fault kind under way or just over).
type latSum struct {
	Pods  int     `json:"pods"`
	P50ms float64 `json:"p50ms"`
	P99ms float64 `json:"p99ms"`
}

// report assembles the report; violations for growing components are
// counted here, judged over the second half of the churn (the drain
// after it is quiet).
func (c *checker) report(o options, ch *churn, f *faults, start time.Time, elapsed time.Duration) *report {
	injected, skipped := f.counts()
	growths := c.samples.growths(start.Add(o.duration/2), start.Add(o.duration))
	for _, g := range growths {
		if g.Grows {
			c.violate("growth", g.Component, "memory %+.1f MiB/h (median %.0f MiB), goroutines %+.1f/h over the second half of the run (%d processes)",
				g.RSSSlopeMiBPerHour, g.MedianRSSMiB, g.GoroutineSlopePerHour, g.Processes)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ch.mu.Lock()
	defer ch.mu.Unlock()
	r := &report{Seed: o.seed, Duration: elapsed.Round(time.Second).String(), SimulatedNodes: o.nodes,
		WorkloadsByKind: ch.created, PodsScheduled: c.scheduled, ChurnErrors: ch.errors,
		FaultsByKind: injected, FaultsSkipped: skipped, FaultEvents: f.eventList(), ReplicaRestarts: map[string]int{}, ReplicaFailedStarts: map[string]int{},
		PendingJudgedSeconds: c.calmFor.Seconds(), RealNodeChecks: c.realRounds, RealNodeCheckFailures: c.realFailures,
		ViolationsKind: c.byKind, ViolationList: c.violations, CheckRounds: c.rounds, Latency: map[string]latSum{}, Growth: growths,
		Thresholds: map[string]float64{"stuckAfterSeconds": stuckAfter.Seconds(), "leakAfterSeconds": leakAfter.Seconds(),
			"rssSlopeMiBPerHour": slopeRSSPerHour >> 20, "rssSlopeFractionPerHour": slopeRSSFraction,
			"goroutineSlopePerHour": slopeGoroutinesPerHour, "judgeSpanMinutes": judgeSpan.Minutes()},
		start: c.start}
	for _, rp := range c.s.replicas {
		r.ReplicaRestarts[rp.name], r.ReplicaFailedStarts[rp.name] = rp.restarts()
	}
	for _, n := range injected {
		r.Faults += n
	}
	for _, n := range c.byKind {
		r.Violations += n
	}
	byCond := map[string][]time.Duration{}
	for _, l := range c.latencies {
		if len(l.faults) == 0 {
			byCond["calm"] = append(byCond["calm"], l.d)
		}
		for _, k := range l.faults {
			byCond[k] = append(byCond[k], l.d)
		}
	}
	for k, ds := range byCond {
		slices.Sort(ds)
		r.Latency[k] = latSum{Pods: len(ds), P50ms: pct(ds, 0.50), P99ms: pct(ds, 0.99)}
	}
	c.samples.mu.Lock()
	for _, s := range c.samples.series {
		r.series = append(r.series, s)
	}
	c.samples.mu.Unlock()
	return r
}

func pct(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	return float64(ds[min(len(ds)-1, int(q*float64(len(ds))))].Microseconds()) / 1000
}

// write writes report.json and soak.png into dir, and a summary table to
// stdout.
func (r *report) write(dir string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Print(r.table())
	return r.plot(filepath.Join(dir, "soak.png"))
}

// table is the report as the README's Markdown table.
func (r *report) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n| Soak (seed %d, %s, %d simulated nodes + 1 real) | |\n|---|---|\n", r.Seed, r.Duration, r.SimulatedNodes)
	fmt.Fprintf(&b, "| Pods scheduled | %d |\n| Violations | %d |\n| Pending pods judged for | %.0f s (no disruptive fault) |\n",
		r.PodsScheduled, r.Violations, r.PendingJudgedSeconds)
	kinds := make([]string, 0, len(r.FaultsByKind))
	for k := range r.FaultsByKind {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, r.FaultsByKind[k]))
	}
	fmt.Fprintf(&b, "| Faults (%d) | %s |\n", r.Faults, strings.Join(parts, ", "))
	conds := make([]string, 0, len(r.Latency))
	for k := range r.Latency {
		conds = append(conds, k)
	}
	sort.Slice(conds, func(i, j int) bool { return conds[i] == "calm" || (conds[j] != "calm" && conds[i] < conds[j]) })
	for _, k := range conds {
		l := r.Latency[k]
		fmt.Fprintf(&b, "| Scheduling latency, %s (%d pods) | p50 %.0f ms, p99 %.0f ms |\n", k, l.Pods, l.P50ms, l.P99ms)
	}
	for _, g := range r.Growth {
		if g.Judged {
			fmt.Fprintf(&b, "| %s, second half (%d processes, %.0f min) | median %.0f MiB, %+.1f MiB/h, %+.1f goroutines/h |\n",
				g.Component, g.Processes, g.Minutes, g.MedianRSSMiB, g.RSSSlopeMiBPerHour, g.GoroutineSlopePerHour)
		}
	}
	return b.String()
}

// plot draws each process's resident memory over the run, with the
// faults' starts marked along the bottom.
func (r *report) plot(path string) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("kubegpu soak, seed %d: resident memory; faults along the bottom", r.Seed)
	p.X.Label.Text = "minutes"
	p.Y.Label.Text = "resident memory (MiB)"
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	sort.Slice(r.series, func(i, j int) bool {
		if r.series[i].component != r.series[j].component {
			return r.series[i].component < r.series[j].component
		}
		return r.series[i].points[0].at.Before(r.series[j].points[0].at)
	})
	colors := map[string]color.Color{}
	palette := []color.Color{color.RGBA{R: 0x4e, G: 0x79, B: 0xa7, A: 0xff}, color.RGBA{R: 0xe1, G: 0x57, B: 0x59, A: 0xff},
		color.RGBA{R: 0x59, G: 0xa1, B: 0x4f, A: 0xff}, color.RGBA{R: 0xf2, G: 0x8e, B: 0x2b, A: 0xff}}
	for _, s := range r.series {
		xys := make(plotter.XYs, len(s.points))
		for i, pt := range s.points {
			xys[i] = plotter.XY{X: pt.at.Sub(r.start).Minutes(), Y: pt.rss / (1 << 20)}
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return err
		}
		col, ok := colors[s.component]
		if !ok {
			col = palette[len(colors)%len(palette)]
			colors[s.component] = col
			p.Legend.Add(s.component, l)
		}
		l.Color, l.Width = col, vg.Points(1.5)
		p.Add(l)
	}
	var marks plotter.XYs
	for _, e := range r.FaultEvents {
		marks = append(marks, plotter.XY{X: e.Start.Sub(r.start).Minutes(), Y: 0})
	}
	if len(marks) > 0 {
		sc, err := plotter.NewScatter(marks)
		if err != nil {
			return err
		}
		sc.Color = color.Black
		p.Add(sc)
		p.Legend.Add("fault", sc)
	}
	p.Y.Min = 0
	return p.Save(10*vg.Inch, 5*vg.Inch, path)
}
