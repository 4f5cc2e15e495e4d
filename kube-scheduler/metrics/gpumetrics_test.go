package metrics

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/plugins/simgpu"
	"github.com/kubegpu/kubegpu/types"
)

// TestGPUMetrics: per GPU what pods hold, idle GPUs by model, and pending
// GPU pods by the reason most nodes gave.
func TestGPUMetrics(t *testing.T) {
	// The cache started before the pods' bindings.
	clock := testNow.Add(-1e10)
	c, key := testCache(t, func(cfg *devicecache.Config) {
		cfg.Now = func() time.Time {
			now := clock
			clock = testNow
			return now
		}
	})
	RegisterGPU(t.Context(), c, pendingOf(c), true, 0)
	logger := klog.Background()
	c.UpdateNode(logger, testNode(t, "n1", "t4x4"))
	c.UpdateLease(testLease("n1", testNow), false)
	// A node that is not Ready: its GPUs are not counted among the
	// cluster's (it gets no pods).
	dead := testNode(t, "dead", "t4x4")
	dead.Status.Conditions[0].Status = corev1.ConditionFalse
	c.UpdateNode(logger, dead)
	c.UpdateLease(testLease("dead", testNow), false)
	r := wholeRequest(t, c, 1)
	a := testPod("a")
	alloc, err := c.Reserve(a, "n1", r, noHost, noHost, nil)
	if err != nil {
		t.Fatal(err)
	}
	bound := boundWith(t, key, a, alloc)
	c.UpdatePod(logger, bound)
	held := alloc.Containers[0].Devices[0].ID

	// Two pods waiting: one refused by most nodes for free GPUs, one
	// with an invalid request.
	p := pendingOf(c).Start("uid-w")
	p.Count(devicecache.ReasonOf(&devicescheduler.NotFitError{Reason: devicescheduler.ReasonNotEnoughFree}))
	p.Count(devicecache.ReasonOf(&devicescheduler.NotFitError{Reason: devicescheduler.ReasonNotEnoughFree}))
	p.Count(devicecache.ReasonOf(errors.Join(devicecache.ErrStale)))
	pendingOf(c).Refuse("uid-bad", devicecache.ReasonInvalidRequest)
	pendingOf(c).Start("uid-x")
	pendingOf(c).Remove("uid-x")
	// Deleted between the queue's pop and PreFilter: its delete event came
	// first. The scrape drops it, since the informer no longer holds it.
	pendingOf(c).Start("uid-gone")
	setListPods(c, func() ([]*corev1.Pod, error) {
		return []*corev1.Pod{{ObjectMeta: metav1.ObjectMeta{UID: "uid-w"}}, {ObjectMeta: metav1.ObjectMeta{UID: "uid-bad"}}, bound}, nil
	})

	g := &gpuCollector{}
	g.report(c, false)
	var want strings.Builder
	want.WriteString(`
# HELP kubegpu_scheduler_allocated_gpus [ALPHA] GPUs' worth of compute that pods hold on live nodes with a usable inventory, by model (a whole GPU counts 1, a 25% slice 0.25).
# TYPE kubegpu_scheduler_allocated_gpus gauge
kubegpu_scheduler_allocated_gpus{model="Tesla T4"} 1
# HELP kubegpu_scheduler_idle_gpus [ALPHA] Allocatable GPUs of live nodes that no pod holds any share of, by model.
# TYPE kubegpu_scheduler_idle_gpus gauge
kubegpu_scheduler_idle_gpus{model="Tesla T4"} 3
# HELP kubegpu_scheduler_gpus [ALPHA] Allocatable GPUs (and MIG instances) of live nodes with a usable inventory, by model.
# TYPE kubegpu_scheduler_gpus gauge
kubegpu_scheduler_gpus{model="Tesla T4"} 4
# HELP kubegpu_scheduler_nodes_not_live [ALPHA] Nodes with a device inventory that get no GPU pods because they are not live: NotReady, or their Lease not seen renewed within heartbeatStaleness.
# TYPE kubegpu_scheduler_nodes_not_live gauge
kubegpu_scheduler_nodes_not_live 1
# HELP kubegpu_scheduler_pending_gpu_pods [ALPHA] ` + pendingHelp + `
# TYPE kubegpu_scheduler_pending_gpu_pods gauge
`)
	for r := range devicecache.NumReasons {
		name := r.String()
		n := "0"
		if r == devicecache.ReasonNotEnoughFree || r == devicecache.ReasonInvalidRequest {
			n = "1"
		}
		want.WriteString(`kubegpu_scheduler_pending_gpu_pods{reason="` + name + `"} ` + n + "\n")
	}
	if err := testutil.CustomCollectAndCompare(g, strings.NewReader(want.String()),
		"kubegpu_scheduler_gpus", "kubegpu_scheduler_allocated_gpus", "kubegpu_scheduler_idle_gpus", "kubegpu_scheduler_nodes_not_live", "kubegpu_scheduler_pending_gpu_pods"); err != nil {
		t.Error(err)
	}
	// The held GPU, whole; the others free.
	g2 := &gpuCollector{}
	g2.report(c, false)
	reg := k8smetrics.NewKubeRegistry()
	reg.CustomMustRegister(g2)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kubegpu_scheduler_gpu_allocated_cores_percent" {
			continue
		}
		if len(mf.GetMetric()) != 8 {
			t.Errorf("%d GPUs reported, want the two nodes' 8", len(mf.GetMetric()))
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			want := 0.0
			if labels["node"] == "n1" && labels["device"] == held {
				want = 100
			}
			if got := m.GetGauge().GetValue(); got != want {
				t.Errorf("%v: %v%% allocated, want %v", m.GetLabel(), got, want)
			}
		}
	}

	// gpuMetrics: PerModel: the per-model series, none per GPU but the
	// unhealthy GPUs' (an alert is on them).
	sick := testNode(t, "sick", "t4x4")
	topo, _ := simgpu.Preset("t4x4")
	inv := simgpu.Inventory(topo, "sick")
	inv.Devices[0].Health = types.Unhealthy
	if err := objects.SetNodeInventory(sick, inv); err != nil {
		t.Fatal(err)
	}
	c.UpdateNode(logger, sick)
	c.UpdateLease(testLease("sick", testNow), false)
	g3 := &gpuCollector{}
	g3.report(c, true)
	reg3 := k8smetrics.NewKubeRegistry()
	reg3.CustomMustRegister(g3)
	mfs, err = reg3.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, perGPU := range []string{"kubegpu_scheduler_gpu_allocated_cores_percent", "kubegpu_scheduler_gpu_allocated_memory_bytes",
		"kubegpu_scheduler_gpu_memory_bytes", "kubegpu_scheduler_gpu_pods", "kubegpu_scheduler_gpu_info"} {
		if names[perGPU] {
			t.Errorf("PerModel: %s reported", perGPU)
		}
	}
	if !names["kubegpu_scheduler_gpus"] || !names["kubegpu_scheduler_allocated_gpus"] || !names["kubegpu_scheduler_idle_gpus"] || !names["kubegpu_scheduler_pending_gpu_pods"] || !names["kubegpu_scheduler_gpu_unhealthy"] {
		t.Errorf("PerModel: per-model series missing: %v", names)
	}

	// Seen running after its binding: observed once.
	bound.Status.Phase = corev1.PodRunning
	bound.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(testNow.Add(-3e9))}}
	before, _ := testutil.GetHistogramMetricCount(allocationToRunning.ObserverMetric)
	for range 2 { // as the pod informer's handler does
		c.UpdatePod(logger, bound)
		ObserveRunning(c, bound)
	}
	if after, _ := testutil.GetHistogramMetricCount(allocationToRunning.ObserverMetric); after != before+1 {
		t.Errorf("allocation-to-running observed %d times, want once", after-before)
	}
}

