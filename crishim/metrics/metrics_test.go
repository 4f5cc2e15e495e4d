package metrics

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestWriteTextParses: what the shim writes is read back by Prometheus's
// own parser with the values it counted, label values escaped.
func TestWriteTextParses(t *testing.T) {
	m := New()
	m.Connections.Add(2)
	m.Connections.Add(-1)
	m.ConnectionsTotal.Inc()
	m.CreateContainer.With("rewritten").Inc()
	m.CreateContainer.With("rewritten").Inc()
	m.CreateContainer.With("PermissionDenied").Inc()
	m.CreateContainer.With("odd \"value\"\\\n").Inc()
	m.Publishes.With("ok").Inc()
	m.Devices.Set(8)
	m.Modules.Set(1)
	m.ModulesFailed.With("nvidia.so").Set(1)
	m.Refusals.With(string(ReasonDevicesHeld)).Inc()
	var buf bytes.Buffer
	if err := m.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(&buf)
	if err != nil {
		t.Fatalf("Prometheus cannot parse the output: %v\n%s", err, buf.String())
	}
	value := func(name, label string) float64 {
		f, ok := families[name]
		if !ok {
			t.Fatalf("no %s", name)
		}
		for _, m := range f.GetMetric() {
			if label == "" || (len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label) {
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
		t.Fatalf("no %s{%q}", name, label)
		return 0
	}
	for _, tt := range []struct {
		name, label string
		want        float64
	}{
		{"kubegpu_crishim_connections", "", 1},
		{"kubegpu_crishim_connections_total", "", 1},
		{"kubegpu_crishim_runtime_unreachable_total", "", 0},
		{"kubegpu_crishim_create_container_total", "rewritten", 2},
		{"kubegpu_crishim_create_container_total", "PermissionDenied", 1},
		{"kubegpu_crishim_create_container_total", "odd \"value\"\\\n", 1},
		{"kubegpu_crishim_inventory_publishes_total", "ok", 1},
		{"kubegpu_crishim_devices", "", 8},
		{"kubegpu_crishim_modules", "", 1},
		{"kubegpu_crishim_modules_failed", "nvidia.so", 1},
		{"kubegpu_crishim_create_container_refusals_total", "devices_held", 1},
		{"kubegpu_crishim_create_container_refusals_total", "other", 0},
	} {
		if got := value(tt.name, tt.label); got != tt.want {
			t.Errorf("%s{%q} = %v, want %v", tt.name, tt.label, got, tt.want)
		}
	}
	if value("process_resident_memory_bytes", "") <= 0 {
		t.Error("process_resident_memory_bytes is not positive")
	}
	if value("go_goroutines", "") <= 0 {
		t.Error("go_goroutines is not positive")
	}
}

// TestRefusalReasons: every reason is written from 0, so that rates and
// alerts see it before its first refusal, and the help text names them.
func TestRefusalReasons(t *testing.T) {
	var buf bytes.Buffer
	if err := New().WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(&buf)
	if err != nil {
		t.Fatal(err)
	}
	f := families["kubegpu_crishim_create_container_refusals_total"]
	written := map[string]bool{}
	for _, m := range f.GetMetric() {
		written[m.GetLabel()[0].GetValue()] = true
		if m.GetCounter().GetValue() != 0 {
			t.Errorf("%v: not 0 in new metrics", m)
		}
	}
	if len(written) != len(Reasons) {
		t.Errorf("reasons written: %v, want %v", written, Reasons)
	}
	for _, r := range Reasons {
		if !written[string(r)] || !strings.Contains(f.GetHelp(), string(r)) {
			t.Errorf("%s: written %v, help %q", r, written[string(r)], f.GetHelp())
		}
	}
}

// scraped is one histogram as Prometheus's parser reads it.
type scraped struct {
	les    []string // upper bounds, as written
	counts []uint64 // cumulative, per bound
	count  uint64
	sum    float64
}

// histograms writes m and returns the histograms of family name by label
// value, and the family's type, as Prometheus's parser reads them (a
// family without samples is not read: "" and none).
func histograms(t *testing.T, m *Shim, name string) (string, map[string]scraped) {
	t.Helper()
	var buf bytes.Buffer
	if err := m.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(&buf)
	if err != nil {
		t.Fatalf("Prometheus cannot parse the output: %v\n%s", err, text)
	}
	f, ok := families[name]
	if !ok {
		return "", nil
	}
	out := map[string]scraped{}
	for _, mt := range f.GetMetric() {
		h := mt.GetHistogram()
		s := scraped{count: h.GetSampleCount(), sum: h.GetSampleSum()}
		for _, b := range h.GetBucket() {
			s.les = append(s.les, strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64))
			s.counts = append(s.counts, b.GetCumulativeCount())
		}
		out[mt.GetLabel()[0].GetValue()] = s
	}
	return f.GetType().String(), out
}

const durationName = "kubegpu_crishim_create_container_rewrite_duration_seconds"

// TestHistogram: buckets are cumulative, le bounds inclusive, in seconds
// from 100µs to 10s, then +Inf; sum and count are those observed; each
// label value is its own histogram.
func TestHistogram(t *testing.T) {
	m := New()
	h := m.RewriteDuration.With("rewritten")
	for _, d := range []time.Duration{
		50 * time.Microsecond,  // le 0.0001
		100 * time.Microsecond, // le 0.0001: the bound is inclusive
		101 * time.Microsecond, // le 0.00025
		3 * time.Millisecond,   // le 0.005
		time.Second,            // le 1
		time.Minute,            // +Inf only
		-time.Second,           // counted as 0
	} {
		h.Observe(d)
	}
	m.RewriteDuration.With("PermissionDenied").Observe(20 * time.Millisecond)
	typ, got := histograms(t, m, durationName)
	if typ != "HISTOGRAM" || len(got) != 2 {
		t.Fatalf("%s: %s of %d results, want a histogram of 2", durationName, typ, len(got))
	}
	les := []string{"0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"}
	for _, tt := range []struct {
		result string
		counts []uint64
		sum    time.Duration
	}{
		{"rewritten", []uint64{3, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 7}, 50*time.Microsecond + 100*time.Microsecond + 101*time.Microsecond + 3*time.Millisecond + time.Second + time.Minute},
		{"PermissionDenied", []uint64{0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 20 * time.Millisecond},
	} {
		s := got[tt.result]
		if strings.Join(s.les, " ") != strings.Join(les, " ") {
			t.Errorf("%s: buckets %v, want %v", tt.result, s.les, les)
		}
		if fmt.Sprint(s.counts) != fmt.Sprint(tt.counts) {
			t.Errorf("%s: cumulative counts %v, want %v", tt.result, s.counts, tt.counts)
		}
		if want := tt.counts[len(tt.counts)-1]; s.count != want || math.Abs(s.sum-tt.sum.Seconds()) > 1e-12 {
			t.Errorf("%s: count %d, sum %v; want %d and %v", tt.result, s.count, s.sum, want, tt.sum.Seconds())
		}
		if h := m.RewriteDuration.With(tt.result); h.Count() != s.count || h.Sum() != tt.sum {
			t.Errorf("%s: Count() %d, Sum() %v", tt.result, h.Count(), h.Sum())
		}
	}
}

// TestHistogramConcurrent: observations from many goroutines, while
// scrapes run, are all counted, and every scrape parses with cumulative
// buckets and a +Inf bucket equal to its count.
func TestHistogramConcurrent(t *testing.T) {
	m := New()
	const workers, each = 8, 1000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				m.RewriteDuration.With("rewritten").Observe(time.Duration(w*each+i) * time.Microsecond)
			}
		})
	}
	check := func() {
		_, got := histograms(t, m, durationName)
		s, ok := got["rewritten"]
		if !ok {
			return // no observation yet
		}
		for i := 1; i < len(s.counts); i++ {
			if s.counts[i] < s.counts[i-1] {
				t.Fatalf("buckets not cumulative: %v", s.counts)
			}
		}
		if s.counts[len(s.counts)-1] != s.count {
			t.Fatalf("+Inf bucket %d, count %d", s.counts[len(s.counts)-1], s.count)
		}
	}
	for range 20 {
		check()
	}
	wg.Wait()
	check()
	n := workers * each
	want := time.Duration(n*(n-1)/2) * time.Microsecond
	if h := m.RewriteDuration.With("rewritten"); h.Count() != uint64(n) || h.Sum() != want {
		t.Errorf("count %d, sum %v; want %d and %v", h.Count(), h.Sum(), n, want)
	}
	_, got := histograms(t, m, durationName)
	if s := got["rewritten"]; s.count != uint64(n) || s.counts[len(s.counts)-2] != uint64(n) {
		t.Errorf("exposed count %d, le=10 bucket %d; want %d (every observation is under 10s)", s.count, s.counts[len(s.counts)-2], n)
	}
}

