package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// TestKubeletReusesDeletedPodsGPUs: through a real kubelet, a chain of
// short GPU pods on the same GPUs, each created as soon as the one before
// it is deleted, all run, and none is refused by the shim's device ledger
// (no "devices are held by another pod" event): a deleted pod's claim on
// its GPUs ends with its container, not minutes later.
func TestKubeletReusesDeletedPodsGPUs(t *testing.T) {
	ctx := context.Background()
	const nodeName = "reuse-kubelet"
	_, _, k := startKubeletNode(ctx, t, nodeName)
	startScheduler(ctx, t)
	ns := namespace(ctx, t, "reuse")
	pods := cluster.Client.CoreV1().Pods(ns)
	for i := range 3 {
		name := fmt.Sprintf("short-%d", i)
		// All four GPUs of the node, so that each pod needs exactly the
		// GPUs the one before it had.
		p := gpuPod(name, 4, 0, 0, nil)
		p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: nodeName}
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](1)
		c := &p.Spec.Containers[0]
		c.Image, c.ImagePullPolicy, c.Command = busyboxImage, corev1.PullNever, []string{"sleep", "3600"}
		c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}
		createPods(ctx, t, ns, p)
		var got corev1.PodStatus
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			p, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			got = p.Status
			return got.Phase == corev1.PodRunning, nil
		}); err != nil {
			t.Fatalf("pod %s, created as soon as the pod before it on its GPUs was gone, did not run: %v; status %+v; events: %s; kubelet log %s",
				name, err, got, podEvents(ctx, t, ns, name), k.Log)
		}
		if ev := podEvents(ctx, t, ns, name); strings.Contains(ev, "held by another pod") {
			t.Errorf("pod %s was refused its GPUs on the way: %s", name, ev)
		}
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := pods.Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		}); err != nil {
			t.Fatalf("pod %s not gone: %v", name, err)
		}
	}
}

// podEvents returns the messages of the events about pod name.
func podEvents(ctx context.Context, t *testing.T, ns, name string) string {
	t.Helper()
	list, err := cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", name).String()})
	if err != nil {
		return fmt.Sprintf("(events not listed: %v)", err)
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Reason+": "+e.Message)
	}
	return strings.Join(out, "; ")
}