// TestGPUPodsWithoutAllocation: bound GPU pods that have not finished and
// hold no allocation the cache counts (bound by another scheduler, say a
// stock kube-scheduler that holds the Lease) are counted at each scrape;
// pods with their allocation, CPU pods, pending and finished pods are not.
func TestGPUPodsWithoutAllocation(t *testing.T) {
	c, key := testCache(t)
	logger := klog.Background()
	c.UpdateNode(logger, testNode(t, "n1", "t4x4"))
	c.UpdateLease(testLease("n1", testNow), false)
	counted := gpuPod("counted", 1, 0, testNow)
	alloc, err := c.Reserve(counted, "n1", wholeRequest(t, c, 1), noHost, noHost, nil)
	if err != nil {
		t.Fatal(err)
	}
	counted = boundWith(t, key, counted, alloc)
	c.UpdatePod(logger, counted)
	bindBy := func(p *corev1.Pod, node string) *corev1.Pod {
		p.Spec.NodeName = node
		return p
	}
	stock := bindBy(gpuPod("stock", 1, 0, testNow), "n1")
	slice := bindBy(gpuPod("slice", 1, 50, testNow), "n1")
	forged := bindBy(gpuPod("forged", 1, 0, testNow), "n1")
	forged.Annotations = map[string]string{"kubegpu.io/allocation": "not an allocation"}
	done := bindBy(gpuPod("done", 1, 0, testNow), "n1")
	done.Status.Phase = corev1.PodSucceeded
	cpu := bindBy(testPod("cpu"), "n1")
	pending := gpuPod("pending", 1, 0, testNow)
	pods := []*corev1.Pod{counted, stock, slice, forged, done, cpu, pending}
	for _, p := range pods {
		c.UpdatePod(logger, p)
	}
	setListPods(c, func() ([]*corev1.Pod, error) { return pods, nil })
	g := &gpuCollector{}
	g.report(c, false)
	want := `
# HELP kubegpu_scheduler_gpu_pods_without_allocation [ALPHA] Bound GPU pods that have not finished and hold no allocation the scheduler counts: bound by another scheduler (a stock kube-scheduler holding the Lease in mode only), created with spec.nodeName, or whose allocation was refused. Their containers get no GPUs.
# TYPE kubegpu_scheduler_gpu_pods_without_allocation gauge
kubegpu_scheduler_gpu_pods_without_allocation 3
`
	if err := testutil.CustomCollectAndCompare(g, strings.NewReader(want), "kubegpu_scheduler_gpu_pods_without_allocation"); err != nil {
		t.Error(err)
	}
}

