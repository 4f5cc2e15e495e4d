package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubegpu/kubegpu/kubeinterface/dra"
)

// sliceClaimSpec is a claim for a slice of cores% of one kubegpu GPU.
func sliceClaimSpec(cores int64) resourceapi.ResourceClaimSpec {
	spec := gpuClaimSpec(1)
	spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{
		Requests: map[resourceapi.QualifiedName]resource.Quantity{dra.CapacityCores: *resource.NewQuantity(cores, resource.DecimalSI)}}
	return spec
}

// TestSharedSliceClaimOnRealNode: on a real node with one GPU, two pods
// share one ResourceClaim for a 60% slice and an annotation pod takes the
// other 40%: all three run, as the scheduler placed them, because the
// node's ledger holds the claim's slice once for both of its pods (it
// held it once per pod before, and refused the second). Each container
// of the claim gets the slice's limits from the enforcer stand-in (as
// each gets an MPS daemon of its own from the NVIDIA module), and they
// are released once the claim's pods are gone.
func TestSharedSliceClaimOnRealNode(t *testing.T) {
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
	startScheduler(ctx, t)
	ns := namespace(ctx, t, "sliceclaim")
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := nodeSlices(ctx, nodeName)
		return err == nil && len(list) > 0, nil
	}); err != nil {
		t.Fatalf("no ResourceSlices of %s: %v", nodeName, err)
	}
	if _, err := tenant(t, ns).ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "sixty"}, Spec: sliceClaimSpec(60)}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sharer := func(name string) string {
		p := sleeper(claimUser(name, "sixty", false))
		p.Spec.Containers[0].Command = []string{"sh", "-c", `env; cat "$KUBEGPU_SIMGPU_LIMITS"; echo; sleep 3600`}
		createPods(ctx, t, ns, onNode(p, nodeName))
		return name
	}
	sharer("first")
	waitRunning(ctx, t, ns, "first", k)
	createPods(ctx, t, ns, onNode(sleeper(gpuPod("forty", 1, 40, 0, nil)), nodeName))
	waitRunning(ctx, t, ns, "forty", k)
	sharer("second")
	second := waitRunning(ctx, t, ns, "second", k)
	first, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "first", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"first", "second"} {
		if out := containerEnv(ctx, t, n, sock, p); !strings.Contains(out, `"computePercent":60`) {
			t.Errorf("the container of %s has no limits of the claim's 60%% slice:\n%s", p, out)
		}
	}
	held, err := ledgerHeld(ctx, n, sock)
	if err != nil {
		t.Fatal(err)
	}
	if len(held["gpu0"]) != 3 {
		t.Errorf("gpu0 is held by the running containers of pods %v, want the claim's two and the annotation pod", held["gpu0"])
	}

	// The claim's pods gone, so are their limits.
	deletePod(ctx, t, ns, "first", true)
	deletePod(ctx, t, ns, "second", true)
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, errFirst := os.Stat(filepath.Join(enforcer, string(first.UID)))
		_, errSecond := os.Stat(filepath.Join(enforcer, string(second.UID)))
		return os.IsNotExist(errFirst) && os.IsNotExist(errSecond), nil
	}); err != nil {
		t.Errorf("the limits of the claim's gone pods are kept: %v", err)
	}
}
