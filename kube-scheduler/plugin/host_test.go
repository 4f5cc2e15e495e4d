package plugin

import (
	"context"
	"errors"
	"testing"

	"github.com/kubegpu/kubegpu/kube-scheduler/apis/config"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kube-scheduler/metrics"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

func resources(cpu, memory string) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Requests: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory),
	}}
}

// TestHostResources checks how the plugin reads a pod's and a node's CPU
// and memory: as the scheduler counts them.
func TestHostResources(t *testing.T) {
	pod := testPod("p")
	pod.Spec.InitContainers = []corev1.Container{{Name: "init", Resources: resources("6", "1Gi")}}
	pod.Spec.Containers = []corev1.Container{
		{Name: "a", Resources: resources("2", "1536Ki")},
		{Name: "b", Resources: resources("1500m", "2Mi")},
	}
	// The init container's 6 CPUs outweigh the app containers' 3.5; memory
	// rounds down to MiB (1.5 MiB + 2 MiB).
	if got, want := podHost(pod), (devicescheduler.Host{CPUMilli: 6000, MemoryMiB: 1024}); got != want {
		t.Errorf("podHost = %+v, want %+v", got, want)
	}

	node := testNode(t, "n1", "t4x4")
	node.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("32"), corev1.ResourceMemory: resource.MustParse("64Gi")}
	running := testPod("running")
	running.Spec.Containers = []corev1.Container{{Name: "c", Resources: resources("30", "63Gi")}}
	ni := framework.NewNodeInfo(running)
	ni.SetNode(node)
	capacity, free := nodeHost(ni)
	if want := (devicescheduler.Host{CPUMilli: 32000, MemoryMiB: 64 << 10}); capacity != want {
		t.Errorf("nodeHost capacity = %+v, want %+v", capacity, want)
	}
	if want := (devicescheduler.Host{CPUMilli: 2000, MemoryMiB: 1 << 10}); free != want {
		t.Errorf("nodeHost free = %+v, want %+v", free, want)
	}
}

// TestCacheEvaluatesWithHost: Filter results are remembered per host state,
// and a pod whose CPU does not fit beside the node's pods is refused.
func TestCacheEvaluatesWithHost(t *testing.T) {
	c, _ := testCache(t)
	c.UpdateNode(klog.Background(), testNode(t, "n1", "t4x4"))
	c.UpdateLease(testLease("n1", testNow), false)
	r, err := c.Engine().NewRequest(types.PodRequest{Containers: []types.ContainerRequest{{Name: "main", Count: 1}}}, devicescheduler.Host{CPUMilli: 4000, MemoryMiB: 1024})
	if err != nil {
		t.Fatal(err)
	}
	in := c.Input(devicecache.ShapeKey{5}, r)
	capacity := devicescheduler.Host{CPUMilli: 32000, MemoryMiB: 64 << 10}
	var p devicescheduler.Placement
	if _, err := c.Evaluate(named("n1"), &in, capacity, capacity, &p); err != nil {
		t.Fatalf("on an idle node: %v", err)
	}
	busy := devicescheduler.Host{CPUMilli: 3000, MemoryMiB: 64 << 10}
	var nf *devicescheduler.NotFitError
	if _, err := c.Evaluate(named("n1"), &in, capacity, busy, &p); !errors.As(err, &nf) || nf.Reason != devicescheduler.ReasonHostResources {
		t.Fatalf("with 3 CPUs free: %v, want %s (a stale memo?)", err, devicescheduler.ReasonHostResources)
	}
	if _, err := c.Evaluate(named("n1"), &in, capacity, capacity, &p); err != nil {
		t.Fatalf("idle again: %v", err)
	}
}

