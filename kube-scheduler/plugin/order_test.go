package plugin

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	schedcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
)

// orderStub stands in for the plugin where only its extension points
// matter: the framework orders plugins by the interfaces they implement.
type orderStub struct{}

func (orderStub) Name() string { return Name }
func (orderStub) Filter(context.Context, fwk.CycleState, *corev1.Pod, fwk.NodeInfo) *fwk.Status {
	return nil
}
func (orderStub) Bind(context.Context, fwk.CycleState, *corev1.Pod, string) *fwk.Status { return nil }

// TestShippedPluginOrder: the shipped configurations, read and defaulted
// as kube-scheduler reads them, run KubeGPU's Filter right after the
// upstream filters that read only the node object and before
// NodeResourcesFit, with every other upstream filter still enabled, and
// KubeGPU's Bind before DefaultBinder.
func TestShippedPluginOrder(t *testing.T) {
	schedmetrics.Register() // the framework counts plugins' calls
	for _, name := range []string{"kubegpu-scheduler.yaml", "second-scheduler.yaml"} {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("..", "config", name))
			if err != nil {
				t.Fatal(err)
			}
			obj, _, err := scheme.Codecs.UniversalDecoder().Decode(data, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			cfg := obj.(*config.KubeSchedulerConfiguration)
			registry := plugins.NewInTreeRegistry()
			if err := registry.Register(Name, func(context.Context, runtime.Object, fwk.Handle) (fwk.Plugin, error) { return orderStub{}, nil }); err != nil {
				t.Fatal(err)
			}
			client := fake.NewClientset()
			fw, err := frameworkruntime.NewFramework(t.Context(), registry, &cfg.Profiles[0],
				frameworkruntime.WithClientSet(client), frameworkruntime.WithInformerFactory(informers.NewSharedInformerFactory(client, 0)),
				frameworkruntime.WithSnapshotSharedLister(schedcache.NewEmptySnapshot()))
			if err != nil {
				t.Fatal(err)
			}
			var filters, binds []string
			for _, p := range fw.ListPlugins().Filter.Enabled {
				filters = append(filters, p.Name)
			}
			for _, p := range fw.ListPlugins().Bind.Enabled {
				binds = append(binds, p.Name)
			}
			want := []string{"NodeUnschedulable", "NodeName", "TaintToleration", "NodeAffinity", "NodePorts", Name, "NodeResourcesFit"}
			if len(filters) < len(want) || !slices.Equal(filters[:len(want)], want) {
				t.Errorf("filters run in the order %v, want %v first", filters, want)
			}
			for _, upstream := range []string{"VolumeRestrictions", "NodeVolumeLimits", "VolumeBinding", "VolumeZone", "PodTopologySpread", "InterPodAffinity"} {
				if !slices.Contains(filters, upstream) {
					t.Errorf("filter %s is not enabled: %v", upstream, filters)
				}
			}
			if len(binds) == 0 || binds[0] != Name {
				t.Errorf("bind plugins %v, want %s first", binds, Name)
			}
		})
	}
}
