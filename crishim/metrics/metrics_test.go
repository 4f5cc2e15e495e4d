package metrics

import (
	"bytes"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

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
	} {
		if got := value(tt.name, tt.label); got != tt.want {
			t.Errorf("%s{%q} = %v, want %v", tt.name, tt.label, got, tt.want)
		}
	}
	if value("process_resident_memory_bytes", "") <= 0 {
		t.Error("process_resident_memory_bytes is not positive")
	}
}

func TestNilMetricsDoNothing(t *testing.T) {
	var c *Counter
	var g *Gauge
	var v *CounterVec
	var gv *GaugeVec
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
