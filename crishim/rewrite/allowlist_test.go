package rewrite

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const exampleAllowlist = `apiVersion: crishim.kubegpu.io/v1alpha1
kind: GPUAllowlist
entries:
- namespace: gpu-monitoring
  podSelector:
    matchLabels:
      app.kubernetes.io/name: dcgm-exporter
- namespace: node-feature-discovery
`

func TestAllowlist(t *testing.T) {
	path := filepath.Join(t.TempDir(), "allowlist.yaml")
	if err := os.WriteFile(path, []byte(exampleAllowlist), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := LoadAllowlist(path)
	if err != nil {
		t.Fatal(err)
	}
	sb := func(ns string, labels map[string]string) *runtimeapi.PodSandboxConfig {
		return &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: ns, Name: "p"}, Labels: labels}
	}
	for _, tt := range []struct {
		sb   *runtimeapi.PodSandboxConfig
		want bool
	}{
		{sb("gpu-monitoring", map[string]string{"app.kubernetes.io/name": "dcgm-exporter"}), true},
		{sb("gpu-monitoring", map[string]string{"app.kubernetes.io/name": "miner"}), false},
		{sb("gpu-monitoring", nil), false},
		{sb("node-feature-discovery", nil), true},
		{sb("tenant", map[string]string{"app.kubernetes.io/name": "dcgm-exporter"}), false},
	} {
		if entry, got := a.Match(tt.sb); got != tt.want {
			t.Errorf("Match(%s, %v) = %v (%s), want %v", tt.sb.Metadata.Namespace, tt.sb.Labels, got, entry, tt.want)
		}
	}
	if empty, err := LoadAllowlist(""); err != nil || empty.Len() != 0 {
		t.Errorf("no file: %v, %d entries", err, empty.Len())
	}
}

func TestParseAllowlistErrors(t *testing.T) {
	header := "apiVersion: crishim.kubegpu.io/v1alpha1\nkind: GPUAllowlist\n"
	for _, tt := range []struct{ data, want string }{
		{"kind: GPUAllowlist\nentries: []\n", "want apiVersion"},
		{header + "entries:\n- namespace: Bad_NS\n", `namespace "Bad_NS"`},
		{header + "entries:\n- namespace: a\n  podSelector: {}\n", "empty podSelector"},
		{header + "entries:\n- namespace: a\n  podSelector: {matchExpressions: [{key: k, operator: Bogus}]}\n", "podSelector"},
		{header + "entries:\n- namespace: a\n  labels: {a: b}\n", "unknown field"},
		{header + "entries: " + strings.Repeat("x", 10), "decode"},
		{header + "entries:\n" + strings.Repeat("- namespace: a\n", MaxAllowlistEntries+1), "at most"},
	} {
		if _, err := ParseAllowlist([]byte(tt.data)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseAllowlist(%.60q) = %v, want an error with %q", tt.data, err, tt.want)
		}
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, []byte(header+"#"+strings.Repeat("x", maxAllowlistBytes)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadAllowlist(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("big file: %v", err)
	}
}

// FuzzParseAllowlist: any file gives an allowlist or an error, never a
// panic, and never more entries than the bound.
func FuzzParseAllowlist(f *testing.F) {
	f.Add([]byte(exampleAllowlist))
	f.Add([]byte(`{"apiVersion":"crishim.kubegpu.io/v1alpha1","kind":"GPUAllowlist","entries":[{"namespace":"a","podSelector":{"matchExpressions":[{"key":"k","operator":"In","values":["v"]}]}}]}`))
	f.Add([]byte("entries: [[[["))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := ParseAllowlist(data)
		if err == nil && a.Len() > MaxAllowlistEntries {
			t.Fatalf("%d entries", a.Len())
		}
		if err == nil {
			a.Match(&runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "a"}, Labels: map[string]string{"k": "v"}})
		}
	})
}
