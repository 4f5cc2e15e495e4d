package main

import (
	"encoding/json"
	"os"
	"regexp"
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
		t.Errorf("%d panels, want the dashboard's 21", panels)
	}
}

// TestSelectorsNameTheirJob: every series the dashboard queries is selected
// with its job, so that a tenant's pod exporting series of kubegpu's names
// does not show.
func TestSelectorsNameTheirJob(t *testing.T) {
	b, err := build()
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard.Dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	exprs := 0
	for _, p := range d.Panels {
		if p.Panel == nil {
			continue
		}
		for _, target := range p.Panel.Targets {
			raw, err := json.Marshal(target)
			if err != nil {
				t.Fatal(err)
			}
			var q struct{ Expr string }
			if err := json.Unmarshal(raw, &q); err != nil {
				t.Fatal(err)
			}
			exprs++
			for _, m := range selector.FindAllStringSubmatch(q.Expr, -1) {
				if !jobMatcher.MatchString(m[2]) {
					t.Errorf("panel %q: %s selects no job, in %q", *p.Panel.Title, m[0], q.Expr)
				}
			}
		}
	}
	if exprs < 20 {
		t.Errorf("%d queries read, want the dashboard's", exprs)
	}
}

// selector finds a series selector in PromQL: a metric name kubegpu's
// components export and its label matchers, if any.
var selector = regexp.MustCompile(`\b((?:kubegpu_[a-z0-9_]+|leader_election_master_status|up)\b)(\{[^}]*\})?`)

// jobMatcher is a label matcher on job.
var jobMatcher = regexp.MustCompile(`[{,]\s*job\s*(=|=~)\s*"[^"]+"`)
