package plugin

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	ktypes "k8s.io/apimachinery/pkg/types"

	"github.com/kubegpu/kubegpu/kube-scheduler/apis/config"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kube-scheduler/metrics"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// BenchmarkCacheMemory reports the device cache's heap per node: 1000 nodes
// with heartbeats and four 1-GPU pods bound on each.
func BenchmarkCacheMemory(b *testing.B) {
	const nodes = 1000
	for _, preset := range []string{"dgx1", "dgx-h100", "t4x4"} {
		b.Run(preset, func(b *testing.B) {
			var perNode float64
			for i := 0; i < b.N; i++ {
				objs := make([]*corev1.Node, nodes)
				for j := range objs {
					objs[j] = testNode(&testing.T{}, fmt.Sprintf("node-%04d", j), preset)
				}
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				c, _ := testCache(&testing.T{})
				logger := klog.Background()
				r := wholeRequest(&testing.T{}, c, 1)
				for j, n := range objs {
					c.UpdateNode(logger, n)
					c.UpdateLease(testLease(n.Name, testNow), false)
					for k := 0; k < 4; k++ {
						if _, err := c.Reserve(testPod(fmt.Sprintf("%d-%d", j, k)), n.Name, r, noHost, noHost, nil); err != nil {
							b.Fatal(err)
						}
					}
				}
				var pl devicescheduler.Placement
				in := c.Input(devicecache.ShapeKey{1}, wholeRequest(&testing.T{}, c, 1))
				for _, n := range objs {
					_, _ = c.Evaluate(n, &in, noHost, noHost, &pl)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perNode = float64(after.HeapAlloc-before.HeapAlloc) / nodes
				runtime.KeepAlive(c)
			}
			b.ReportMetric(perNode, "B/node")
		})
	}
}

// largestPod is the largest GPU pod the request limits accept: 16 containers
// of 64 slices each, and every model and UUID list at its 4096 characters
// and 64 entries (include and exclude lists disjoint).
func largestPod(b *testing.B, name string) *corev1.Pod {
	list := func(prefix string) string {
		entries := make([]string, objects.MaxListEntries)
		width := (objects.MaxListChars+1)/objects.MaxListEntries - 1
		for i := range entries {
			e := fmt.Sprintf("%s%02d-", prefix, i)
			entries[i] = e + strings.Repeat("x", width-len(e))
		}
		s := strings.Join(entries, ",")
		if len(s) > objects.MaxListChars {
			b.Fatalf("list of %d chars", len(s))
		}
		return s
	}
	pod := testPod(name)
	pod.Annotations = map[string]string{
		kubeinterface.AnnotationModelInclude: list("m"), kubeinterface.AnnotationModelExclude: list("n"),
		kubeinterface.AnnotationUUIDInclude: list("u"), kubeinterface.AnnotationUUIDExclude: list("v"),
	}
	for i := range types.MaxDeviceContainers {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: fmt.Sprint("c", i), Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			kubeinterface.ResourceGPU:      *resource.NewQuantity(objects.MaxDevicesPerContainer, resource.DecimalSI),
			kubeinterface.ResourceGPUCores: *resource.NewQuantity(10, resource.DecimalSI),
		}}})
	}
	if _, err := objects.PodRequest(pod); err != nil {
		b.Fatalf("the largest pod is refused: %v", err)
	}
	return pod
}

// BenchmarkPreFilter is PreFilter's cost for a 1-GPU pod and for the
// largest pod the limits accept, whose cost is bounded by them.
func BenchmarkPreFilter(b *testing.B) {
	c, _ := testCache(&testing.T{})
	p := &Plugin{args: &Args{PodsWithoutDevices: config.PodsWithoutDevicesScore, Enforcement: types.EnforcementBestEffort}, shared: &shared{engine: c.Engine(), cache: c, pending: metrics.NewPendingPods()}, ctx: context.Background(), namespaces: anyNamespace{}}
	p.ready.Store(true)
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
	}{
		{"one-gpu", gpuPod("one", 1, 0, testNow)},
		{"largest", largestPod(b, "largest")},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, st := p.PreFilter(context.Background(), framework.NewCycleState(), tc.pod, nil); !st.IsSuccess() {
					b.Fatalf("PreFilter = %v", st)
				}
			}
		})
	}
}

// BenchmarkFilterNominated is Filter's cost on a DGX-1 half full: from the
// memo (the usual case), and with a nominated pod to place first (a copy of
// the node's devices per call, as on nodes a preemptor waits for).
func BenchmarkFilterNominated(b *testing.B) {
	p, node, _ := fullDGX(b, 4)
	pod := gpuPod("x", 1, 0, testNow)
	ni := framework.NewNodeInfo()
	ni.SetNode(node)
	nominated, _ := framework.NewPodInfo(gpuPod("nominated", 2, 0, testNow))
	for _, tc := range []struct {
		name      string
		nominated bool
	}{{"memo", false}, {"nominated", true}} {
		b.Run(tc.name, func(b *testing.B) {
			cs := framework.NewCycleState()
			if _, st := p.PreFilter(context.Background(), cs, pod, []fwk.NodeInfo{ni}); !st.IsSuccess() {
				b.Fatal(st)
			}
			if tc.nominated {
				_ = p.AddPod(context.Background(), cs, pod, nominated, ni)
			}
			b.ReportAllocs()
			for b.Loop() {
				if st := p.Filter(context.Background(), cs, pod, ni); !st.IsSuccess() {
					b.Fatal(st)
				}
			}
		})
	}
}

