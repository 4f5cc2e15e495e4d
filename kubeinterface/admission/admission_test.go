package admission

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kubegpu/kubegpu/internal/localcluster"
)

var update = flag.Bool("update", false, "rewrite the shipped policies in deploy/admission and the chart")

const chartSecondScheduler = "helm/kubegpu/templates/admission-second-scheduler.yaml"

// TestShippedPolicies: deploy/admission holds what the templates generate
// (go test -update rewrites them), and every document parses.
func TestShippedPolicies(t *testing.T) {
	for name, gen := range map[string]func() ([]byte, error){
		"admission/kubegpu-policies.yaml": Policies,
		// The chart's copy (deploy/chart_files_test.go checks it too).
		"helm/kubegpu/files/kubegpu-policies.yaml": Policies,
		"admission/second-scheduler.yaml":          func() ([]byte, error) { return SecondSchedulerPolicy("kubegpu-scheduler") },
		// The chart's copy names the scheduler its values name.
		chartSecondScheduler: HelmSecondSchedulerPolicy,
	} {
		got, err := gen()
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("..", "..", "deploy", name)
		if *update {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s is not what the templates generate: run go test ./kubeinterface/admission -update", path)
		}
		if name == chartSecondScheduler {
			continue // a Helm template: the chart's tests render it
		}
		objs, err := localcluster.ReadManifest(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if _, err := yaml.Marshal(o.Object); err != nil {
				t.Errorf("%s: %s: %v", path, o.GetName(), err)
			}
		}
	}
}
