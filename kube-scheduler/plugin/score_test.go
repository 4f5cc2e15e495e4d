package plugin

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

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
	"github.com/kubegpu/kubegpu/types"
)

// TestScoreTakesFilterScore: Score returns the score Filter found for a
// node in the same cycle, without evaluating the node again (the node
// filled up in between: Reserve checks again), evaluates a node Filter did
// not score, and evaluates again once Reserve has released the scores.
func TestScoreTakesFilterScore(t *testing.T) {
	c, _ := testCache(t)
	logger := klog.Background()
	infos := map[string]*framework.NodeInfo{}
	for _, name := range []string{"n1", "n2"} {
		n := testNode(t, name, "dgx1")
		n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("96"), corev1.ResourceMemory: resource.MustParse("768Gi")}
		c.UpdateNode(logger, n)
		c.UpdateLease(testLease(name, testNow), false)
		infos[name] = framework.NewNodeInfo()
		infos[name].SetNode(n)
	}
	p := &Plugin{args: &Args{PodsWithoutDevices: config.PodsWithoutDevicesScore, Enforcement: types.EnforcementBestEffort}, shared: &shared{engine: c.Engine(), cache: c, pending: metrics.NewPendingPods()}, ctx: context.Background(), namespaces: anyNamespace{}}
	p.ready.Store(true)
	ctx, pod, cs := context.Background(), gpuPod("p", 1, 0, testNow), framework.NewCycleState()
	nodes := []fwk.NodeInfo{infos["n1"], infos["n2"]}
	if _, st := p.PreFilter(ctx, cs, pod, nodes); !st.IsSuccess() {
		t.Fatal(st)
	}
	var pl devicescheduler.Placement
	capacity, free := nodeHost(infos["n1"])
	want, err := c.Evaluate(infos["n1"].Node(), &getState(cs).eval, capacity, free, &pl)
	if err != nil {
		t.Fatal(err)
	}
	if st := p.Filter(ctx, cs, pod, infos["n1"]); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := p.PreScore(ctx, cs, pod, nodes); !st.IsSuccess() {
		t.Fatal(st)
	}
	// n1 fills up after Filter.
	if _, err := c.Reserve(testPod("filler"), "n1", wholeRequest(t, c, 8), noHost, noHost, nil); err != nil {
		t.Fatal(err)
	}
	if got, st := p.Score(ctx, cs, pod, infos["n1"]); !st.IsSuccess() || got != want {
		t.Errorf("Score(n1) = %d, %v; want Filter's %d", got, st, want)
	}
	capacity, free = nodeHost(infos["n2"])
	want2, err := c.Evaluate(infos["n2"].Node(), &getState(cs).eval, capacity, free, &pl)
	if err != nil {
		t.Fatal(err)
	}
	if got, st := p.Score(ctx, cs, pod, infos["n2"]); !st.IsSuccess() || got != want2 {
		t.Errorf("Score(n2), not filtered = %d, %v; want %d", got, st, want2)
	}
	getState(cs).scores.release()
	if got, _ := p.Score(ctx, cs, pod, infos["n1"]); got != math.MinInt64 {
		t.Errorf("Score(n1) after release = %d; want %d (evaluated again: full)", got, int64(math.MinInt64))
	}
	// The full node's refusal comes classified, from the memo too.
	capacity, free = nodeHost(infos["n1"])
	for range 2 {
		if _, err := c.Evaluate(infos["n1"].Node(), &getState(cs).eval, capacity, free, &pl); err == nil {
			t.Fatal("a full node fits a GPU pod")
		} else if r := (*devicecache.Refusal)(nil); !errors.As(err, &r) {
			t.Errorf("refusal of a full node %T (%v), want it classified", err, err)
		}
	}
}

func TestNormalizeByRank(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   []int64
		want []int64
	}{
		{"one", []int64{5}, []int64{100}},
		{"ties stay tied", []int64{7, 7, 3}, []int64{100, 100, 99}},
		{"order kept", []int64{1 << 40, -5, 1<<40 + 1, 0}, []int64{99, 0, 100, 50}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var scores fwk.NodeScoreList
			for i, s := range tt.in {
				scores = append(scores, fwk.NodeScore{Name: string(rune('a' + i)), Score: s})
			}
			normalizeByRank(scores)
			for i := range scores {
				if scores[i].Score != tt.want[i] {
					t.Errorf("scores %v normalised to %v, want %v", tt.in, scores, tt.want)
					break
				}
			}
		})
	}
	// Many nodes: the best one alone gets the maximum, all stay in range.
	var scores fwk.NodeScoreList
	for i := 0; i < 1000; i++ {
		scores = append(scores, fwk.NodeScore{Score: int64(i)})
	}
	normalizeByRank(scores)
	for i, s := range scores {
		if s.Score < 0 || s.Score > fwk.MaxScore || (s.Score == fwk.MaxScore) != (i == 999) || (i > 0 && s.Score < scores[i-1].Score) {
			t.Fatalf("node %d of 1000 normalised to %d", i, s.Score)
		}
	}
}

func TestNormalizeHostOnly(t *testing.T) {
	scores := fwk.NodeScoreList{{Name: "gpu-busy", Score: -3}, {Name: "cpu-a", Score: noDevices}, {Name: "gpu-idle", Score: -90}, {Name: "cpu-b", Score: noDevices}, {Name: "gpu-full", Score: 0}}
	normalizeHostOnly(scores)
	want := map[string]int64{"cpu-a": 100, "cpu-b": 100, "gpu-full": 50, "gpu-busy": 49, "gpu-idle": 0}
	for _, s := range scores {
		if s.Score != want[s.Name] {
			t.Errorf("normalised %v, want %v", scores, want)
			break
		}
	}
}