// BenchmarkFilterScore is one scheduling cycle's PreFilter, Filter,
// PreScore and Score calls for a 1-GPU pod on 5,000 DGX-1 nodes, as kube-scheduler makes them at that
// size: 500 nodes (percentageOfNodesToScore's adaptive 10%), from where the
// previous cycle stopped, each with 8 results in its memo. It reports the
// cost per node.
func BenchmarkFilterScore(b *testing.B) {
	const nodes, perCycle = 5000, 500
	p, infos := perfCluster(nodes)
	// Pods of a few shapes, so that every node's memo holds several.
	pods := make([]*corev1.Pod, 8)
	for i := range pods {
		pods[i] = gpuPod(fmt.Sprint("p-", i), int64(1+i%4), 0, testNow)
		pods[i].Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(fmt.Sprint(100+i, "m"))}
	}
	start, cycle := 0, 0
	b.ReportAllocs()
	for b.Loop() {
		pod := pods[cycle%len(pods)]
		cycle++
		cs := framework.NewCycleState()
		if _, st := p.PreFilter(context.Background(), cs, pod, infos); !st.IsSuccess() {
			b.Fatal(st)
		}
		for i := range perCycle {
			ni := infos[(start+i)%nodes]
			if st := p.Filter(context.Background(), cs, pod, ni); !st.IsSuccess() {
				b.Fatal(st)
			}
		}
		if st := p.PreScore(context.Background(), cs, pod, nil); !st.IsSuccess() {
			b.Fatal(st)
		}
		for i := range perCycle {
			if _, st := p.Score(context.Background(), cs, pod, infos[(start+i)%nodes]); !st.IsSuccess() {
				b.Fatal(st)
			}
		}
		getState(cs).scores.release() // as Reserve does
		start = (start + perCycle) % nodes
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perCycle*2), "ns/call")
}

// BenchmarkHostOnlyCycle is one scheduling cycle of a pod that asks for no
// devices on 5,000 DGX-1 nodes: PreFilter, PreScore, Score on the 500
// nodes the scheduler scores at that size, NormalizeScore and Reserve. It
// reports the cost per node scored (ns/op is the cycle's). With the GPU
// nodes tainted (and the profile filtering taints) the pod, which does not
// tolerate the taint, is not scored: what is left is PreFilter's check of
// the taints, and ns/op alone is reported.
func BenchmarkHostOnlyCycle(b *testing.B) {
	for _, tainted := range []bool{false, true} {
		b.Run(map[bool]string{false: "untainted", true: "tainted"}[tainted], func(b *testing.B) {
			benchmarkHostOnlyCycle(b, tainted)
		})
	}
}

func benchmarkHostOnlyCycle(b *testing.B, tainted bool) {
	const nodes, perCycle = 5000, 500
	p, infos := perfCluster(nodes)
	if tainted {
		for _, ni := range infos {
			n := ni.Node().DeepCopy()
			n.Spec.Taints = []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}}
			p.cache.UpdateNode(klog.Background(), n)
			ni.(*framework.NodeInfo).SetNode(n)
		}
		p.handle = listedHandle{plugins: &schedconfig.Plugins{Filter: schedconfig.PluginSet{Enabled: []schedconfig.Plugin{{Name: names.TaintToleration}, {Name: Name}}}}}
	}
	pod := testPod("cpu")
	pod.Spec.Containers = []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("500Mi")}}}}
	ctx := context.Background()
	scores := make(fwk.NodeScoreList, perCycle)
	start := 0
	b.ReportAllocs()
	for b.Loop() {
		cs := framework.NewCycleState()
		_, _ = p.PreFilter(ctx, cs, pod, nil)
		if st := p.PreScore(ctx, cs, pod, nil); st.IsSuccess() {
			for i := range perCycle {
				ni := infos[(start+i)%nodes]
				score, _ := p.Score(ctx, cs, pod, ni)
				scores[i] = fwk.NodeScore{Name: ni.Node().Name, Score: score}
			}
			_ = p.NormalizeScore(ctx, cs, pod, scores)
		}
		// Each cycle's pod another, as the pods of a Deployment: the
		// learned mix weighs them all.
		pod.UID = ktypes.UID(fmt.Sprint("cpu-", start, "-", b.N))
		node := infos[start].Node().Name
		if tainted {
			node = "cpu-only" // where such a pod lands: no GPU node takes it
		}
		_ = p.Reserve(ctx, cs, pod, node)
		start = (start + perCycle) % nodes
	}
	if !tainted {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perCycle), "ns/node")
	}
}

// perfCluster is a warm plugin over nodes live DGX-1 nodes with 96 CPUs and
// 768 GiB each, as scheduler_perf's, and their NodeInfos.
func perfCluster(nodes int) (*Plugin, []fwk.NodeInfo) {
	c, _ := testCache(&testing.T{})
	logger := klog.Background()
	infos := make([]fwk.NodeInfo, nodes)
	for i := range infos {
		n := testNode(&testing.T{}, fmt.Sprintf("kubegpu-perf-%05x", i*7919), "dgx1")
		n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("96"), corev1.ResourceMemory: resource.MustParse("768Gi")}
		c.UpdateNode(logger, n)
		c.UpdateLease(testLease(n.Name, testNow), false)
		ni := framework.NewNodeInfo()
		ni.SetNode(n)
		infos[i] = ni
	}
	p := &Plugin{args: &Args{PodsWithoutDevices: config.PodsWithoutDevicesScore, Enforcement: types.EnforcementBestEffort}, shared: &shared{engine: c.Engine(), cache: c, pending: metrics.NewPendingPods()}, ctx: context.Background(), namespaces: anyNamespace{}}
	p.ready.Store(true)
	return p, infos
}
