package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/kubeinterface"
)

// priorityClass creates a PriorityClass for the test (cluster-admin
// installs them, as it would on a real cluster).
func priorityClass(ctx context.Context, t *testing.T, name string, value int32) {
	t.Helper()
	_, err := cluster.Client.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.SchedulingV1().PriorityClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// finishTerminating plays the kubelet of nodes without one: it removes the
// pods of ns being deleted, as a kubelet does once their containers
// stopped, while running is set.
func finishTerminating(ctx context.Context, t *testing.T, ns string, running *atomic.Bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go func() {
		for ctx.Err() == nil {
			time.Sleep(200 * time.Millisecond)
			if !running.Load() {
				continue
			}
			list, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				continue
			}
			// One at a time, as containers stop: pods scheduled meanwhile
			// see some of a preemptor's GPUs free and some not yet.
			for _, p := range list.Items {
				if p.DeletionTimestamp != nil {
					_ = cluster.Client.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
					break
				}
			}
		}
	}()
}

// preemptionNode is a one-node setup for preemption: the node (prefix-0,
// of preset), a namespace, PriorityClasses prefix-low (10) and prefix-high
// (1000), terminating pods finished while finishing is set, and the low
// pods made by low(i) for i < n placed there, with the GPU each got.
type preemptionNode struct {
	ns        string
	finishing *atomic.Bool
	gpuOf     map[string]string
	node      string
	prefix    string
}

func setUpPreemption(ctx context.Context, t *testing.T, prefix, preset string, n int, low func(i int) *corev1.Pod) *preemptionNode {
	t.Helper()
	startScheduler(ctx, t)
	addNodes(ctx, t, prefix, preset, 1)
	pn := &preemptionNode{ns: namespace(ctx, t, prefix), finishing: &atomic.Bool{}, gpuOf: map[string]string{}, node: prefix + "-0", prefix: prefix}
	priorityClass(ctx, t, "kubegpu-test-"+prefix+"-low", 10)
	priorityClass(ctx, t, "kubegpu-test-"+prefix+"-high", 1000)
	pn.finishing.Store(true)
	finishTerminating(ctx, t, pn.ns, pn.finishing)
	for i := range n {
		createPods(ctx, t, pn.ns, pn.onNode(low(i), "low"))
	}
	lows := settle(ctx, t, pn.ns, time.Second, time.Minute)
	if bound(lows) != n {
		t.Fatalf("%d of %d low-priority pods bound", bound(lows), n)
	}
	for i := range lows {
		pn.gpuOf[lows[i].Name] = devicesOf(t, &lows[i])[0]
	}
	return pn
}

// onNode pins p to the node, with the low or high PriorityClass.
func (pn *preemptionNode) onNode(p *corev1.Pod, class string) *corev1.Pod {
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": pn.node}
	p.Spec.PriorityClassName = "kubegpu-test-" + pn.prefix + "-" + class
	return p
}

