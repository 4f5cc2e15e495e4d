package admission

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kubegpu/kubegpu/internal/localcluster"
)

var update = flag.Bool("update", false, "rewrite the shipped policies in deploy/admission")

// TestShippedPolicies: deploy/admission holds what the templates generate
// (go test -update rewrites them), and every document parses.
func TestShippedPolicies(t *testing.T) {
	for name, gen := range map[string]func() ([]byte, error){
		"kubegpu-policies.yaml": Policies,
		"second-scheduler.yaml": func() ([]byte, error) { return SecondSchedulerPolicy("kubegpu-scheduler") },
	} {
		got, err := gen()
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("..", "..", "deploy", "admission", name)
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
