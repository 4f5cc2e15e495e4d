package plugin

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
)

// TestGPUMetrics: per GPU what pods hold, idle GPUs by model, and pending
// GPU pods by the reason most nodes gave.
func TestGPUMetrics(t *testing.T) {
	c, key := testCache(t)
	registerGPUMetrics(c)
	logger := klog.Background()
	c.updateNode(logger, testNode(t, "n1", "t4x4"))
	c.updateLease(testLease("n1", testNow), false)
	r := wholeRequest(t, c, 1)
	a := testPod("a")
	alloc, err := c.reserve(a, "n1", r, noHost, noHost, nil)
	if err != nil {
		t.Fatal(err)
	}
	bound := boundWith(t, key, a, alloc)
	c.updatePod(logger, bound)
	held := alloc.Containers[0].Devices[0].ID

	// Two pods waiting: one refused by most nodes for free GPUs, one
	// with an invalid request.
	p := c.pending.start("uid-w")
	p.count(filterReason(&devicescheduler.NotFitError{Reason: devicescheduler.ReasonNotEnoughFree}))
	p.count(filterReason(&devicescheduler.NotFitError{Reason: devicescheduler.ReasonNotEnoughFree}))
	p.count(filterReason(errors.Join(errStale)))
	c.pending.refuse("uid-bad", pendingInvalidRequest)
	c.pending.start("uid-x")
	c.pending.remove("uid-x")

	g := &gpuCollector{}
	g.cache.Store(c)
	var want strings.Builder
	want.WriteString(`
# HELP kubegpu_scheduler_idle_gpus [ALPHA] Allocatable GPUs no pod holds any share of, by model.
# TYPE kubegpu_scheduler_idle_gpus gauge
kubegpu_scheduler_idle_gpus{model="Tesla T4"} 3
# HELP kubegpu_scheduler_gpus [ALPHA] Allocatable GPUs (and MIG instances) of nodes with a usable inventory, by model.
# TYPE kubegpu_scheduler_gpus gauge
kubegpu_scheduler_gpus{model="Tesla T4"} 4
# HELP kubegpu_scheduler_pending_gpu_pods [ALPHA] ` + pendingHelp + `
# TYPE kubegpu_scheduler_pending_gpu_pods gauge
`)
	for r, name := range pendingReasonNames {
		n := "0"
		if r == pendingNotEnoughFree || r == pendingInvalidRequest {
			n = "1"
		}
		want.WriteString(`kubegpu_scheduler_pending_gpu_pods{reason="` + name + `"} ` + n + "\n")
	}
	if err := testutil.CustomCollectAndCompare(g, strings.NewReader(want.String()),
		"kubegpu_scheduler_gpus", "kubegpu_scheduler_idle_gpus", "kubegpu_scheduler_pending_gpu_pods"); err != nil {
		t.Error(err)
	}
	// The held GPU, whole; the others free.
	g2 := &gpuCollector{}
	g2.cache.Store(c)
	reg := metrics.NewKubeRegistry()
	reg.CustomMustRegister(g2)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kubegpu_scheduler_gpu_allocated_cores_percent" {
			continue
		}
		if len(mf.GetMetric()) != 4 {
			t.Errorf("%d GPUs reported, want 4", len(mf.GetMetric()))
		}
		for _, m := range mf.GetMetric() {
			want := 0.0
			for _, l := range m.GetLabel() {
				if l.GetName() == "device" && l.GetValue() == held {
					want = 100
				}
			}
			if got := m.GetGauge().GetValue(); got != want {
				t.Errorf("%v: %v%% allocated, want %v", m.GetLabel(), got, want)
			}
		}
	}

	// Seen running after its binding: observed once.
	bound.Status.Phase = corev1.PodRunning
	bound.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(testNow.Add(-3e9))}}
	c.started = testNow.Add(-1e10)
	before, _ := testutil.GetHistogramMetricCount(allocationToRunning.ObserverMetric)
	c.updatePod(logger, bound)
	c.updatePod(logger, bound)
	if after, _ := testutil.GetHistogramMetricCount(allocationToRunning.ObserverMetric); after != before+1 {
		t.Errorf("allocation-to-running observed %d times, want once", after-before)
	}
}
