package plugin

import (
	"context"
	"math"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/kubegpu/kubegpu/kube-scheduler/apis/config"
	"github.com/kubegpu/kubegpu/kube-scheduler/metrics"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// TestDRAServesMappedResource: once a DeviceClass maps nvidia.com/gpu, a
// GPU pod on a node that advertises none of it (a DRA node, no kubegpu
// inventory) is left to the DynamicResources plugin: Filter passes the
// node, Score ranks it last, Reserve assumes nothing and Bind leaves the
// pod to DefaultBinder. On a kubegpu node, which advertises it, kubegpu
// allocates as before.
func TestDRAServesMappedResource(t *testing.T) {
	c, _ := testCache(t)
	logger := klog.Background()
	kubegpuNode := testNode(t, "kubegpu", "t4x4")
	kubegpuNode.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("96"), corev1.ResourceMemory: resource.MustParse("768Gi"),
		kubeinterface.ResourceGPU: resource.MustParse("400")}
	draNode := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dra"}, Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("96"), corev1.ResourceMemory: resource.MustParse("768Gi")}}}
	infos := map[string]*framework.NodeInfo{}
	for _, n := range []*corev1.Node{kubegpuNode, draNode} {
		c.UpdateNode(logger, n)
		c.UpdateLease(testLease(n.Name, testNow), false)
		infos[n.Name] = framework.NewNodeInfo()
		infos[n.Name].SetNode(n)
	}
	name := kubeinterface.ResourceGPU
	c.UpdateDeviceClass(&resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.example.com"}, Spec: resourceapi.DeviceClassSpec{ExtendedResourceName: &name}})
	p := &Plugin{args: &Args{PodsWithoutDevices: config.PodsWithoutDevicesScore, Enforcement: types.EnforcementBestEffort, WriteAllocation: config.WriteAllocationBind},
		shared: &shared{engine: c.Engine(), cache: c, pending: metrics.NewPendingPods()}, ctx: context.Background(), namespaces: anyNamespace{}}
	p.ready.Store(true)
	nodes := []fwk.NodeInfo{infos["kubegpu"], infos["dra"]}
	cycle := func(node string) (fwk.CycleState, *fwk.Status) {
		ctx, pod, cs := context.Background(), gpuPod("p-"+node, 1, 0, testNow), framework.NewCycleState()
		if _, st := p.PreFilter(ctx, cs, pod, nodes); !st.IsSuccess() {
			t.Fatal(st)
		}
		if st := p.Filter(ctx, cs, pod, infos[node]); !st.IsSuccess() {
			t.Fatalf("Filter(%s) = %v", node, st)
		}
		if st := p.PreScore(ctx, cs, pod, nodes); !st.IsSuccess() {
			t.Fatal(st)
		}
		score, _ := p.Score(ctx, cs, pod, infos[node])
		if node == "dra" && score != math.MinInt64 {
			t.Errorf("Score(dra) = %d, want the lowest", score)
		}
		if st := p.Reserve(ctx, cs, pod, node); !st.IsSuccess() {
			t.Fatalf("Reserve(%s) = %v", node, st)
		}
		return cs, nil
	}
	cs, _ := cycle("dra")
	if s := getState(cs); !s.dra || len(s.alloc.Containers) != 0 {
		t.Errorf("on the DRA node: state dra=%v alloc=%+v, want DRA's and no allocation", s.dra, s.alloc)
	}
	if st := p.Bind(context.Background(), cs, gpuPod("p-dra", 1, 0, testNow), "dra"); st.Code() != fwk.Skip {
		t.Errorf("Bind on the DRA node = %v, want Skip (DefaultBinder binds)", st)
	}
	p.PostBind(context.Background(), cs, gpuPod("p-dra", 1, 0, testNow), "dra") // no handle: would panic reporting a missing allocation
	cs, _ = cycle("kubegpu")
	if s := getState(cs); s.dra || len(s.alloc.Containers) != 1 {
		t.Errorf("on the kubegpu node: state dra=%v alloc=%+v, want kubegpu's allocation", s.dra, s.alloc)
	}
}