// TestModelLabelsBounded: nodes that keep publishing new model names add
// at most maxModels values of the model label (then "other"), whatever
// the series they are on.
func TestModelLabelsBounded(t *testing.T) {
	c, _ := testCache(t)
	logger := klog.Background()
	reg := collectorRegistry(c)
	models := map[string]bool{}
	for i := range 3 * maxModels {
		n := testNode(t, "n1", "t4x4")
		topo, _ := simgpu.Preset("t4x4")
		inv := simgpu.Inventory(topo, "n1")
		for d := range inv.Devices {
			inv.Devices[d].Model = fmt.Sprintf("Model %d-%d", i, d)
			inv.Devices[d].UUID = fmt.Sprintf("GPU-%d-%d", i, d)
		}
		inv.Devices[0].Health = types.Unhealthy
		if err := objects.SetNodeInventory(n, inv); err != nil {
			t.Fatal(err)
		}
		c.UpdateNode(logger, n)
		c.UpdateLease(testLease("n1", testNow), false)
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "model" && l.GetValue() != "mixed" {
						models[l.GetValue()] = true
					}
				}
			}
		}
	}
	if len(models) > maxModels+1 || !models[otherModel] {
		t.Errorf("%d values of the model label (other: %v), want at most %d and other", len(models), models[otherModel], maxModels+1)
	}
}

// TestDeletedNodeSeriesGone: a deleted node's per-GPU series leave the
// scrape with it.
func TestDeletedNodeSeriesGone(t *testing.T) {
	c, _ := testCache(t)
	logger := klog.Background()
	c.UpdateNode(logger, testNode(t, "n1", "t4x4"))
	c.UpdateNode(logger, testNode(t, "gone", "t4x4"))
	reg := collectorRegistry(c)
	seriesOf := func() map[string]int {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "node" {
						out[l.GetValue()]++
					}
				}
			}
		}
		return out
	}
	if got := seriesOf(); got["gone"] == 0 || got["gone"] != got["n1"] {
		t.Fatalf("series by node before the deletion: %v", got)
	}
	c.DeleteNode("gone")
	if got := seriesOf(); got["gone"] != 0 || got["n1"] == 0 {
		t.Errorf("series by node after the deletion: %v, want none of gone", got)
	}
}

