package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubegpu/kubegpu/kubeinterface"
)

// shareOf is the kubegpu.io/gpu-share request of a pod's containers.
func shareOf(p *corev1.Pod) int64 {
	var sum int64
	for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
		q := c.Resources.Requests[kubeinterface.ResourceGPUShare]
		sum += q.Value()
	}
	return sum
}

// TestQuotaInGPUEquivalents: kubegpu-gpu-share gives every GPU pod, at
// creation, its worth in per cent of a GPU (100 per whole GPU, a slice's
// cores per slice; a value the tenant set is replaced), so that a standard
// ResourceQuota on requests.kubegpu.io/gpu-share caps the namespace at "8
// GPUs' worth"; the pod over it is refused with the standard quota message,
// and the pods within it are scheduled on nodes that publish the resource.
func TestQuotaInGPUEquivalents(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t)
	addNodes(ctx, t, "quota", "dgx1", 2)
	ns := namespace(ctx, t, "quota")
	if _, err := cluster.Client.CoreV1().ResourceQuotas(ns).Create(ctx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "gpus"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"requests." + kubeinterface.ResourceGPUShare: resource.MustParse("800")}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The quota controller must have counted the namespace before the
	// quota admits anything.
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		q, err := cluster.Client.CoreV1().ResourceQuotas(ns).Get(ctx, "gpus", metav1.GetOptions{})
		return err == nil && q.Status.Hard != nil, nil
	}); err != nil {
		t.Fatal("quota not counted:", err)
	}
	// Init containers' GPUs are held beside the app's: their share is
	// charged to the first app container (quota counts only the largest
	// init container).
	withInit := gpuPod("with-init", 4, 0, 0, nil)
	withInit.Spec.InitContainers = []corev1.Container{{Name: "warmup", Image: "busybox", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{kubeinterface.ResourceGPU: resource.MustParse("4")}}}}
	dry, err := tenant(t, ns).CoreV1().Pods(ns).Create(ctx, withInit, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatal(err)
	}
	initShare := dry.Spec.InitContainers[0].Resources.Requests[kubeinterface.ResourceGPUShare]
	appShare := dry.Spec.Containers[0].Resources.Requests[kubeinterface.ResourceGPUShare]
	if initShare.Value() != 0 || appShare.Value() != 800 {
		t.Errorf("init container of 4 GPUs and app container of 4: shares %s and %s, want 0 and 800", initShare.String(), appShare.String())
	}
	// Other vendors' GPUs count alike; GAS's millicores as the slices the
	// scheduler places: 1000 over 3 GPUs is 334 each, 34% a GPU.
	for _, tc := range []struct {
		pod  *corev1.Pod
		want int64
	}{
		{amdPod("amd-two", "2", nil), 200},
		{intelPod("gas-three", "3", corev1.ResourceList{kubeinterface.ResourceIntelMillicores: resource.MustParse("1000")}), 102},
		{intelPod("gas-memory", "2", corev1.ResourceList{kubeinterface.ResourceIntelMemoryMax: resource.MustParse("8Gi")}), 0},
	} {
		dry, err := tenant(t, ns).CoreV1().Pods(ns).Create(ctx, tc.pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatal(err)
		}
		if got := shareOf(dry); got != tc.want {
			t.Errorf("pod %s carries %s %d, want %d", tc.pod.Name, kubeinterface.ResourceGPUShare, got, tc.want)
		}
	}
	lying := gpuPod("four", 4, 0, 0, nil)
	lying.Spec.Containers[0].Resources.Limits[kubeinterface.ResourceGPUShare] = resource.MustParse("1")
	lying.Spec.Containers[0].Resources.Requests[kubeinterface.ResourceGPUShare] = resource.MustParse("1")
	pods := []*corev1.Pod{
		lying,                             // 4 whole GPUs: 400, whatever the tenant wrote
		gpuPod("two", 2, 0, 0, nil),       // 200
		gpuPod("slices", 2, 50, 0, nil),   // two slices of 50%: 100
		gpuPod("memory", 1, 0, 4096, nil), // memory only: 0
	}
	// A memory-only slice's container that claims a share of its own.
	pods[3].Spec.Containers[0].Resources.Limits[kubeinterface.ResourceGPUShare] = resource.MustParse("800")
	pods[3].Spec.Containers[0].Resources.Requests[kubeinterface.ResourceGPUShare] = resource.MustParse("800")
	want := map[string]int64{"four": 400, "two": 200, "slices": 100, "memory": 0}
	createPods(ctx, t, ns, pods...)
	for name, w := range want {
		p, err := viewer.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := shareOf(p); got != w {
			t.Errorf("pod %s carries %s %d, want %d", name, kubeinterface.ResourceGPUShare, got, w)
		}
	}
	// 700 used: a whole GPU more is 800, and then a 25% slice is over.
	createPods(ctx, t, ns, gpuPod("one", 1, 0, 0, nil))
	_, err = tenant(t, ns).CoreV1().Pods(ns).Create(ctx, gpuPod("over", 1, 25, 0, nil), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "exceeded quota: gpus") || !strings.Contains(err.Error(), "requested: requests."+kubeinterface.ResourceGPUShare+"=25") {
		t.Errorf("a 25%% slice beyond 8 GPUs' worth: %v, want refused by the quota", err)
	}
	// A pod without GPUs cannot hold GPU share.
	squat := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "squat"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox",
		Resources: corev1.ResourceRequirements{
			Limits:   corev1.ResourceList{kubeinterface.ResourceGPUShare: resource.MustParse("800")},
			Requests: corev1.ResourceList{kubeinterface.ResourceGPUShare: resource.MustParse("800")},
		}}}}}
	_, err = tenant(t, ns).CoreV1().Pods(ns).Create(ctx, squat, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	refused(t, "a pod without GPUs asking for "+kubeinterface.ResourceGPUShare, err, "kubegpu-gpu-share", "set by kubegpu on GPU containers only")
	// Nor for the node's physical GPUs, GPU pod or not.
	counting := gpuPod("counting", 1, 0, 0, nil)
	counting.Spec.Containers[0].Resources.Limits[kubeinterface.ResourceGPUs] = resource.MustParse("8")
	_, err = tenant(t, ns).CoreV1().Pods(ns).Create(ctx, counting, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	refused(t, "a pod asking for "+kubeinterface.ResourceGPUs, err, "kubegpu-gpu-share", "the number of a node's physical GPUs")
	// Tools read the physical GPUs in the node's capacity.
	node, err := viewer.Client.CoreV1().Nodes().Get(ctx, "quota-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if q := node.Status.Capacity[kubeinterface.ResourceGPUs]; q.Value() != 8 {
		t.Errorf("a DGX-1's capacity has %s %s, want 8", kubeinterface.ResourceGPUs, q.String())
	}
	for _, p := range settle(ctx, t, ns, time.Second, time.Minute) {
		if p.Spec.NodeName == "" {
			t.Errorf("pod %s within the quota was not scheduled", p.Name)
		}
	}
}

// TestQuotaFailsClosed: without the mutating policy (not installed, or a
// cluster that does not serve it), GPU pods are refused rather than counted
// as nothing by quota.
func TestQuotaFailsClosed(t *testing.T) {
	ctx := context.Background()
	ns := namespace(ctx, t, "quota-closed")
	bindings := cluster.Client.AdmissionregistrationV1().MutatingAdmissionPolicyBindings()
	if err := bindings.Delete(ctx, "kubegpu-gpu-share", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.Apply(context.Background(), policies); err != nil {
			t.Error(err)
		}
		if err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := tenant(t, ns).CoreV1().Pods(ns).Create(ctx, gpuPod("probe", 1, 0, 0, nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err == nil, nil
		}); err != nil {
			t.Errorf("kubegpu-gpu-share not back in force: %v", err)
		}
	})
	var err error
	if waitErr := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err = tenant(t, ns).CoreV1().Pods(ns).Create(ctx, gpuPod("unshared", 1, 0, 0, nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil, nil
	}); waitErr != nil {
		t.Fatal("a GPU pod without its share was admitted with the mutating policy removed")
	}
	refused(t, "a GPU pod without the mutating policy", err, "kubegpu-gpu-share", "is it installed")
}
