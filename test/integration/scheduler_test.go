package integration

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubegpu/kubegpu/internal/localcluster"
)

// mixedPods is a deterministic mix of whole, multi-GPU and shared pods.
func mixedPods(prefix string, count int) []*corev1.Pod {
	var pods []*corev1.Pod
	for i := 0; i < count; i++ {
		name := fmt.Sprintf("%s-%03d", prefix, i)
		var p *corev1.Pod
		switch k := i % 20; {
		case k < 6:
			p = gpuPod(name, 1, 0, 0, nil)
		case k < 8:
			p = gpuPod(name, 2, 0, 0, nil)
		case k < 9:
			p = gpuPod(name, 4, 0, 0, nil)
		case k < 16:
			p = gpuPod(name, 1, 25, 0, nil)
		case k < 18:
			p = gpuPod(name, 1, 50, 0, nil)
		default:
			p = gpuPod(name, 1, 0, 4096, nil)
		}
		pods = append(pods, p)
	}
	return pods
}

// streamPods creates pods as the namespace's tenant, one every gap, in the
// background; the channel gets the first error, or nil once all exist.
func streamPods(ctx context.Context, t *testing.T, ns string, pods []*corev1.Pod, gap time.Duration) <-chan error {
	t.Helper()
	client := tenant(t, ns)
	created := make(chan error, 1)
	go func() {
		var err error
		for _, p := range pods {
			if _, err = client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				break
			}
			time.Sleep(gap)
		}
		created <- err
	}()
	return created
}

// waitBoundAtLeast waits until at least n pods of ns are bound.
func waitBoundAtLeast(ctx context.Context, t *testing.T, ns string, n int) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := viewer.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil && bound(list.Items) >= n, nil
	}); err != nil {
		t.Fatalf("%d pods were not bound: %v", n, err)
	}
}

func bound(pods []corev1.Pod) int {
	n := 0
	for i := range pods {
		if pods[i].Spec.NodeName != "" {
			n++
		}
	}
	return n
}

// TestSchedulerPlacesManyPods: 200 GPU pods (whole, multi-GPU, shared)
// created at once on ten DGX-1s and ten 4×T4 boxes: every pod that fits is
// bound, every allocation verifies, no device is over-committed.
func TestSchedulerPlacesManyPods(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t)
	nodes := addNodes(ctx, t, "dgx1", "dgx1", 10)
	nodes.add(ctx, t, "t4box", "t4x4", 10)
	ns := namespace(ctx, t, "many")

	start := time.Now()
	createPods(ctx, t, ns, mixedPods("p", 200)...)
	pods := settle(ctx, t, ns, 3*time.Second, 3*time.Minute)
	t.Logf("%d of %d pods bound in %s", bound(pods), len(pods), time.Since(start).Round(time.Millisecond))
	if bound(pods) < 100 {
		t.Errorf("only %d pods bound", bound(pods))
	}
	allocs := checkAllocations(t, pods, nodes.invs)
	assertNothingFits(t, pods, allocs, nodes.invs)
}

// TestSchedulerPreBindMode: with writeAllocation: PreBind the allocation is
// patched onto the pod before DefaultBinder binds it.
func TestSchedulerPreBindMode(t *testing.T) {
	ctx := context.Background()
	prebind := filepath.Join(repoRoot, "kube-scheduler/deploy/rbac-prebind.yaml")
	if err := cluster.Apply(ctx, prebind); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Delete(context.Background(), prebind) })
	startSchedulerWriting(ctx, t, "PreBind")
	nodes := addNodes(ctx, t, "prebind", "t4x4", 2)
	ns := namespace(ctx, t, "prebind")
	createPods(ctx, t, ns, mixedPods("q", 10)...)
	pods := settle(ctx, t, ns, time.Second, time.Minute)
	if got := len(checkAllocations(t, pods, nodes.invs)); got != bound(pods) || got == 0 {
		t.Errorf("%d pods bound, %d with valid allocations", bound(pods), got)
	}
}

