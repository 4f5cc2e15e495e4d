package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/plugins/intel"
	"github.com/kubegpu/kubegpu/types"
)

// TestIntelNode: a real node whose shim serves the Intel GPUs of a
// recorded tree of four Max 1550 on i915 (device nodes made by the test,
// as makeAMDDevices makes AMD's). A pod asking for gpu.intel.com/i915: 2
// that excludes one GPU by UUID gets two others, and its container sees
// exactly their card and render nodes under /dev/dri; a second such pod
// waits: of the two GPUs left, one is the excluded. A pod asking, as GPU
// Aware Scheduling's users do, for 1000 millicores and 8Gi of memory.max
// over two GPUs gets a slice of 50% and 4 GiB on each.
func TestIntelNode(t *testing.T) {
	ctx := context.Background()
	const nodeName = "intel-node"
	n := startNode(ctx, t)
	nodeID, err := cluster.NodeIdentity(nodeName)
	if err != nil {
		t.Fatal(err)
	}
	tree, err := filepath.Abs(filepath.Join(repoRoot, "plugins", "intel", "testdata", "max1550-4"))
	if err != nil {
		t.Fatal(err)
	}
	topo, err := intel.Discover(os.DirFS(tree), nodeName)
	if err != nil {
		t.Fatal(err)
	}
	devRoot := filepath.Join(n.Dir, "intel-dev")
	if err := os.MkdirAll(filepath.Join(devRoot, "dev", "dri"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, g := range topo.GPUs {
		for _, p := range []string{fmt.Sprintf("/dev/dri/card%d", g.Card), fmt.Sprintf("/dev/dri/renderD%d", g.RenderMinor)} {
			if err := unix.Mknod(filepath.Join(devRoot, p), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 7))); err != nil {
				t.Fatalf("mknod %s: %v", p, err)
			}
		}
	}
	_, sock := startShim(ctx, t, n, nodeName, "--plugin-option=simgpu.preset=t4x4", "--plugin-option=intel.root="+tree,
		"--plugin-option=intel.dev-root="+devRoot, "--kubeconfig="+nodeID.Kubeconfig, "--interval=1s")
	k := startKubelet(ctx, t, n, nodeName, sock, 10*time.Second)
	startScheduler(ctx, t)
	ns := namespace(ctx, t, "intel")

	excluded := topo.GPUs[0]
	lister := func(name string) *corev1.Pod {
		p := sleeper(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{kubeinterface.AnnotationUUIDExclude: excluded.UUID}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}}})
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{types.ResourceIntelI915: resource.MustParse("2")}
		p.Spec.Containers[0].Command = []string{"sh", "-c", `echo "dri: $(ls /dev/dri 2>&1 | tr '\n' ' ')"; env; sleep 3600`}
		return onNode(p, nodeName)
	}
	createPods(ctx, t, ns, lister("oneapi-a"))
	a := waitRunning(ctx, t, ns, "oneapi-a", k)
	// Two GPUs are free, one of them the excluded: the second pod waits.
	createPods(ctx, t, ns, lister("oneapi-b"))
	if b := judged(ctx, t, ns, "oneapi-b"); b.Spec.NodeName != "" {
		t.Errorf("oneapi-b bound to %s with %v, on a node whose only free GPUs but one it excludes", b.Spec.NodeName, devicesOf(t, b))
	}

	// GPU Aware Scheduling's totals, split over two GPUs: each gets a
	// slice of 50% and 4 GiB, on the two GPUs left.
	gas := sleeper(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gas"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}}})
	gas.Spec.Containers[0].Resources.Limits = corev1.ResourceList{types.ResourceIntelI915: resource.MustParse("2"),
		kubeinterface.ResourceIntelMillicores: resource.MustParse("1000"), kubeinterface.ResourceIntelMemoryMax: resource.MustParse("8Gi")}
	createPods(ctx, t, ns, onNode(gas, nodeName))
	g := waitRunning(ctx, t, ns, "gas", k)
	h, err := objects.HeldAllocation(g, signingKey.Verify)
	if err != nil {
		t.Fatal(err)
	}
	if shares := h.Containers[0].Devices; len(shares) != 2 || shares[0].ComputePercent != 50 || shares[0].MemoryMiB != 4096 ||
		shares[1].ComputePercent != 50 || shares[1].MemoryMiB != 4096 || shares[0].Exclusive {
		t.Errorf("the GAS pod got %+v, want slices of 50%% and 4096 MiB on two GPUs", shares)
	}

	byID := map[string]intel.GPU{}
	for _, g := range topo.GPUs {
		byID[g.ID] = g
	}
	var want []string
	for _, id := range devicesOf(t, a) {
		g, ok := byID[id]
		if !ok || id == excluded.ID {
			t.Fatalf("oneapi-a got %v: not Intel GPUs, or the one it excludes (%s)", devicesOf(t, a), excluded.ID)
		}
		want = append(want, fmt.Sprintf("card%d", g.Card), fmt.Sprintf("renderD%d", g.RenderMinor))
	}
	slices.Sort(want)
	if out := containerEnv(ctx, t, n, sock, "oneapi-a"); len(want) != 4 || !strings.Contains(out, "dri: "+strings.Join(want, " ")+" \n") {
		t.Errorf("oneapi-a's container printed:\n%s\nwant exactly %v under /dev/dri", out, want)
	}
}
