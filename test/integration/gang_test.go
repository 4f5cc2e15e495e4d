package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// startGangScheduler starts kubegpu-scheduler with the shipped
// configuration and v1.37's gang scheduling (beta, off by default) turned on: the upstream
// GangScheduling plugin and pod-group scheduling cycles, with kubegpu's
// plugin choosing each pod's devices.
func startGangScheduler(ctx context.Context, t *testing.T) {
	t.Helper()
	config, err := cluster.ShippedSchedulerConfig(filepath.Join(repoRoot, "kube-scheduler/config/kubegpu-scheduler.yaml"),
		schedulerID.Kubeconfig, pluginDir, keyFile, 500, "heartbeatStaleness: "+heartbeatStaleness.String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := cluster.StartScheduler(ctx, filepath.Join(binDir, "kubegpu-scheduler"), config, "kubegpu-scheduler-gang", "--v=2",
		"--feature-gates=GenericWorkload=true")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
}

// gangNodes adds n DGX-1s labelled for gangJob's pods.
func gangNodes(ctx context.Context, t *testing.T, prefix string, n int) *simNodes {
	t.Helper()
	nodes := addNodes(ctx, t, prefix, "dgx1", n)
	for _, name := range nodes.names {
		patch := []byte(`{"metadata":{"labels":{"kubegpu.io/test-gang":"true"}}}`)
		if _, err := cluster.Client.CoreV1().Nodes().Patch(ctx, name, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return nodes
}

// gangJob is a PodGroup of size pods, all or none, and its pods of gpus
// whole GPUs each.
func gangJob(ctx context.Context, t *testing.T, ns, name string, size, gpus int) []*corev1.Pod {
	t.Helper()
	pg := &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
			Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: int32(size)}}},
	}
	if _, err := tenant(t, ns).SchedulingV1beta1().PodGroups(ns).Create(ctx, pg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pods []*corev1.Pod
	for i := range size {
		p := gpuPod(fmt.Sprintf("%s-%d", name, i), gpus, 0, 0, nil)
		p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To(name)}
		p.Spec.NodeSelector = map[string]string{"kubegpu.io/test-gang": "true"}
		pods = append(pods, p)
	}
	return pods
}

// TestSchedulerGangs: two jobs of 4 pods × 8 GPUs, all or nothing, on four
// DGX-1s (room for one): one runs whole, the other waits whole, nothing is
// half placed; when the first finishes, the second runs.
func TestSchedulerGangs(t *testing.T) {
	ctx := context.Background()
	startGangScheduler(ctx, t)
	nodes := gangNodes(ctx, t, "gang", 4)
	ns := namespace(ctx, t, "gang")
	a, b := gangJob(ctx, t, ns, "job-a", 4, 8), gangJob(ctx, t, ns, "job-b", 4, 8)
	// Interleaved, as two controllers would create them.
	for i := range a {
		createPods(ctx, t, ns, a[i], b[i])
	}
	boundOf := func(pods []corev1.Pod, prefix string) int {
		n := 0
		for _, p := range pods {
			if p.Spec.NodeName != "" && len(p.Name) > len(prefix) && p.Name[:len(prefix)] == prefix {
				n++
			}
		}
		return n
	}
	var pods []corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := viewer.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		pods = list.Items
		return boundOf(pods, "job-a") == 4 || boundOf(pods, "job-b") == 4, nil
	}); err != nil {
		t.Fatalf("no job ran whole: job-a %d of 4 bound, job-b %d of 4", boundOf(pods, "job-a"), boundOf(pods, "job-b"))
	}
	first, second := "job-a", "job-b"
	if boundOf(pods, "job-b") == 4 {
		first, second = second, first
	}
	// The scheduler's decision on each pod of the other job, not a
	// guessed delay, before asserting that none of them was placed.
	for i := range 4 {
		judged(ctx, t, ns, fmt.Sprintf("%s-%d", second, i))
	}
	list, err := viewer.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := boundOf(list.Items, second); n != 0 {
		t.Fatalf("%s ran whole and %s has %d of 4 pods bound: half placed", first, second, n)
	}
	checkAllocations(t, list.Items, nodes.invs)
	// The first job finishes: its pods go.
	for _, p := range list.Items {
		if p.Spec.NodeName != "" {
			if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := viewer.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		pods = list.Items
		return boundOf(pods, second) == 4, nil
	}); err != nil {
		t.Fatalf("%s did not run after %s finished: %d of 4 bound", second, first, boundOf(pods, second))
	}
	checkAllocations(t, pods, nodes.invs)
	t.Logf("%s ran whole, %s waited whole and ran when it finished", first, second)
}

// TestSchedulerWithoutGangsHoldsGroups: kubegpu-scheduler run without the
// gang feature gate (the default on v1.37, where it is beta and off)
// while the API server serves PodGroups places no GPU pod of a group
// alone: each waits, unschedulable, saying why and what to change; a GPU
// pod of no group is placed as usual.
func TestSchedulerWithoutGangsHoldsGroups(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t)
	gangNodes(ctx, t, "nogang", 1)
	ns := namespace(ctx, t, "nogang")
	group := gangJob(ctx, t, ns, "job", 3, 1)
	alone := gpuPod("alone", 1, 0, 0, nil)
	alone.Spec.NodeSelector = map[string]string{"kubegpu.io/test-gang": "true"}
	createPods(ctx, t, ns, append(group, alone)...)
	const why = "this scheduler does not place pod groups"
	var pods []corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := viewer.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		pods = list.Items
		for _, p := range pods {
			if p.Name == "alone" && p.Spec.NodeName == "" {
				return false, nil
			}
			if p.Name != "alone" && !slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
				return c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && strings.Contains(c.Message, why)
			}) {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("want the group's pods unschedulable with %q and the pod of no group bound: %v; pods %+v", why, err, pods)
	}
	for _, p := range pods {
		if p.Name != "alone" && p.Spec.NodeName != "" {
			t.Errorf("pod %s of a group bound to %s by a scheduler that does not place groups", p.Name, p.Spec.NodeName)
		}
	}
}