// TestGPUMetricsFollowTheScheduler: the GPU metrics report the cache of the
// last scheduler made until its context ends; then they report nothing
// and keep nothing of it alive. A later scheduler's cache stays when an
// earlier one's context ends.
func TestGPUMetricsFollowTheScheduler(t *testing.T) {
	first, _ := testCache(t)
	second, _ := testCache(t)
	ctx1, stop1 := context.WithCancel(context.Background())
	ctx2, stop2 := context.WithCancel(context.Background())
	defer stop2()
	firstEnded := RegisterGPU(ctx1, first, pendingOf(first), true, 0)
	RegisterGPU(ctx2, second, pendingOf(second), true, 0)
	stop1()
	select {
	case <-firstEnded:
	case <-time.After(10 * time.Second):
		t.Fatal("the first scheduler's end was not handled within 10 s")
	}
	if got := theCollector.reporting(); got != second {
		t.Fatal("an earlier scheduler's end took the running one's cache out of the metrics")
	}
	// A scrape of the running one: its per-GPU label pairs are kept.
	second.UpdateNode(klog.Background(), testNode(t, "n1", "t4x4"))
	second.UpdateLease(testLease("n1", testNow), false)
	ch := make(chan k8smetrics.Metric, 100)
	go func() {
		theCollector.CollectWithStability(ch)
		close(ch)
	}()
	for range ch {
	}
	theCollector.mu.Lock()
	kept := len(theCollector.series.nodes)
	theCollector.mu.Unlock()
	if kept != 1 {
		t.Fatalf("%d nodes' series kept after a scrape, want 1", kept)
	}
	stop2()
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		theCollector.mu.Lock()
		defer theCollector.mu.Unlock()
		return theCollector.reporting() == nil && len(theCollector.series.nodes) == 0, nil
	}); err != nil {
		t.Fatal("a stopped scheduler's cache is still in the metrics, or its nodes' series are kept")
	}
}

// TestGPUSeriesAcrossScrapes: the per-GPU series kept between scrapes say
// what the cache holds at each scrape while nodes come and go (names
// sorting anywhere among the others), change their inventory (a GPU
// turns unhealthy) and pods take and free GPUs: every GPU's allocation is
// reported on its own labels, never on another GPU's.
func TestGPUSeriesAcrossScrapes(t *testing.T) {
	c, _ := testCache(t)
	logger := klog.Background()
	reg := collectorRegistry(c)
	r := wholeRequest(t, c, 1)
	rng := rand.New(rand.NewPCG(1, 2))
	names := []string{"m", "c", "x", "a", "p", "f"}
	live := map[string]bool{}
	pods := 0
	for step := range 60 {
		name := names[rng.IntN(len(names))]
		switch op := rng.IntN(4); {
		case op == 0 && live[name]:
			c.DeleteNode(name)
			delete(live, name)
		case op == 1 && live[name]:
			// A GPU turns unhealthy: a new inventory.
			topo, _ := simgpu.Preset("t4x4")
			inv := simgpu.Inventory(topo, name)
			inv.Devices[rng.IntN(len(inv.Devices))].Health = types.Unhealthy
			n := testNode(t, name, "t4x4")
			if err := objects.SetNodeInventory(n, inv); err != nil {
				t.Fatal(err)
			}
			c.UpdateNode(logger, n)
		case live[name]:
			pods++
			_, _ = c.Reserve(testPod(fmt.Sprint("p", pods)), name, r, noHost, noHost, nil)
		default:
			c.UpdateNode(logger, testNode(t, name, "t4x4"))
			c.UpdateLease(testLease(name, testNow), false)
			live[name] = true
		}
		// What the cache holds, per node and device.
		want := map[string]float64{}
		for _, v := range c.Nodes(testNow, false) {
			if v.Devices == nil {
				continue
			}
			st, inv := v.State, v.Devices.Inventory()
			for d := range inv.Devices {
				if v.Devices.Allocatable()&(1<<d) == 0 {
					continue
				}
				cores := float64(1000-st.MilliFree[d]) / 10
				if st.Exclusive&(1<<d) != 0 {
					cores = 100
				}
				want[v.Name+"/"+inv.Devices[d].ID] = cores
			}
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "kubegpu_scheduler_gpu_allocated_cores_percent" {
				continue
			}
			for _, m := range mf.GetMetric() {
				l := map[string]string{}
				for _, lp := range m.GetLabel() {
					l[lp.GetName()] = lp.GetValue()
				}
				got[l["node"]+"/"+l["device"]] = m.GetGauge().GetValue()
			}
		}
		if !maps.Equal(got, want) {
			t.Fatalf("step %d: allocated cores per GPU %v, want %v", step, got, want)
		}
	}
	if pods == 0 {
		t.Fatal("no pod was placed: the test exercised nothing")
	}
}

