package plugin

import (
	"context"
	"fmt"
	"testing"

	"github.com/kubegpu/kubegpu/kube-scheduler/apis/config"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/kubegpu/kubegpu/kube-scheduler/metrics"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// TestPreemptionView: Filter sees a node with the pods RemovePod took off
// and AddPod put back, as preemption's dry run asks, apart from the node
// itself and from other clones of the cycle state.
func TestPreemptionView(t *testing.T) {
	p, node, lows := fullDGX(t, 8)
	high := gpuPod("high", 4, 0, testNow)
	high.Annotations = map[string]string{kubeinterface.AnnotationTopology: "required"}
	cs := framework.NewCycleState()
	if _, st := p.PreFilter(context.Background(), cs, high, nil); !st.IsSuccess() {
		t.Fatalf("PreFilter = %v", st)
	}
	ni := framework.NewNodeInfo()
	ni.SetNode(node)
	if st := p.Filter(context.Background(), cs, high, ni); st.IsSuccess() {
		t.Fatal("4 GPUs fit on a full node")
	}
	dry := cs.Clone()
	for _, l := range lows {
		pi, _ := framework.NewPodInfo(l)
		if st := p.RemovePod(context.Background(), dry, high, pi, ni); !st.IsSuccess() {
			t.Fatal(st)
		}
	}
	if st := p.Filter(context.Background(), dry, high, ni); !st.IsSuccess() {
		t.Fatalf("with every pod removed: %v", st)
	}
	reprieved := 0
	for _, l := range lows {
		pi, _ := framework.NewPodInfo(l)
		_ = p.AddPod(context.Background(), dry, high, pi, ni)
		if st := p.Filter(context.Background(), dry, high, ni); st.IsSuccess() {
			reprieved++
			continue
		}
		_ = p.RemovePod(context.Background(), dry, high, pi, ni)
	}
	if reprieved != 4 {
		t.Errorf("%d pods reprieved, want 4 (those of one NVLink quad are the victims)", reprieved)
	}
	if st := p.Filter(context.Background(), cs, high, ni); st.IsSuccess() {
		t.Error("the cycle's own state sees the dry run's removals")
	}
}

// fullDGX is a warm plugin over one live DGX-1, n1, with n one-GPU pods
// bound there.
func fullDGX(t testing.TB, n int) (*Plugin, *corev1.Node, []*corev1.Pod) {
	tt, ok := t.(*testing.T)
	if !ok {
		tt = &testing.T{}
	}
	c, key := testCache(tt)
	logger := klog.Background()
	node := testNode(tt, "n1", "dgx1")
	c.UpdateNode(logger, node)
	c.UpdateLease(testLease("n1", testNow), false)
	p := &Plugin{args: &Args{PodsWithoutDevices: config.PodsWithoutDevicesScore, Enforcement: types.EnforcementBestEffort}, shared: &shared{engine: c.Engine(), cache: c, pending: metrics.NewPendingPods()}, ctx: context.Background(), namespaces: anyNamespace{}}
	p.ready.Store(true)
	var pods []*corev1.Pod
	for i := range n {
		pod := gpuPod(fmt.Sprint("low-", i), 1, 0, testNow)
		alloc, err := c.Reserve(pod, "n1", wholeRequest(tt, c, 1), noHost, noHost, nil)
		if err != nil {
			t.Fatal(err)
		}
		bound := boundWith(tt, key, pod, alloc)
		c.UpdatePod(logger, bound)
		pods = append(pods, bound)
	}
	return p, node, pods
}

// TestAddPodBoundNotCounted: a bound pod that the cache does not count (its
// allocation does not verify) holds no devices; preemption's dry run adding
// it back (a reprieve) gives it none, where a pod nominated to the node
// gets its devices placed first.
func TestAddPodBoundNotCounted(t *testing.T) {
	p, node, _ := fullDGX(t, 4)
	pod := gpuPod("x", 4, 0, testNow)
	cs := framework.NewCycleState()
	if _, st := p.PreFilter(context.Background(), cs, pod, nil); !st.IsSuccess() {
		t.Fatalf("PreFilter = %v", st)
	}
	ni := framework.NewNodeInfo()
	ni.SetNode(node)
	unverified := gpuPod("unverified", 4, 0, testNow)
	unverified.Spec.NodeName = node.Name
	pi, _ := framework.NewPodInfo(unverified)
	dry := cs.Clone()
	if st := p.AddPod(context.Background(), dry, pod, pi, ni); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := p.Filter(context.Background(), dry, pod, ni); !st.IsSuccess() {
		t.Errorf("a bound pod the cache does not count took devices: %v", st)
	}
	nominated := gpuPod("nominated", 4, 0, testNow)
	pi, _ = framework.NewPodInfo(nominated)
	if st := p.AddPod(context.Background(), dry, pod, pi, ni); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := p.Filter(context.Background(), dry, pod, ni); st.IsSuccess() {
		t.Error("4 GPUs fit beside a nominated pod placed first on the node's last 4")
	}
}