// TestSchedulerPreemptsForDevices: low-priority pods fill a DGX-1, one GPU
// each. A high-priority 4-GPU pod that needs an NVLink quad preempts
// exactly the four pods of one quad and runs on that quad; a low-priority
// pod that comes meanwhile does not take the freed GPUs. A pod that no
// eviction could help (a GPU model the node lacks) evicts nothing and
// says why.
func TestSchedulerPreemptsForDevices(t *testing.T) {
	ctx := context.Background()
	pn := setUpPreemption(ctx, t, "preempt", "dgx1", 8, func(i int) *corev1.Pod { return gpuPod(fmt.Sprint("low-", i), 1, 0, 0, nil) })
	ns, finishing, gpuOf, onNode := pn.ns, pn.finishing, pn.gpuOf, pn.onNode

	// The preemptor; its victims are removed only once a latecomer
	// has come, to see that it does not take the preemptor's GPUs.
	finishing.Store(false)
	createPods(ctx, t, ns, onNode(gpuPod("high", 4, 0, 0, map[string]string{kubeinterface.AnnotationTopology: "required"}), "high"))
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := viewer.Client.CoreV1().Pods(ns).Get(ctx, "high", metav1.GetOptions{})
		return err == nil && p.Status.NominatedNodeName == "preempt-0", nil
	}); err != nil {
		t.Fatal("the 4-GPU pod was not nominated to the node:", err)
	}
	createPods(ctx, t, ns, onNode(gpuPod("latecomer", 1, 0, 0, nil), "low"))
	time.Sleep(time.Second)
	finishing.Store(true)
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := viewer.Client.CoreV1().Pods(ns).Get(ctx, "high", metav1.GetOptions{})
		return err == nil && p.Spec.NodeName != "", nil
	}); err != nil {
		t.Fatal("the 4-GPU pod did not run after preempting:", err)
	}
	list, err := viewer.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var evicted, high []string
	left := map[string]bool{}
	for i := range list.Items {
		p := &list.Items[i]
		left[p.Name] = true
		switch {
		case p.Name == "high":
			high = devicesOf(t, p)
			slices.Sort(high)
		case p.Name == "latecomer" && p.Spec.NodeName != "":
			t.Errorf("the latecomer was bound to %s while the preemptor waited for its GPUs", strings.Join(devicesOf(t, p), ","))
		}
	}
	if !left["latecomer"] {
		t.Error("the latecomer is gone: it was bound to the preemptor's GPUs and preempted again")
	}
	for name, gpu := range gpuOf {
		if !left[name] {
			evicted = append(evicted, gpu)
		}
	}
	slices.Sort(evicted)
	quads := [][]string{{"gpu0", "gpu1", "gpu2", "gpu3"}, {"gpu4", "gpu5", "gpu6", "gpu7"}}
	if !slices.ContainsFunc(quads, func(q []string) bool { return slices.Equal(q, evicted) }) {
		t.Errorf("preemption evicted the pods on %v, want exactly those of one NVLink quad", evicted)
	}
	if !slices.Equal(high, evicted) {
		t.Errorf("the preemptor got %v, want the GPUs its victims held (%v)", high, evicted)
	}

	// No eviction helps a pod that asks for a model the node lacks.
	createPods(ctx, t, ns, onNode(gpuPod("hopeless", 1, 0, 0, map[string]string{kubeinterface.AnnotationModelInclude: "NoSuchGPU"}), "high"))
	// Preemption decides before the pod is marked: had it found victims,
	// the pod would be nominated (their eviction follows the nomination).
	hopeless := judged(ctx, t, ns, "hopeless")
	if msg := scheduledMessage(hopeless); hopeless.Spec.NodeName != "" || !strings.Contains(msg, "GPUs:") || !strings.Contains(strings.ToLower(msg), "preemption") {
		t.Errorf("hopeless pod on %q, condition %q; want it unschedulable, with the GPU reason and why preemption does not help", hopeless.Spec.NodeName, msg)
	}
	if n := hopeless.Status.NominatedNodeName; n != "" {
		t.Errorf("the hopeless pod was nominated to %s: preemption chose victims for it", n)
	}
	after, err := viewer.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range after.Items {
		if p.DeletionTimestamp != nil || !left[p.Name] && p.Name != "hopeless" {
			t.Errorf("pod %s went after the hopeless pod came: preemption evicted it", p.Name)
		}
	}
	if len(after.Items) != len(list.Items)+1 {
		t.Errorf("%d pods after the hopeless one came, want %d", len(after.Items), len(list.Items)+1)
	}
	t.Logf("victims on %v; the preemptor got %v; the hopeless pod: %s", evicted, high, scheduledMessage(hopeless))
}

// TestSchedulerPreemptsSlices: low-priority 25% slices fill a 4×T4 node.
// A high-priority pod asking for half a GPU evicts exactly two slices, on
// the GPU it then gets.
func TestSchedulerPreemptsSlices(t *testing.T) {
	ctx := context.Background()
	pn := setUpPreemption(ctx, t, "preslice", "t4x4", 16, func(i int) *corev1.Pod { return gpuPod(fmt.Sprintf("slice-%02d", i), 1, 25, 0, nil) })
	ns, gpuOf, onNode := pn.ns, pn.gpuOf, pn.onNode
	createPods(ctx, t, ns, onNode(gpuPod("half", 1, 50, 0, nil), "high"))
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := viewer.Client.CoreV1().Pods(ns).Get(ctx, "half", metav1.GetOptions{})
		return err == nil && p.Spec.NodeName != "", nil
	}); err != nil {
		t.Fatal("the half-GPU pod did not run after preempting:", err)
	}
	list, err := viewer.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	left := map[string]bool{}
	var got string
	for i := range list.Items {
		left[list.Items[i].Name] = true
		if list.Items[i].Name == "half" {
			got = devicesOf(t, &list.Items[i])[0]
		}
	}
	var evicted []string
	for name, gpu := range gpuOf {
		if !left[name] {
			evicted = append(evicted, name+"@"+gpu)
			if gpu != got {
				t.Errorf("slice %s on %s was evicted, but the half-GPU pod got %s", name, gpu, got)
			}
		}
	}
	if len(evicted) != 2 {
		t.Errorf("evicted %v, want exactly two slices of one GPU", evicted)
	}
	t.Logf("evicted %v; the half-GPU pod got %s", evicted, got)
}