// TestGPUScrapeReused: scrapes within the target's maxAge of the last one
// computed send its values again; later ones, or a scrape after the clock
// went back, compute afresh. The pending pods are counted at every scrape.
func TestGPUScrapeReused(t *testing.T) {
	for _, perModel := range []bool{true, false} {
		t.Run(fmt.Sprintf("perModel=%v", perModel), func(t *testing.T) { testGPUScrapeReused(t, perModel) })
	}
}

func testGPUScrapeReused(t *testing.T, perModel bool) {
	now := testNow
	c, key := testCache(t, func(cfg *devicecache.Config) { cfg.Now = func() time.Time { return now } })
	logger := klog.Background()
	c.UpdateNode(logger, testNode(t, "n1", "t4x4"))
	c.UpdateLease(testLease("n1", testNow), false)
	g := &gpuCollector{}
	g.report(c, perModel)
	g.target.Load().maxAge = 5 * time.Second
	reg := k8smetrics.NewKubeRegistry()
	reg.CustomMustRegister(g)
	compare := func(idle, pending int) {
		t.Helper()
		var want strings.Builder
		fmt.Fprintf(&want, `
# HELP kubegpu_scheduler_idle_gpus [ALPHA] Allocatable GPUs of live nodes that no pod holds any share of, by model.
# TYPE kubegpu_scheduler_idle_gpus gauge
kubegpu_scheduler_idle_gpus{model="Tesla T4"} %d
# HELP kubegpu_scheduler_pending_gpu_pods [ALPHA] %s
# TYPE kubegpu_scheduler_pending_gpu_pods gauge
`, idle, pendingHelp)
		for r := range devicecache.NumReasons {
			name := r.String()
			n := 0
			if r == devicecache.ReasonInvalidRequest {
				n = pending
			}
			fmt.Fprintf(&want, "kubegpu_scheduler_pending_gpu_pods{reason=%q} %d\n", name, n)
		}
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want.String()), "kubegpu_scheduler_idle_gpus", "kubegpu_scheduler_pending_gpu_pods"); err != nil {
			t.Error(err)
		}
		if perModel {
			return
		}
		// The per-GPU series, sent again from the same computation.
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		series, held := 0, 0.0
		for _, mf := range mfs {
			if mf.GetName() == "kubegpu_scheduler_gpu_pods" {
				for _, m := range mf.GetMetric() {
					series++
					held += m.GetGauge().GetValue()
				}
			}
		}
		if series != 4 || held != float64(4-idle) {
			t.Errorf("%d per-GPU series holding %v pods, want 4 holding %d", series, held, 4-idle)
		}
	}
	w, v := testPod("w"), testPod("v")
	setListPods(c, func() ([]*corev1.Pod, error) { return []*corev1.Pod{w, v}, nil })
	pendingOf(c).Refuse(w.UID, devicecache.ReasonInvalidRequest)
	compare(4, 1)
	a := testPod("a")
	alloc, err := c.Reserve(a, "n1", wholeRequest(t, c, 1), noHost, noHost, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.UpdatePod(logger, boundWith(t, key, a, alloc))
	pendingOf(c).Refuse(v.UID, devicecache.ReasonInvalidRequest)
	now = now.Add(4 * time.Second)
	compare(4, 2) // the devices' values as computed 4 s ago
	now = now.Add(time.Second)
	compare(3, 2)
	b := testPod("b")
	if alloc, err = c.Reserve(b, "n1", wholeRequest(t, c, 1), noHost, noHost, nil); err != nil {
		t.Fatal(err)
	}
	c.UpdatePod(logger, boundWith(t, key, b, alloc))
	now = now.Add(-time.Second)
	compare(2, 2)
}

// report makes the collector report c (nil: nothing).
func (g *gpuCollector) report(c *devicecache.Cache, perModel bool) {
	if c == nil {
		g.target.Store(nil)
		return
	}
	g.target.Store(&collectorTarget{cache: c, pending: pendingOf(c), perModel: perModel})
}

// reporting is the cache the collector reports, or nil.
func (g *gpuCollector) reporting() *devicecache.Cache {
	if t := g.target.Load(); t != nil {
		return t.cache
	}
	return nil
}

// collectorRegistry is a registry of its own with a collector reporting c
// per GPU.
func collectorRegistry(c *devicecache.Cache) k8smetrics.KubeRegistry {
	g := &gpuCollector{}
	g.report(c, false)
	reg := k8smetrics.NewKubeRegistry()
	reg.CustomMustRegister(g)
	return reg
}