// TestSchedulerPicksNVLinkQuad: a 4-GPU pod on a free DGX-1 gets one of the
// two all-NVLink quads, and a second one the other.
func TestSchedulerPicksNVLinkQuad(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t)
	nodes := addNodes(ctx, t, "quad", "dgx1", 1)
	ns := namespace(ctx, t, "quad")
	createPods(ctx, t, ns, gpuPod("first", 4, 0, 0, nil))
	settle(ctx, t, ns, time.Second, time.Minute)
	createPods(ctx, t, ns, gpuPod("second", 4, 0, 0, nil))
	pods := settle(ctx, t, ns, time.Second, time.Minute)
	allocs := checkAllocations(t, pods, nodes.invs)
	quads := map[string]bool{}
	for _, name := range []string{"first", "second"} {
		a, ok := allocs[name]
		if !ok {
			t.Fatalf("pod %s not bound", name)
		}
		var idx []int
		for _, d := range a.Containers[0].Devices {
			for _, dev := range nodes.invs[a.Node].Devices {
				if dev.ID == d.ID {
					idx = append(idx, dev.Index)
				}
			}
		}
		slices.Sort(idx)
		q := fmt.Sprint(idx)
		if q != "[0 1 2 3]" && q != "[4 5 6 7]" {
			t.Errorf("pod %s got GPUs %s, want an all-NVLink quad", name, q)
		}
		quads[q] = true
	}
	if len(quads) != 2 {
		t.Errorf("both pods got the same quad: %v", slices.Collect(maps.Keys(quads)))
	}
}

// TestSchedulerRestartMidStream: the scheduler killed while binding a stream
// of pods and started again allocates no device twice.
func TestSchedulerRestartMidStream(t *testing.T) {
	ctx := context.Background()
	s := startScheduler(ctx, t)
	nodes := addNodes(ctx, t, "restart", "dgx1", 8)
	ns := namespace(ctx, t, "restart")
	created := streamPods(ctx, t, ns, mixedPods("r", 120), 0)
	waitBoundAtLeast(ctx, t, ns, 30)
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	list, _ := viewer.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	t.Logf("killed the scheduler with %d pods bound", bound(list.Items))
	startScheduler(ctx, t)
	checkStream(ctx, t, ns, created, 120, nodes)
}

// checkStream waits for the pods streamPods creates and for them to
// settle, then checks that there are want of them, that every allocation
// verifies and no device is given twice, and that nothing that fits is
// left pending.
func checkStream(ctx context.Context, t *testing.T, ns string, created <-chan error, want int, nodes *simNodes) {
	t.Helper()
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	pods := settle(ctx, t, ns, 3*time.Second, 2*time.Minute)
	if len(pods) != want {
		t.Fatalf("%d pods, want %d", len(pods), want)
	}
	allocs := checkAllocations(t, pods, nodes.invs)
	assertNothingFits(t, pods, allocs, nodes.invs)
}

// TestSchedulerSurvivesAPIServerRestart: kube-apiserver killed for ten
// seconds and started again costs no allocation and no crash.
func TestSchedulerSurvivesAPIServerRestart(t *testing.T) {
	ctx := context.Background()
	s := startScheduler(ctx, t)
	nodes := addNodes(ctx, t, "outage", "dgx1", 4)
	ns := namespace(ctx, t, "outage")
	createPods(ctx, t, ns, mixedPods("before", 30)...)
	settle(ctx, t, ns, 2*time.Second, time.Minute)

	if err := cluster.KillAPIServer(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Second)
	if err := cluster.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Exited() {
		t.Fatalf("kubegpu-scheduler exited during the API server's outage; see %s", s.Log)
	}
	createPods(ctx, t, ns, mixedPods("after", 30)...)
	// The scheduler sees the nodes live again once its Lease informer,
	// backing off through the outage, has relisted: wait for that before
	// waiting for quiet.
	_ = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := viewer.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, p := range list.Items {
			if strings.HasPrefix(p.Name, "after-") && p.Spec.NodeName != "" {
				return true, nil
			}
		}
		return false, nil
	})
	pods := settle(ctx, t, ns, 3*time.Second, 2*time.Minute)
	if s.Exited() {
		t.Fatalf("kubegpu-scheduler exited; see %s", s.Log)
	}
	afterBound := 0
	for _, p := range pods {
		if strings.HasPrefix(p.Name, "after-") && p.Spec.NodeName != "" {
			afterBound++
		}
	}
	if afterBound == 0 {
		t.Error("no pod created after the outage was bound")
	}
	allocs := checkAllocations(t, pods, nodes.invs)
	assertNothingFits(t, pods, allocs, nodes.invs)
}

