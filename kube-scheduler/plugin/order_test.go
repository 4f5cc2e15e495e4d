package plugin

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	schedcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
	"sigs.k8s.io/yaml"
)

// orderStub stands in for the plugin where only its extension points
// matter: the framework orders plugins by the interfaces they implement.
type orderStub struct{}

func (orderStub) Name() string { return Name }
func (orderStub) Filter(context.Context, fwk.CycleState, *corev1.Pod, fwk.NodeInfo) *fwk.Status {
	return nil
}
func (orderStub) Bind(context.Context, fwk.CycleState, *corev1.Pod, string) *fwk.Status { return nil }

// kubeGPUProfile is the default profile with the plugin added and nothing
// reordered or disabled.
const kubeGPUProfile = `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- plugins:
    multiPoint:
      enabled:
      - name: KubeGPU
`

// TestShippedPluginOrder: the shipped configurations (and the Helm chart's,
// as its golden file holds it), read and defaulted as kube-scheduler reads
// them, run the upstream filters in their default order with KubeGPU's
// Filter moved right after NodeAffinity (before NodeResourcesFit),
// DynamicResources replaced by its facade, and KubeGPU's Bind before
// DefaultBinder.
func TestShippedPluginOrder(t *testing.T) {
	schedmetrics.Register() // the framework counts plugins' calls
	defaults, _ := pluginOrder(t, []byte(kubeGPUProfile))
	want := slices.DeleteFunc(slices.Clone(defaults), func(n string) bool { return n == Name })
	at := slices.Index(want, "NodeAffinity") + 1
	want = slices.Insert(want, at, Name)
	if at == 0 || slices.Index(want, "NodeResourcesFit") < at {
		t.Fatalf("default filters %v: no NodeAffinity, or NodeResourcesFit before it", defaults)
	}
	// DynamicResources behind its facade, last (after the defaults).
	if !slices.Contains(want, "DynamicResources") {
		t.Fatalf("default filters %v: no DynamicResources", defaults)
	}
	want = append(slices.DeleteFunc(want, func(n string) bool { return n == "DynamicResources" }), FacadeName)
	configs := map[string][]byte{}
	for _, name := range []string{"kubegpu-scheduler.yaml", "second-scheduler.yaml"} {
		data, err := os.ReadFile(filepath.Join("..", "config", name))
		if err != nil {
			t.Fatal(err)
		}
		configs[name] = data
	}
	configs["helm"] = helmSchedulerConfig(t)
	for name, data := range configs {
		t.Run(name, func(t *testing.T) {
			filters, binds := pluginOrder(t, data)
			if !slices.Equal(filters, want) {
				t.Errorf("filters run in the order %v, want %v", filters, want)
			}
			if len(binds) == 0 || binds[0] != Name {
				t.Errorf("bind plugins %v, want %s first", binds, Name)
			}
		})
	}
}

// pluginOrder builds the first profile of a scheduler configuration as
// kube-scheduler does, with a stand-in for the plugin, and returns its
// filter and bind plugins in the order they run.
func pluginOrder(t *testing.T, data []byte) (filters, binds []string) {
	t.Helper()
	fw, _ := buildProfile(t, data)
	for _, p := range fw.ListPlugins().Filter.Enabled {
		filters = append(filters, p.Name)
	}
	for _, p := range fw.ListPlugins().Bind.Enabled {
		binds = append(binds, p.Name)
	}
	return filters, binds
}

// buildProfile builds the first profile of a scheduler configuration as
// kube-scheduler does, with a stand-in for the plugin, and returns it and
// the handle the plugin was given.
func buildProfile(t *testing.T, data []byte) (framework.Framework, fwk.Handle) {
	t.Helper()
	obj, _, err := scheme.Codecs.UniversalDecoder().Decode(data, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := obj.(*config.KubeSchedulerConfiguration)
	registry := plugins.NewInTreeRegistry()
	var handle fwk.Handle
	if err := registry.Register(Name, func(_ context.Context, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		handle = h
		return orderStub{}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := registry.Register(FacadeName, NewFacade); err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset()
	fw, err := frameworkruntime.NewFramework(t.Context(), registry, &cfg.Profiles[0],
		frameworkruntime.WithClientSet(client), frameworkruntime.WithInformerFactory(informers.NewSharedInformerFactory(client, 0)),
		frameworkruntime.WithSnapshotSharedLister(schedcache.NewEmptySnapshot()))
	if err != nil {
		t.Fatal(err)
	}
	return fw, handle
}

// TestFiltersFromProfile: the plugin reads from its profile whether
// NodeResourcesFit filters (fitFilters) and whether TaintToleration does
// (taintFilters, see mayLandOnDevices): both in the shipped
// configurations; not NodeResourcesFit where a profile disables its Filter
// and keeps its PreFilter (whose state alone would say yes), or disables
// it altogether; not TaintToleration where its Filter is disabled.
func TestFiltersFromProfile(t *testing.T) {
	schedmetrics.Register()
	shipped, err := os.ReadFile(filepath.Join("..", "config", "kubegpu-scheduler.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	disable := func(point, plugin string) []byte {
		if point == "" {
			return []byte(kubeGPUProfile + "      disabled:\n      - name: " + plugin + "\n")
		}
		return []byte(kubeGPUProfile + "    " + point + ":\n      disabled:\n      - name: " + plugin + "\n")
	}
	for _, tc := range []struct {
		name       string
		config     []byte
		fit, taint bool
	}{
		{"shipped", shipped, true, true},
		{"helm", helmSchedulerConfig(t), true, true},
		{"fit filter disabled", disable("filter", "NodeResourcesFit"), false, true},
		{"fit disabled", disable("", "NodeResourcesFit"), false, true},
		{"taint filter disabled", disable("filter", "TaintToleration"), true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, h := buildProfile(t, tc.config)
			p := &Plugin{handle: h, ctx: t.Context()}
			if got := p.fitFilters(); got != tc.fit {
				t.Errorf("fitFilters = %v, want %v", got, tc.fit)
			}
			if got := p.taintFilters(); got != tc.taint {
				t.Errorf("taintFilters = %v, want %v", got, tc.taint)
			}
		})
	}
}

// helmSchedulerConfig is the scheduler configuration the Helm chart renders
// with its default values, from the golden file the integration tests
// compare the chart with.
func helmSchedulerConfig(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "test", "integration", "testdata", "helm", "default.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var cm corev1.ConfigMap
		if err := yaml.Unmarshal([]byte(doc), &cm); err != nil || cm.Kind != "ConfigMap" {
			continue
		}
		if c, ok := cm.Data["config.yaml"]; ok && strings.Contains(c, "KubeSchedulerConfiguration") {
			return []byte(c)
		}
	}
	t.Fatal("no scheduler ConfigMap in the chart's golden file")
	return nil
}
