package metrics

import (
	"bytes"
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
	c.Inc()
	g.Add(1)
	g.Set(1)
	v.With("x").Inc()
	if c.Value() != 0 || g.Value() != 0 {
		t.Error("nil metrics have values")
	}
}

func TestHandler(t *testing.T) {
	srv := httptest.NewServer(New().Handler())
	defer srv.Close()
	for path, want := range map[string]string{"/metrics": "# TYPE kubegpu_crishim_connections gauge", "/healthz": "ok"} {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %d %q", path, resp.StatusCode, body)
		}
	}
}