// TestScorePodsWithoutDevices: a pod without devices ranks nodes without
// devices first, then GPU nodes where it leaves the fewest idle GPUs
// beside it; with podsWithoutDevices: Ignore the plugin does not score it.
func TestScorePodsWithoutDevices(t *testing.T) {
	c, _ := testCache(t)
	logger := klog.Background()
	allocatable := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("32"), corev1.ResourceMemory: resource.MustParse("64Gi")}
	nodeInfo := func(node *corev1.Node) fwk.NodeInfo {
		node.Status.Allocatable = allocatable
		ni := framework.NewNodeInfo()
		ni.SetNode(node)
		return ni
	}
	var infos []fwk.NodeInfo
	for _, name := range []string{"idle", "busy"} {
		n := testNode(t, name, "t4x4")
		c.UpdateNode(logger, n)
		c.UpdateLease(testLease(name, testNow), false)
		infos = append(infos, nodeInfo(n))
	}
	if _, err := c.Reserve(testPod("gpus"), "busy", wholeRequest(t, c, 3), noHost, noHost, nil); err != nil {
		t.Fatal(err)
	}
	infos = append(infos, nodeInfo(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu-only"}}))
	// A node whose devices are published but unusable is no node without
	// devices: it ranks last.
	broken := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "broken", Annotations: map[string]string{kubeinterface.AnnotationInventory: "{"}}}
	c.UpdateNode(logger, broken)
	infos = append(infos, nodeInfo(broken))

	pod := testPod("web")
	pod.Spec.Containers = []corev1.Container{{Name: "c", Resources: resources("2", "4Gi")}}
	for _, mode := range []string{config.PodsWithoutDevicesScore, config.PodsWithoutDevicesIgnore} {
		t.Run(mode, func(t *testing.T) {
			p := &Plugin{args: &Args{PodsWithoutDevices: mode, Enforcement: types.EnforcementBestEffort}, shared: &shared{engine: c.Engine(), cache: c, pending: metrics.NewPendingPods()}, namespaces: anyNamespace{}}
			p.ready.Store(true)
			cs := framework.NewCycleState()
			if _, st := p.PreFilter(context.Background(), cs, pod, nil); !st.IsSkip() {
				t.Fatalf("PreFilter = %v, want Skip (no Filter for pods without devices)", st)
			}
			st := p.PreScore(context.Background(), cs, pod, infos)
			if mode == config.PodsWithoutDevicesIgnore {
				if !st.IsSkip() {
					t.Fatalf("PreScore = %v, want Skip", st)
				}
				return
			}
			if !st.IsSuccess() {
				t.Fatalf("PreScore = %v", st)
			}
			scores := map[string]int64{}
			for _, ni := range infos {
				s, st := p.Score(context.Background(), cs, pod, ni)
				if !st.IsSuccess() {
					t.Fatalf("Score(%s) = %v", ni.Node().Name, st)
				}
				scores[ni.Node().Name] = s
			}
			if scores["cpu-only"] <= scores["busy"] || scores["busy"] <= scores["idle"] || scores["idle"] <= scores["broken"] {
				t.Errorf("scores %v; want cpu-only > busy (1 idle GPU) > idle (4) > broken", scores)
			}
			// Reserve holds nothing for it. The mix learns it only on a
			// node with devices, where it competes with them.
			if st := p.Reserve(context.Background(), cs, pod, "cpu-only"); !st.IsSuccess() {
				t.Errorf("Reserve = %v", st)
			}
			if ts := c.Engine().Workload().Types(); len(ts) != 0 {
				t.Errorf("learned %+v from a pod on a node without devices", ts)
			}
			if st := p.Reserve(context.Background(), cs, pod, "busy"); !st.IsSuccess() {
				t.Errorf("Reserve = %v", st)
			}
			if ts := c.Engine().Workload().Types(); len(ts) != 1 || ts[0].Count != 0 || ts[0].Host.CPUMilli != 2000 {
				t.Errorf("learned mix %+v, want the pod's CPU-only type", ts)
			}
		})
	}
}