// TestSchedulerExplainsAndRefuses: pods that cannot fit get FailedScheduling
// events that say why per node; a node whose kubelet stopped renewing its
// Lease gets no pods until it renews it again.
func TestSchedulerExplainsAndRefuses(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t, "heartbeatStaleness: 5s")
	nodes := addNodes(ctx, t, "explain", "t4x4", 2)
	ns := namespace(ctx, t, "explain")
	pinned := gpuPod("pinned", 1, 0, 0, nil)
	pinned.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "explain-1"}
	nodes.pause("explain-1")
	time.Sleep(6 * time.Second)
	// A slice larger than any of the nodes' T4s (16 GB): no wait helps,
	// and the message says so.
	createPods(ctx, t, ns, gpuPod("too-big", 8, 0, 0, nil), pinned, gpuPod("huge-slice", 1, 0, 40000, nil))
	want := map[string][]string{
		"too-big":    {"0/2 nodes are available", "GPUs: node has too few healthy GPUs"},
		"huge-slice": {"0/2 nodes are available", "even with every GPU of the node free"},
		"pinned":     {"node's Lease was last seen renewed"},
	}
	for pod, parts := range want {
		var msgs []string
		err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			msgs = failedScheduling(ctx, t, ns, pod)
			for _, m := range msgs {
				if containsAll(m, parts) {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Errorf("pod %s: no FailedScheduling event with %q; got %q", pod, parts, msgs)
		}
	}
	// The node renews its Lease again: the pinned pod is scheduled without
	// waiting for the scheduler's periodic retry.
	nodes.resume("explain-1")
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := viewer.Client.CoreV1().Pods(ns).Get(ctx, "pinned", metav1.GetOptions{})
		return err == nil && p.Spec.NodeName == "explain-1", nil
	}); err != nil {
		t.Errorf("pod pinned not bound after its node renewed its Lease again: %v", err)
	}
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// TestSchedulerLoadsEveryModule: kubegpu-scheduler loads every device
// module in the plugin directory (the NVIDIA one too, on a machine without
// the NVIDIA driver).
func TestSchedulerLoadsEveryModule(t *testing.T) {
	ctx := context.Background()
	s := startScheduler(ctx, t)
	sos, err := filepath.Glob(filepath.Join(pluginDir, "*.so"))
	if err != nil || len(sos) == 0 {
		t.Fatalf("no modules in %s: %v", pluginDir, err)
	}
	log, err := os.ReadFile(s.Log)
	if err != nil {
		t.Fatal(err)
	}
	var ready string
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, `"kubegpu plugin ready"`) {
			ready = line
		}
	}
	for _, so := range sos {
		name := strings.TrimSuffix(filepath.Base(so), ".so")
		if !strings.Contains(ready, `"`+name+`"`) {
			t.Errorf("module %s not loaded; the scheduler logged: %s", name, ready)
		}
	}
}

// TestSchedulerSteersPodsWithoutGPUs: pods that ask for no GPUs go to the
// node without GPUs although the GPU nodes have more CPU free (which the
// stock scorers prefer); one too big for it goes to the GPU node with the
// fewest idle GPUs.
func TestSchedulerSteersPodsWithoutGPUs(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t)
	nodes := addNodes(ctx, t, "steer", "t4x4", 2)
	const cpuNode = "steer-cpu"
	nodes.addWith(ctx, t, cpuNode, "", 1, nodeOptions{capacity: localcluster.NodeCapacity("8", "32Gi", 110)})
	ns := namespace(ctx, t, "steer")
	only := append(slices.Clone(nodes.names), cpuNode)
	// Kept on this test's nodes; required affinity does not score.
	pin := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: only}}}},
		}}}
		return p
	}
	cpuPod := func(name, cpu string) *corev1.Pod {
		return pin(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Image: "busybox",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse("1Gi")}},
		}}}})
	}
	createPods(ctx, t, ns, pin(gpuPod("gpus", 3, 0, 0, nil)))
	settle(ctx, t, ns, time.Second, time.Minute)
	createPods(ctx, t, ns, cpuPod("web-0", "1"), cpuPod("web-1", "1"), cpuPod("web-2", "1"))
	settle(ctx, t, ns, time.Second, time.Minute)
	createPods(ctx, t, ns, cpuPod("batch", "16"))
	pods := settle(ctx, t, ns, time.Second, time.Minute)
	where := map[string]string{}
	for _, p := range pods {
		where[p.Name] = p.Spec.NodeName
	}
	for _, name := range []string{"web-0", "web-1", "web-2"} {
		if where[name] != cpuNode {
			t.Errorf("pod %s went to %q, want the node without GPUs %s (placements %v)", name, where[name], cpuNode, where)
		}
	}
	if where["batch"] == "" || where["batch"] != where["gpus"] {
		t.Errorf("pod batch went to %q, want %q, the GPU node with one idle GPU (placements %v)", where["batch"], where["gpus"], where)
	}
}
