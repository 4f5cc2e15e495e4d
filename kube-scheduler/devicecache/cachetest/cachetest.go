// Package cachetest builds the objects the device cache's tests and the
// scheduler plugin's tests feed it: simulated GPU nodes, Leases, pods bound
// with signed allocations. It is for tests only.
package cachetest

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/plugins/amd"
	"github.com/kubegpu/kubegpu/plugins/intel"
	"github.com/kubegpu/kubegpu/plugins/simgpu"
	"github.com/kubegpu/kubegpu/types"
)

// Now is the tests' fixed clock reading.
var Now = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

// Engine is an allocation engine over the simulated GPU module.
func Engine(t testing.TB) *devicescheduler.Engine {
	t.Helper()
	var plugins []types.SchedulerPlugin
	for _, m := range []types.Module{simgpu.NewModule(), amd.NewModule(), intel.NewModule()} {
		sp, err := m.SchedulerPlugin(context.Background(), types.PluginConfig{})
		if err != nil {
			t.Fatal(err)
		}
		plugins = append(plugins, sp)
	}
	e, err := devicescheduler.New(devicescheduler.Config{Plugins: plugins})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// Key is a signing key.
func Key(t testing.TB) *kubeinterface.Key {
	t.Helper()
	key, err := kubeinterface.NewHMACKey([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// Named is a Node object of that name, which the cache finds by name.
func Named(name string) *corev1.Node { return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} }

// Node is a Ready node publishing the inventory of a simgpu preset.
func Node(t testing.TB, name, preset string) *corev1.Node {
	t.Helper()
	topo, err := simgpu.Preset(preset)
	if err != nil {
		t.Fatal(err)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	if err := objects.SetNodeInventory(n, simgpu.Inventory(topo, name)); err != nil {
		t.Fatal(err)
	}
	return n
}

// Lease is node's Lease in kube-node-lease, renewed at renewed.
func Lease(node string, renewed time.Time) *coordinationv1.Lease {
	rt := metav1.NewMicroTime(renewed)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: kubeinterface.LeaseNamespace, Name: node},
		Spec:       coordinationv1.LeaseSpec{RenewTime: &rt},
	}
}

// WholeRequest is a request for count whole GPUs.
func WholeRequest(t testing.TB, e *devicescheduler.Engine, count int) *devicescheduler.Request {
	t.Helper()
	r, err := e.NewRequest(types.PodRequest{Containers: []types.ContainerRequest{{Name: "main", Count: count}}}, devicescheduler.Host{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Pod is an empty pod in namespace ns, of UID "uid-"+name.
func Pod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: ktypes.UID("uid-" + name)}}
}

// BoundWith returns pod bound to its allocation's node with the signed
// allocation annotation.
func BoundWith(t testing.TB, key *kubeinterface.Key, pod *corev1.Pod, alloc types.PodAllocation) *corev1.Pod {
	t.Helper()
	signed, err := key.Sign(kubeinterface.Allocation{Pod: kubeinterface.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}, PodAllocation: alloc})
	if err != nil {
		t.Fatal(err)
	}
	value, err := kubeinterface.EncodeAllocation(signed)
	if err != nil {
		t.Fatal(err)
	}
	p := pod.DeepCopy()
	p.Spec.NodeName = alloc.Node
	p.Annotations = map[string]string{kubeinterface.AnnotationAllocation: value}
	return p
}

// GPUPod is a pod whose container "main" asks for count GPUs, or slices of
// cores percent when cores > 0.
func GPUPod(name string, count, cores int64, created time.Time) *corev1.Pod {
	p := Pod(name)
	p.CreationTimestamp = metav1.NewTime(created)
	limits := corev1.ResourceList{kubeinterface.ResourceGPU: *resource.NewQuantity(count, resource.DecimalSI)}
	if cores > 0 {
		limits[kubeinterface.ResourceGPUCores] = *resource.NewQuantity(cores, resource.DecimalSI)
	}
	p.Spec.Containers = []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{Limits: limits}}}
	return p
}
