package rewrite

import (
	"bytes"
	"fmt"
	"io"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"
)

// Allowlist file format.
const (
	AllowlistAPIVersion = "crishim.kubegpu.io/v1alpha1"
	AllowlistKind       = "GPUAllowlist"
)

// Bounds on an allowlist file.
const (
	maxAllowlistBytes   = 64 << 10
	MaxAllowlistEntries = 256
)

// AllowlistFile is the allowlist as the operator writes it:
//
//	apiVersion: crishim.kubegpu.io/v1alpha1
//	kind: GPUAllowlist
//	entries:
//	- namespace: gpu-monitoring
//	  podSelector:
//	    matchLabels:
//	      app.kubernetes.io/name: dcgm-exporter
type AllowlistFile struct {
	APIVersion string           `json:"apiVersion"`
	Kind       string           `json:"kind"`
	Entries    []AllowlistEntry `json:"entries"`
}

// AllowlistEntry exempts the pods of one namespace, or those of them whose
// labels match PodSelector.
type AllowlistEntry struct {
	Namespace   string                `json:"namespace"`
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`
}

// Allowlist is the node's list of pods exempt from the device guard: their
// containers keep the devices, mounts, CDI devices and NVIDIA variables
// they ask for (a monitoring agent's NVIDIA_VISIBLE_DEVICES=all), and may
// be privileged. The zero Allowlist exempts nothing.
type Allowlist struct {
	entries []allowed
}

type allowed struct {
	namespace string
	selector  labels.Selector // nil: every pod of the namespace
	source    string          // the entry, for logs
}

// LoadAllowlist reads an allowlist file; the empty path is the empty list.
func LoadAllowlist(path string) (Allowlist, error) {
	if path == "" {
		return Allowlist{}, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return Allowlist{}, fmt.Errorf("read GPU allowlist: %w", err)
	}
	defer f.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(f, maxAllowlistBytes+1)); err != nil {
		return Allowlist{}, fmt.Errorf("read GPU allowlist %s: %w", path, err)
	}
	if buf.Len() > maxAllowlistBytes {
		return Allowlist{}, fmt.Errorf("GPU allowlist %s: larger than %d bytes", path, maxAllowlistBytes)
	}
	a, err := ParseAllowlist(buf.Bytes())
	if err != nil {
		return Allowlist{}, fmt.Errorf("GPU allowlist %s: %w", path, err)
	}
	return a, nil
}

// ParseAllowlist parses an allowlist file's content (YAML or JSON). Unknown
// fields, namespaces that are not DNS labels and invalid selectors are
// errors.
func ParseAllowlist(data []byte) (Allowlist, error) {
	var f AllowlistFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return Allowlist{}, fmt.Errorf("decode: %w", err)
	}
	if f.APIVersion != AllowlistAPIVersion || f.Kind != AllowlistKind {
		return Allowlist{}, fmt.Errorf("want apiVersion %s and kind %s, got %q and %q", AllowlistAPIVersion, AllowlistKind, f.APIVersion, f.Kind)
	}
	if len(f.Entries) > MaxAllowlistEntries {
		return Allowlist{}, fmt.Errorf("%d entries, at most %d", len(f.Entries), MaxAllowlistEntries)
	}
	var a Allowlist
	for i, e := range f.Entries {
		if errs := validation.IsDNS1123Label(e.Namespace); len(errs) > 0 {
			return Allowlist{}, fmt.Errorf("entry %d: namespace %q: %s", i, e.Namespace, errs[0])
		}
		entry := allowed{namespace: e.Namespace, source: "namespace " + e.Namespace}
		if e.PodSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(e.PodSelector)
			if err != nil {
				return Allowlist{}, fmt.Errorf("entry %d (namespace %s): podSelector: %w", i, e.Namespace, err)
			}
			if sel.Empty() {
				return Allowlist{}, fmt.Errorf("entry %d (namespace %s): an empty podSelector selects every pod; leave it out to say so", i, e.Namespace)
			}
			entry.selector = sel
			entry.source += ", pods " + sel.String()
		}
		a.entries = append(a.entries, entry)
	}
	return a, nil
}

// Len is the number of entries.
func (a Allowlist) Len() int { return len(a.entries) }

// Match returns the entry that exempts the pod of sandbox config sb (its
// namespace and labels, as kubelet passes them), or false.
func (a Allowlist) Match(sb *runtimeapi.PodSandboxConfig) (string, bool) {
	ns := sb.GetMetadata().GetNamespace()
	for _, e := range a.entries {
		if e.namespace != ns {
			continue
		}
		if e.selector == nil || e.selector.Matches(labels.Set(sb.GetLabels())) {
			return e.source, true
		}
	}
	return "", false
}