// TestPodsWithoutDevicesOffTaintedGPUNodes: where every GPU node carries a
// taint a pod without devices does not tolerate, and the profile filters
// taints, the plugin does not score the pod (its scores would all be
// alike); a pod that tolerates the taint, or a profile that does not
// filter taints, is scored.
func TestPodsWithoutDevicesOffTaintedGPUNodes(t *testing.T) {
	c, _ := testCache(t)
	logger := klog.Background()
	for _, name := range []string{"gpu-1", "gpu-2"} {
		n := testNode(t, name, "t4x4")
		n.Spec.Taints = []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}}
		c.UpdateNode(logger, n)
		c.UpdateLease(testLease(name, testNow), false)
	}
	c.UpdateNode(logger, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu"}})
	withTaints := &schedconfig.Plugins{Filter: schedconfig.PluginSet{Enabled: []schedconfig.Plugin{{Name: names.TaintToleration}, {Name: Name}}}}
	withoutTaints := &schedconfig.Plugins{Filter: schedconfig.PluginSet{Enabled: []schedconfig.Plugin{{Name: Name}}}}
	plain := testPod("web")
	plain.Spec.Containers = []corev1.Container{{Name: "c", Resources: resources("2", "4Gi")}}
	tolerating := plain.DeepCopy()
	tolerating.Spec.Tolerations = []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	for _, tc := range []struct {
		name    string
		plugins *schedconfig.Plugins
		pod     *corev1.Pod
		scored  bool
	}{
		{"taints filtered, not tolerated", withTaints, plain, false},
		{"taints filtered, tolerated", withTaints, tolerating, true},
		{"taints not filtered", withoutTaints, plain, true},
		{"plugins not listed", nil, plain, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Plugin{args: &Args{PodsWithoutDevices: config.PodsWithoutDevicesScore, Enforcement: types.EnforcementBestEffort}, shared: &shared{engine: c.Engine(), cache: c, pending: metrics.NewPendingPods()}, ctx: context.Background(), namespaces: anyNamespace{}}
			if tc.plugins != nil {
				p.handle = listedHandle{plugins: tc.plugins}
			}
			p.ready.Store(true)
			cs := framework.NewCycleState()
			if _, st := p.PreFilter(context.Background(), cs, tc.pod, nil); !st.IsSkip() {
				t.Fatalf("PreFilter = %v, want Skip", st)
			}
			st := p.PreScore(context.Background(), cs, tc.pod, nil)
			if got := !st.IsSkip(); got != tc.scored {
				t.Fatalf("PreScore = %v: scored %v, want %v", st, got, tc.scored)
			}
		})
	}
	p := &Plugin{args: &Args{PodsWithoutDevices: config.PodsWithoutDevicesScore, Enforcement: types.EnforcementBestEffort}, shared: &shared{engine: c.Engine(), cache: c, pending: metrics.NewPendingPods()}, ctx: context.Background(), namespaces: anyNamespace{}, handle: listedHandle{plugins: withTaints}}
	p.ready.Store(true)
	scored := func(pod *corev1.Pod) (fwk.CycleState, bool) {
		t.Helper()
		cs := framework.NewCycleState()
		_, _ = p.PreFilter(context.Background(), cs, pod, nil)
		return cs, !p.PreScore(context.Background(), cs, pod, nil).IsSkip()
	}

	// A pod not scored that lands on a device node all the same (the
	// snapshot saw a taint go before the cache did) still counts in the
	// workload mix, as a scored one does.
	cs, ok := scored(plain)
	if ok {
		t.Fatal("a pod that tolerates no GPU node was scored")
	}
	plain.UID = "unscored-on-gpu"
	if st := p.Reserve(context.Background(), cs, plain, "gpu-1"); !st.IsSuccess() {
		t.Fatal(st)
	}
	if !c.Engine().HasPod("unscored-on-gpu") {
		t.Error("a pod without devices reserved on a GPU node is not in the learned mix")
	}

	// A node whose inventory is published but unusable is no node without
	// devices (it ranks last): untainted, it gets pods scored.
	broken := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "broken", Annotations: map[string]string{kubeinterface.AnnotationInventory: "{"}}}
	c.UpdateNode(logger, broken)
	if _, ok := scored(plain); !ok {
		t.Error("a pod was not scored beside an untainted node with an unusable inventory")
	}
	c.DeleteNode("broken")
	if _, ok := scored(plain); ok {
		t.Error("a pod was scored once the unusable node went")
	}

	// An untainted GPU node joins: every pod may land on it, and is scored.
	c.UpdateNode(logger, testNode(t, "gpu-3", "t4x4"))
	if _, ok := scored(plain); !ok {
		t.Fatal("a pod was not scored beside an untainted GPU node")
	}
}

// TestPodsWithoutDevicesNoGPUNodes: with no node that publishes devices,
// every node would score alike: the plugin scores no pod without devices,
// whether or not the profile filters taints.
func TestPodsWithoutDevicesNoGPUNodes(t *testing.T) {
	c, _ := testCache(t)
	c.UpdateNode(klog.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu"}})
	pod := testPod("web")
	pod.Spec.Containers = []corev1.Container{{Name: "c", Resources: resources("2", "4Gi")}}
	for _, h := range []fwk.Handle{nil, listedHandle{plugins: &schedconfig.Plugins{}}} {
		p := &Plugin{args: &Args{PodsWithoutDevices: config.PodsWithoutDevicesScore, Enforcement: types.EnforcementBestEffort}, shared: &shared{engine: c.Engine(), cache: c, pending: metrics.NewPendingPods()}, ctx: context.Background(), namespaces: anyNamespace{}, handle: h}
		p.ready.Store(true)
		cs := framework.NewCycleState()
		_, _ = p.PreFilter(context.Background(), cs, pod, nil)
		if st := p.PreScore(context.Background(), cs, pod, nil); !st.IsSkip() {
			t.Errorf("handle %T: PreScore = %v, want Skip", h, st)
		}
	}
}