// TestFilterLeavesHostResources: when NodeResourcesFit filters the cycle
// (its PreFilter ran), a node short of CPU for the pod passes KubeGPU's
// Filter, also with a pod nominated to it, for NodeResourcesFit to refuse
// with its own reason and queueing hints; the pod's pending reason still
// counts it, Score ranks it last and Reserve refuses it. Without
// NodeResourcesFit, or with its PreFilter but not its Filter in the
// profile, KubeGPU refuses it itself.
func TestFilterLeavesHostResources(t *testing.T) {
	c, _ := testCache(t)
	logger := klog.Background()
	n := testNode(t, "n1", "dgx1")
	n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("768Gi")}
	c.UpdateNode(logger, n)
	c.UpdateLease(testLease("n1", testNow), false)
	busy := testPod("busy")
	busy.Spec.NodeName = "n1"
	busy.Spec.Containers = []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}}}}
	ni := framework.NewNodeInfo(busy)
	ni.SetNode(n)
	pod := gpuPod("p", 1, 0, testNow)
	pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
	ctx := context.Background()
	for _, tc := range []struct {
		preFilter bool // NodeResourcesFit's PreFilter ran
		filters   *schedconfig.Plugins
	}{
		{true, &schedconfig.Plugins{Filter: schedconfig.PluginSet{Enabled: []schedconfig.Plugin{{Name: Name}, {Name: names.NodeResourcesFit}}}}},
		{true, nil}, // a handle that cannot list its plugins: taken to filter
		{false, nil},
		{true, &schedconfig.Plugins{Filter: schedconfig.PluginSet{Enabled: []schedconfig.Plugin{{Name: Name}}}}},
	} {
		fit := tc.preFilter && (tc.filters == nil || len(tc.filters.Filter.Enabled) == 2)
		p := &Plugin{args: &Args{PodsWithoutDevices: config.PodsWithoutDevicesScore, Enforcement: types.EnforcementBestEffort}, shared: &shared{engine: c.Engine(), cache: c, pending: metrics.NewPendingPods()}, ctx: context.Background(), namespaces: anyNamespace{}}
		p.ready.Store(true)
		if tc.filters != nil {
			p.handle = listedHandle{plugins: tc.filters}
		}
		p.ready.Store(true)
		cs := framework.NewCycleState()
		if tc.preFilter {
			cs.Write(fitPreFilterKey, &hostOnlyState{})
		}
		if _, st := p.PreFilter(ctx, cs, pod, nil); !st.IsSuccess() {
			t.Fatal(st)
		}
		st := p.Filter(ctx, cs, pod, ni)
		switch {
		case fit && !st.IsSuccess():
			t.Errorf("Filter on a node short of CPU, NodeResourcesFit filtering = %v, want success", st)
		case !fit && (st.Code() != fwk.Unschedulable || !strings.Contains(st.Message(), "GPUs:")):
			t.Errorf("Filter on a node short of CPU, without NodeResourcesFit (PreFilter %v, profile's filters %v) = %v, want refused for its CPU", tc.preFilter, tc.filters, st)
		}
		if got := getState(cs).pending.Reason(); got != devicecache.ReasonHostResources {
			t.Errorf("pending reason %s, want %s", got, devicecache.ReasonHostResources)
		}
		if !fit {
			continue
		}
		if got, _ := p.Score(ctx, cs, pod, ni); got != math.MinInt64 {
			t.Errorf("Score = %d, want the lowest", got)
		}
		// A pod nominated to the node: the same.
		nominated := gpuPod("nominated", 1, 0, testNow)
		pi, _ := framework.NewPodInfo(nominated)
		withNominated := cs.Clone()
		if st := p.AddPod(ctx, withNominated, pod, pi, ni); !st.IsSuccess() {
			t.Fatal(st)
		}
		if st := p.Filter(ctx, withNominated, pod, ni); !st.IsSuccess() {
			t.Errorf("Filter with a pod nominated to a node short of CPU = %v, want success", st)
		}
		capacity, free := nodeHost(ni)
		if _, err := c.Reserve(pod, "n1", getState(cs).request, capacity, free, nil); err == nil {
			t.Error("Reserve took a node short of CPU")
		}
		// A node short of CPU whose GPUs could never hold the pod stays
		// refused here, as unresolvable: preemption passes it over.
		big := gpuPod("big", 16, 0, testNow)
		big.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
		bcs := framework.NewCycleState()
		bcs.Write(fitPreFilterKey, &hostOnlyState{})
		if _, st := p.PreFilter(ctx, bcs, big, nil); !st.IsSuccess() {
			t.Fatal(st)
		}
		if st := p.Filter(ctx, bcs, big, ni); st.Code() != fwk.UnschedulableAndUnresolvable {
			t.Errorf("Filter of a 16-GPU pod on an 8-GPU node short of CPU = %v, want UnschedulableAndUnresolvable", st)
		}
	}
}

// listedHandle is a framework handle that lists its plugins and does
// nothing else (fitFilters calls nothing else).
type listedHandle struct {
	fwk.Handle
	plugins *schedconfig.Plugins
}

func (h listedHandle) ListPlugins() *schedconfig.Plugins { return h.plugins }

func (h listedHandle) ProfileName() string { return "test" }
