package main

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

const committed = "../../deploy/grafana/kubegpu.json"

// TestCommitted: deploy/grafana/kubegpu.json is what this program builds
// (go run . -out ../../deploy/grafana/kubegpu.json rewrites it), and it
// reads back as a Grafana dashboard whose panels all query Prometheus.
func TestCommitted(t *testing.T) {
	want, err := build()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(committed)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("%s is not what hack/dashboard builds: run go run . -out %s", committed, committed)
	}
	plugins.RegisterDefaultPlugins()
	var d dashboard.Dashboard
	if err := json.Unmarshal(got, &d); err != nil {
		t.Fatal(err)
	}
	panels := 0
	for _, p := range d.Panels {
		if p.Panel == nil {
			continue // a row
		}
		panels++
		if len(p.Panel.Targets) == 0 {
			t.Errorf("panel %q has no query", *p.Panel.Title)
		}
	}
	if panels < 15 {
		t.Errorf("%d panels, want the dashboard's 20", panels)
	}
}