func TestNilMetricsDoNothing(t *testing.T) {
	var c *Counter
	var g *Gauge
	var v *CounterVec
	var gv *GaugeVec
	var h *Histogram
	var hv *HistogramVec
	h.Observe(time.Second)
	hv.With("x").Observe(time.Second)
	if h.Count() != 0 || h.Sum() != 0 || hv.With("x").Count() != 0 {
		t.Error("nil histograms have values")
	}
	gv.With("x").Set(1)
	c.Inc()
	g.Add(1)
	g.Set(1)
	v.With("x").Inc()
	if c.Value() != 0 || g.Value() != 0 {
		t.Error("nil metrics have values")
	}
}

// TestHandler: /metrics, and /healthz answering 503 with the health
// check's error while it fails.
func TestHandler(t *testing.T) {
	var health error
	srv := httptest.NewServer(New().Handler(func() error { return health }))
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(body)
	}
	for path, want := range map[string]string{"/metrics": "# TYPE kubegpu_crishim_connections gauge", "/healthz": "ok"} {
		if code, body := get(path); code != 200 || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d %q", path, code, body)
		}
	}
	health = errors.New("device module nvidia.so did not load: plugin was not built with this binary")
	if code, body := get("/healthz"); code != 503 || body != health.Error()+"\n" {
		t.Errorf("GET /healthz with a failed module: %d %q, want 503 and the error", code, body)
	}
	if code, _ := get("/metrics"); code != 200 {
		t.Errorf("GET /metrics with a failed module: %d, want 200", code)
	}
}
