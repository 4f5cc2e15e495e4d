package main

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"
)

// sampleEvery is how often the components' memory and goroutines are read.
const sampleEvery = 15 * time.Second

// Growth thresholds: over the second half of the run, a component's
// resident memory may not grow faster than slopeRSSPerHour and by more
// than slopeRSSFraction of its median per hour, nor its goroutines faster
// than slopeGoroutinesPerHour; a component is judged only when its
// processes' samples there span at least judgeSpan.
const (
	slopeRSSPerHour        = 64 << 20
	slopeRSSFraction       = 0.25
	slopeGoroutinesPerHour = 100
	judgeSpan              = 10 * time.Minute
)

// sample is one reading of a process.
type sample struct {
	at         time.Time
	rss        float64
	goroutines float64 // -1 when unread
}

// series are the readings of one process (a component's incarnation).
type series struct {
	component string
	pid       int
	points    []sample
}

type samples struct {
	mu     sync.Mutex
	series map[string]*series // by component and PID
}

func newSamples() *samples { return &samples{series: map[string]*series{}} }

// add records a reading of a process; a replica's readings as leader and
// as standby are series of their own (a standby that takes the lease
// starts its scheduling loop, a step up that is not growth).
func (s *samples) add(component string, pid int, leader bool, rss, goroutines float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := fmt.Sprintf("%s/%d/%v", component, pid, leader)
	sr := s.series[key]
	if sr == nil {
		sr = &series{component: component, pid: pid}
		s.series[key] = sr
	}
	sr.points = append(sr.points, sample{at: time.Now(), rss: rss, goroutines: goroutines})
}

// run reads every replica's and the real node's shim's memory (from /proc)
// and goroutines (from their /metrics) every sampleEvery.
func (s *samples) run(ctx context.Context, c *checker) {
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	for {
		for _, r := range c.s.replicas {
			pid, _ := r.process()
			if pid == 0 {
				continue
			}
			mem, err := rss(pid)
			if err != nil {
				continue
			}
			m, err := r.scrape(ctx, "go_goroutines", leaderMetric)
			if err != nil {
				continue // its role unknown: no reading
			}
			g, ok := m["go_goroutines"]
			if !ok {
				g = -1
			}
			s.add("kubegpu-scheduler-"+r.name, pid, m[leaderMetric] == 1, mem, g)
		}
		if pid := c.s.real.ShimPid(); pid != 0 {
			if mem, err := rss(pid); err == nil {
				g := -1.0
				client := &http.Client{Timeout: 5 * time.Second}
				if m, err := scrape(ctx, client, "http://"+c.s.realMetrics+"/metrics", "go_goroutines"); err == nil {
					if v, ok := m["go_goroutines"]; ok {
						g = v
					}
				}
				s.add("kubegpu-crishim", pid, false, mem, g)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// warmUpSamples is how long after its start a process's samples are left
// out of its growth: caches fill and informers list then.
const warmUpSamples = 2 * time.Minute

// growth is the judgement of one component over the second half of the
// run.
type growth struct {
	Component string `json:"component"`
	// Processes is the number of the component's processes (it restarts
	// with faults) with samples in the second half.
	Processes int `json:"processes"`
	Samples   int `json:"samples"`
	// Minutes is the time the slopes span: the sum over processes.
	Minutes      float64 `json:"minutes"`
	MedianRSSMiB float64 `json:"medianRSSMiB"`
	// The slopes are pooled within processes: each process's samples
	// after its warm-up, about its own mean, so that a restart (memory
	// back to its start) is not counted as a fall.
	RSSSlopeMiBPerHour    float64 `json:"rssSlopeMiBPerHour"`
	GoroutineSlopePerHour float64 `json:"goroutineSlopePerHour"`
	Judged                bool    `json:"judged"`
	Grows                 bool    `json:"grows"`
}

// growths judges every component on its samples from mid to end.
func (s *samples) growths(mid, end time.Time) []growth {
	s.mu.Lock()
	defer s.mu.Unlock()
	byComponent := map[string][][]sample{}
	for _, sr := range s.series {
		if len(sr.points) == 0 {
			continue
		}
		from := sr.points[0].at.Add(warmUpSamples)
		var pts []sample
		for _, p := range sr.points {
			if !p.at.Before(mid) && !p.at.Before(from) && !p.at.After(end) {
				pts = append(pts, p)
			}
		}
		if len(pts) >= 2 {
			byComponent[sr.component] = append(byComponent[sr.component], pts)
		}
	}
	var out []growth
	for comp, groups := range byComponent {
		g := growth{Component: comp, Processes: len(groups)}
		var rssv []float64
		for _, pts := range groups {
			g.Samples += len(pts)
			g.Minutes += pts[len(pts)-1].at.Sub(pts[0].at).Minutes()
			for _, p := range pts {
				rssv = append(rssv, p.rss)
			}
		}
		sort.Float64s(rssv)
		g.MedianRSSMiB = rssv[len(rssv)/2] / (1 << 20)
		g.RSSSlopeMiBPerHour = pooledSlope(groups, func(p sample) (float64, bool) { return p.rss, true }) / (1 << 20)
		g.GoroutineSlopePerHour = pooledSlope(groups, func(p sample) (float64, bool) { return p.goroutines, p.goroutines >= 0 })
		g.Judged = g.Minutes >= judgeSpan.Minutes()
		g.Grows = g.Judged && ((g.RSSSlopeMiBPerHour*(1<<20) > slopeRSSPerHour && g.RSSSlopeMiBPerHour > slopeRSSFraction*g.MedianRSSMiB) ||
			g.GoroutineSlopePerHour > slopeGoroutinesPerHour)
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Component < out[j].Component })
	return out
}

// pooledSlope is the least-squares slope of value over time, per hour,
// pooled within groups: each group about its own means.
func pooledSlope(groups [][]sample, value func(sample) (float64, bool)) float64 {
	var sxy, sxx float64
	for _, pts := range groups {
		var n, mx, my float64
		t0 := pts[0].at
		for _, p := range pts {
			if v, ok := value(p); ok {
				n++
				mx += p.at.Sub(t0).Hours()
				my += v
			}
		}
		if n < 2 {
			continue
		}
		mx, my = mx/n, my/n
		for _, p := range pts {
			if v, ok := value(p); ok {
				x := p.at.Sub(t0).Hours() - mx
				sxy += x * (v - my)
				sxx += x * x
			}
		}
	}
	if sxx == 0 {
		return 0
	}
	return sxy / sxx
}
