package integration

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// TestSliceEnforcement: on the real node (kubelet → kubegpu-crishim →
// containerd, simgpu with its enforcer stand-in), a slice pod ends with
// kubegpu.io/Enforced True and its limits, written with the node's
// credentials; a container that raises its own limits is stopped under
// Required and only marked under BestEffort; a Required slice is never
// placed on a node without an enforcer, and FailedScheduling and explain
// name the reason. Tenants can neither relax their namespace's policy nor
// write the condition themselves, and nobody but the pod's node can.
func TestSliceEnforcement(t *testing.T) {
	ctx := context.Background()
	const node = "enforce-node"
	n := startNode(ctx, t)
	nodeID, err := cluster.NodeIdentity(node)
	if err != nil {
		t.Fatal(err)
	}
	shim, sock := startShim(ctx, t, n, node, "--plugin-option=simgpu.preset=t4x4", "--plugin-option=simgpu.enforcer-root="+filepath.Join(n.Dir, "enforcer"),
		"--kubeconfig="+nodeID.Kubeconfig, "--interval=1s")
	k := startKubelet(ctx, t, n, node, sock, 0)
	addNodes(ctx, t, "enf-none", "t4x4", 1) // publishes no enforcer
	strict, lax := namespace(ctx, t, "enf-strict"), namespace(ctx, t, "enf-lax")
	label := func(ns, policy string) []byte {
		return []byte(`{"metadata":{"labels":{"` + kubeinterface.LabelEnforcement + `":"` + policy + `"}}}`)
	}
	if _, err := cluster.Client.CoreV1().Namespaces().Patch(ctx, strict, ktypes.MergePatchType, label(strict, "Required"), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// Started after the label: its first list of namespaces has it.
	startScheduler(ctx, t)
	// A tenant with edit in its namespace cannot relax its policy.
	if _, err := tenant(t, strict).CoreV1().Namespaces().Patch(ctx, strict, ktypes.MergePatchType, label(strict, "BestEffort"), metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the tenant relabeled its namespace: %v, want Forbidden", err)
	}

	slicePod := func(name, onNode, script string) *corev1.Pod {
		p := gpuPod(name, 1, 25, 4096, nil)
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": onNode}
		c := &p.Spec.Containers[0]
		c.Image, c.ImagePullPolicy, c.Command = busyboxImage, corev1.PullNever, []string{"sh", "-c", script}
		c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}
		return p
	}

	// Required, pinned to the node without an enforcer: never placed
	// there.
	createPods(ctx, t, strict, slicePod("pinned", "enf-none-0", "sleep 3600"))
	var pinned *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pinned, err = viewer.Client.CoreV1().Pods(strict).Get(ctx, "pinned", metav1.GetOptions{})
		return err == nil && strings.Contains(scheduledMessage(pinned), devicescheduler.ReasonUnenforced), nil
	}); err != nil {
		t.Fatalf("a Required slice pinned to a node without an enforcer: %q, want %q", scheduledMessage(pinned), devicescheduler.ReasonUnenforced)
	}
	if pinned.Spec.NodeName != "" {
		t.Fatalf("a Required slice was bound to %s, a node without an enforcer", pinned.Spec.NodeName)
	}
	explain := kubegpu(t, "explain", "-n", strict, "pinned")
	for _, want := range []string{"enforcement Required (its namespace's " + kubeinterface.LabelEnforcement + " label)", "0 of 4 healthy devices can enforce a slice's memory and compute limits"} {
		if !strings.Contains(explain, want) {
			t.Errorf("explain pinned lacks %q:\n%s", want, explain)
		}
	}

	tamper := `echo '{"computePercent":100,"memoryMiB":[4096]}' > "$` + "KUBEGPU_SIMGPU_LIMITS" + `"; sleep 3600`
	createPods(ctx, t, strict, slicePod("ok", node, `cat "$KUBEGPU_SIMGPU_LIMITS"; sleep 3600`), slicePod("tamper", node, tamper))
	createPods(ctx, t, lax, slicePod("tamper", node, tamper))

	// waitEnforced waits for the pod's condition to say reason.
	waitEnforced := func(ns, name, reason string) *corev1.Pod {
		t.Helper()
		var got *corev1.Pod
		if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err = viewer.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			return err == nil && objects.PodEnforcement(got).State == reason, nil
		}); err != nil {
			t.Fatalf("pod %s/%s: condition %s %+v, want reason %s; phase %s; shim log %s; kubelet log %s",
				ns, name, kubeinterface.ConditionEnforced, objects.PodEnforcement(got), reason, got.Status.Phase, shim.Log, k.Log)
		}
		return got
	}
	ok := waitEnforced(strict, "ok", kubeinterface.ReasonEnforced)
	if e := objects.PodEnforcement(ok); !strings.Contains(e.Message, `container "main": simulated: compute 25%, memory 4096 MiB`) {
		t.Errorf("enforced pod's condition message %q lacks its limits", e.Message)
	}

	// Required: the container that raised its limits is stopped.
	stopped := waitEnforced(strict, "tamper", kubeinterface.ReasonMismatch)
	if e := objects.PodEnforcement(stopped); !strings.Contains(e.Message, "compute 100%, granted 25%") || !strings.Contains(e.Message, "stopped: enforcement Required") {
		t.Errorf("Required mismatch: condition message %q", e.Message)
	}
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		stopped, err = viewer.Client.CoreV1().Pods(strict).Get(ctx, "tamper", metav1.GetOptions{})
		return err == nil && len(stopped.Status.ContainerStatuses) == 1 && stopped.Status.ContainerStatuses[0].State.Terminated != nil, nil
	}); err != nil {
		t.Errorf("Required mismatch: the container was not stopped: %+v", stopped.Status.ContainerStatuses)
	}
	// BestEffort: marked, and left running. A stop comes before the
	// record in the same check, so the record says whether one happened.
	marked := waitEnforced(lax, "tamper", kubeinterface.ReasonMismatch)
	if e := objects.PodEnforcement(marked); strings.Contains(e.Message, "stopped") {
		t.Errorf("BestEffort mismatch stopped the container: %q", e.Message)
	}
	// The shim's record comes before kubelet reports the container, so
	// its state is read fresh: it runs, never restarted.
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		marked, err = viewer.Client.CoreV1().Pods(lax).Get(ctx, "tamper", metav1.GetOptions{})
		return err == nil && len(marked.Status.ContainerStatuses) == 1 && marked.Status.ContainerStatuses[0].State.Running != nil, nil
	}); err != nil || marked.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("BestEffort mismatch: container %+v, want it running", marked.Status.ContainerStatuses)
	}
	for _, ns := range []string{strict, lax} {
		var list *corev1.EventList
		if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			list, err = tenant(t, ns).CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=tamper,reason=GPUSliceMismatch"})
			return err == nil && len(list.Items) > 0, nil
		}); err != nil {
			t.Errorf("no GPUSliceMismatch event for %s/tamper: %v", ns, err)
		} else if src := list.Items[0].Source; src.Component != "kubegpu-crishim" || src.Host != node {
			t.Errorf("the mismatch event's source %+v, want kubegpu-crishim on %s", src, node)
		}
	}

	// The tenant cannot write the condition itself.
	forged := []byte(`{"status":{"conditions":[{"type":"` + kubeinterface.ConditionEnforced + `","status":"True","reason":"Enforced","message":"forged"}]}}`)
	if _, err := tenant(t, lax).CoreV1().Pods(lax).Patch(ctx, "tamper", ktypes.StrategicMergePatchType, forged, metav1.PatchOptions{}, "status"); !apierrors.IsForbidden(err) {
		t.Errorf("the tenant wrote its pod's %s condition: %v, want Forbidden", kubeinterface.ConditionEnforced, err)
	}
	// Nor anyone but the pod's node, whatever their RBAC (the admission
	// policy kubegpu-allocation): here the cluster's administrator.
	if _, err := cluster.Client.CoreV1().Pods(lax).Patch(ctx, "tamper", ktypes.StrategicMergePatchType, forged, metav1.PatchOptions{}, "status"); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), "only that node writes it") {
		t.Errorf("an identity other than the pod's node wrote its %s condition: %v, want Forbidden by kubegpu-allocation", kubeinterface.ConditionEnforced, err)
	}

	gpus := kubegpu(t, "gpus")
	for _, want := range []string{"SLICE ENFORCEMENT", "simulated: 1 Enforced", "none"} {
		if !strings.Contains(gpus, want) {
			t.Errorf("kubegpu gpus lacks %q:\n%s", want, gpus)
		}
	}
	if out := kubegpu(t, "explain", "-n", lax, "tamper"); !strings.Contains(out, "Its node recorded its slices' enforcement: Mismatch") {
		t.Errorf("explain of a bound slice pod does not say what its node recorded:\n%s", out)
	}
}

// scheduledMessage is the message of the pod's PodScheduled condition: the
// scheduler's last word on it.
func scheduledMessage(p *corev1.Pod) string {
	if p == nil {
		return ""
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Message
		}
	}
	return ""
}
