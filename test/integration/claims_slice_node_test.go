package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// sliceClaimSpec is a claim for a slice of cores% and memory of one
// kubegpu GPU.
func sliceClaimSpec(cores int64, memory string) resourceapi.ResourceClaimSpec {
	spec := gpuClaimSpec(1)
	spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
		dra.CapacityCores: *resource.NewQuantity(cores, resource.DecimalSI), dra.CapacityMemory: resource.MustParse(memory)}}
	return spec
}

// TestSliceClaimOnRealNode: on a real node with one GPU, a pod's
// ResourceClaim for a 60% slice and an annotation pod's 40% share the GPU;
// a second pod of the same claim waits while the first uses it (a slice
// serves one pod at a time: each pod's slice limits are its own), and
// runs once the first is gone. Each container of the claim gets the
// slice's limits from the enforcer stand-in (as it gets an MPS daemon of
// its own from the NVIDIA module), proven by the node under the claim's
// policy: in a namespace whose slices are Required, the claim's container
// that raises its own limits is stopped, the other is recorded Enforced.
// A gone pod's limits are released.
func TestSliceClaimOnRealNode(t *testing.T) {
	ctx := context.Background()
	const nodeName = "slice-claim-node"
	n := startNode(ctx, t)
	nodeID, err := cluster.NodeIdentity(nodeName)
	if err != nil {
		t.Fatal(err)
	}
	enforcer := filepath.Join(n.Dir, "enforcer")
	_, sock := startShim(ctx, t, n, nodeName, "--plugin-option=simgpu.preset=t4x4", "--plugin-option=simgpu.gpus=1",
		"--plugin-option=simgpu.enforcer-root="+enforcer, "--kubeconfig="+nodeID.Kubeconfig, "--interval=1s",
		"--pod-resources-endpoint=unix://"+filepath.Join(n.Dir, "kubelet", "pod-resources", "kubelet.sock"))
	k := startKubelet(ctx, t, n, nodeName, sock, 10*time.Second)
	ns := namespace(ctx, t, "sliceclaim")
	required := []byte(`{"metadata":{"labels":{"` + kubeinterface.LabelEnforcement + `":"Required"}}}`)
	if _, err := cluster.Client.CoreV1().Namespaces().Patch(ctx, ns, ktypes.MergePatchType, required, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	startScheduler(ctx, t) // after the label: its first list of namespaces has it
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := nodeSlices(ctx, nodeName)
		return err == nil && len(list) > 0, nil
	}); err != nil {
		t.Fatalf("no ResourceSlices of %s: %v", nodeName, err)
	}
	if _, err := tenant(t, ns).ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "sixty"}, Spec: sliceClaimSpec(60, "4Gi")}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sharer := func(name, then string) {
		p := sleeper(claimUser(name, "sixty", false))
		p.Spec.Containers[0].Command = []string{"sh", "-c", `env; cat "$KUBEGPU_SIMGPU_LIMITS"; echo; ` + then + `sleep 3600`}
		createPods(ctx, t, ns, onNode(p, nodeName))
	}
	sharer("first", "")
	first := waitRunning(ctx, t, ns, "first", k)
	createPods(ctx, t, ns, onNode(sleeper(gpuPod("forty", 1, 40, 4096, nil)), nodeName))
	waitRunning(ctx, t, ns, "forty", k)
	sharer("second", `echo '{"computePercent":100,"memoryMiB":[4096]}' > "$KUBEGPU_SIMGPU_LIMITS"; `)
	waitUnschedulable(ctx, t, ns, "second", "holds a GPU slice, which serves one pod at a time")
	if out := containerEnv(ctx, t, n, sock, "first"); !strings.Contains(out, `"computePercent":60`) {
		t.Errorf("the claim's container has no limits of its 60%% slice:\n%s", out)
	}
	held, err := ledgerHeld(ctx, n, sock)
	if err != nil {
		t.Fatal(err)
	}
	if len(held["gpu0"]) != 2 {
		t.Errorf("gpu0 is held by the running containers of pods %v, want the claim's and the annotation pod's", held["gpu0"])
	}
	// The node proves the claim's slices under its policy, Required.
	enforced := func(name, reason, want string) {
		t.Helper()
		var got *corev1.Pod
		if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err = viewer.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			e := objects.PodEnforcement(got)
			return err == nil && e.State == reason && strings.Contains(e.Message, want), nil
		}); err != nil {
			t.Errorf("pod %s: condition %s %+v, want reason %s saying %q", name, kubeinterface.ConditionEnforced, objects.PodEnforcement(got), reason, want)
		}
	}
	enforced("first", kubeinterface.ReasonEnforced, "simulated: compute 60%, memory 4096 MiB")

	// The first pod gone, the claim is the second's; the first's limits
	// are released.
	deletePod(ctx, t, ns, "first", true)
	second := waitRunning(ctx, t, ns, "second", k)
	enforced("second", kubeinterface.ReasonMismatch, "stopped: enforcement Required")
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := os.Stat(filepath.Join(enforcer, string(first.UID)))
		return os.IsNotExist(err), nil
	}); err != nil {
		t.Errorf("the limits of the claim's gone pod are kept: %v", err)
	}
	claimOf(ctx, t, ns, second)
}
