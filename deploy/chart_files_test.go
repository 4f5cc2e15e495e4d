// Package deploy holds kubegpu's manifests; its test keeps the Helm
// chart's files/ the same as the manifests they copy.
package deploy

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "copy the manifests into the chart's files/")

// chartFiles maps each file of the chart's files/ to the manifest it
// copies. Copies, not symbolic links: helm warns of every link in a chart
// at each command, and a packaged chart holds no links.
var chartFiles = map[string]string{
	"kubegpu-alerts.yaml":         "prometheus/kubegpu-alerts.yaml",
	"kubegpu-capacity.yaml":       "../kube-scheduler/deploy/capacity.yaml",
	"kubegpu-deviceclass.yaml":    "dra/kubegpu-deviceclass.yaml",
	"kubegpu-metrics-reader.yaml": "prometheus/kubegpu-metrics-reader.yaml",
	"kubegpu-policies.yaml":       "admission/kubegpu-policies.yaml",
	"kubegpu-viewer.yaml":         "../cli/deploy/rbac.yaml",
}

// TestChartFiles: the chart's files/ are exactly the manifests, and
// nothing else (go test ./deploy -update copies them).
func TestChartFiles(t *testing.T) {
	dir := filepath.Join("helm", "kubegpu", "files")
	for name, src := range chartFiles {
		want, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if *update {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		info, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if !info.Mode().IsRegular() {
			t.Errorf("%s is not a regular file (%s): helm warns of links; run go test ./deploy -update", path, info.Mode())
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from %s: run go test ./deploy -update", path, src)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if _, ok := chartFiles[e.Name()]; !ok {
			t.Errorf("%s/%s is no copy of a manifest: add it to chartFiles", dir, e.Name())
		}
	}
}
