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
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/plugins/amd"
	"github.com/kubegpu/kubegpu/types"
)

// makeAMDDevices makes, under devRoot, the device nodes a container of the
// recorded tree's GPUs is given (/dev/kfd and each GPU's render node):
// character devices of /dev/full's numbers, which any process may open,
// so that a container sees nodes of the paths AMD's driver makes without
// the driver.
func makeAMDDevices(t *testing.T, devRoot string, topo amd.Topology) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(devRoot, "dev", "dri"), 0o755); err != nil {
		t.Fatal(err)
	}
	full := int(unix.Mkdev(1, 7))
	paths := []string{amd.DeviceKFD}
	for _, g := range topo.GPUs {
		paths = append(paths, fmt.Sprintf("/dev/dri/renderD%d", g.RenderMinor))
	}
	for _, p := range paths {
		if err := unix.Mknod(filepath.Join(devRoot, p), unix.S_IFCHR|0o666, full); err != nil {
			t.Fatalf("mknod %s: %v", p, err)
		}
	}
}

// TestAMDNode: a real node whose shim serves two vendors, simulated NVIDIA
// GPUs (simgpu t4x4) and the AMD GPUs of a recorded four-MI250 tree (eight
// GCDs; device nodes made by the test). A pod asking for amd.com/gpu: 4
// with topology required gets four GCDs joined by XGMI, two whole MI250s,
// and its container sees /dev/kfd and exactly their render nodes under
// /dev/dri; a pod asking for nvidia.com/gpu gets simulated GPUs and no AMD
// device node; a container config that brings /dev/kfd itself, without an
// allocation, loses it.
func TestAMDNode(t *testing.T) {
	ctx := context.Background()
	const nodeName = "amd-node"
	n := startNode(ctx, t)
	nodeID, err := cluster.NodeIdentity(nodeName)
	if err != nil {
		t.Fatal(err)
	}
	tree, err := filepath.Abs(filepath.Join(repoRoot, "plugins", "amd", "testdata", "mi250-4"))
	if err != nil {
		t.Fatal(err)
	}
	topo, err := amd.Discover(tree)
	if err != nil {
		t.Fatal(err)
	}
	devRoot := filepath.Join(n.Dir, "amd-dev")
	makeAMDDevices(t, devRoot, topo)
	_, sock := startShim(ctx, t, n, nodeName, "--plugin-option=simgpu.preset=t4x4", "--plugin-option=amd.root="+tree,
		"--plugin-option=amd.dev-root="+devRoot, "--kubeconfig="+nodeID.Kubeconfig, "--interval=1s")
	k := startKubelet(ctx, t, n, nodeName, sock, 10*time.Second)
	startScheduler(ctx, t)
	ns := namespace(ctx, t, "amd")

	// The node publishes each vendor's GPUs under its own resource.
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		node, err := viewer.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		a, nv := node.Status.Allocatable[types.ResourceAMDGPU], node.Status.Allocatable[types.ResourceNVIDIAGPU]
		return a.Value() == 8*100 && nv.Value() == 4*100, nil
	}); err != nil {
		t.Fatalf("node %s does not publish amd.com/gpu 800 and nvidia.com/gpu 400: %v", nodeName, err)
	}

	lister := func(name string, limits corev1.ResourceList, annotations map[string]string) *corev1.Pod {
		p := sleeper(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}}})
		p.Spec.Containers[0].Resources.Limits = limits
		p.Spec.Containers[0].Command = []string{"sh", "-c", `echo "kfd: $(ls /dev/kfd 2>&1)"; echo "dri: $(ls /dev/dri 2>&1 | tr '\n' ' ')"; env; sleep 3600`}
		return onNode(p, nodeName)
	}
	createPods(ctx, t, ns,
		lister("rocm", corev1.ResourceList{types.ResourceAMDGPU: resource.MustParse("4")}, map[string]string{kubeinterface.AnnotationTopology: "required"}),
		lister("cuda", corev1.ResourceList{types.ResourceNVIDIAGPU: resource.MustParse("2")}, nil))
	rocm := waitRunning(ctx, t, ns, "rocm", k)
	cuda := waitRunning(ctx, t, ns, "cuda", k)

	// Four GCDs of two whole MI250s, every pair joined by XGMI.
	got := devicesOf(t, rocm)
	slices.Sort(got)
	byID := map[string]amd.GPU{}
	for _, g := range topo.GPUs {
		byID[g.ID] = g
	}
	var want []string
	for _, id := range got {
		g, ok := byID[id]
		if !ok {
			t.Fatalf("rocm got %v, not all AMD GPUs", got)
		}
		want = append(want, fmt.Sprintf("renderD%d", g.RenderMinor))
	}
	modules := map[string]int{}
	for _, id := range got {
		var i int
		if _, err := fmt.Sscanf(id, amd.IDPrefix+"%d", &i); err != nil {
			t.Fatal(err)
		}
		modules[fmt.Sprint(i/2)]++
	}
	if len(got) != 4 || len(modules) != 2 {
		t.Errorf("rocm got GCDs %v, want both GCDs of two MI250s", got)
	}
	m := topo.Inventory.LinkMatrix()
	pos := map[string]int{}
	for i, d := range topo.Inventory.Devices {
		pos[d.ID] = i
	}
	for _, a := range got {
		for _, b := range got {
			if a != b && m[pos[a]][pos[b]].Kind != types.LinkXGMI {
				t.Errorf("rocm's GCDs %s and %s are joined by %s, want XGMI", a, b, m[pos[a]][pos[b]].Kind)
			}
		}
	}
	slices.Sort(want)
	out := containerEnv(ctx, t, n, sock, "rocm")
	if !strings.Contains(out, "kfd: /dev/kfd") || !strings.Contains(out, "dri: "+strings.Join(want, " ")+" \n") {
		t.Errorf("rocm's container printed:\n%s\nwant /dev/kfd and exactly %v under /dev/dri", out, want)
	}

	// The simulated NVIDIA GPUs go to nvidia.com/gpu, with no AMD node.
	for _, id := range devicesOf(t, cuda) {
		if strings.HasPrefix(id, amd.IDPrefix) {
			t.Errorf("cuda got %v, an AMD GPU among them", devicesOf(t, cuda))
		}
	}
	out = containerEnv(ctx, t, n, sock, "cuda")
	if !strings.Contains(out, "kfd: ls: /dev/kfd: No such file or directory") || !strings.Contains(out, "NVIDIA_VISIBLE_DEVICES=GPU-") {
		t.Errorf("cuda's container printed:\n%s\nwant no /dev/kfd and its simulated GPUs", out)
	}

	// A config that brings AMD's device nodes itself (a device plugin, a
	// second runtime client) loses them.
	dir := t.TempDir()
	ctr := writeJSON(t, filepath.Join(dir, "bring-devices.json"), map[string]any{
		"metadata": map[string]any{"name": "main"},
		"image":    map[string]any{"image": busyboxImage},
		"command":  []string{"sh", "-c", `echo "kfd: $(ls /dev/kfd 2>&1)"; echo "dri: $(ls /dev/dri 2>&1)"; env`},
		"devices": []map[string]string{{"host_path": filepath.Join(devRoot, amd.DeviceKFD), "container_path": amd.DeviceKFD, "permissions": "rw"},
			{"host_path": filepath.Join(devRoot, "dev", "dri"), "container_path": "/dev/dri", "permissions": "rw"}},
		"log_path": "main.log",
		"linux":    map[string]any{},
	})
	out, err = runEnv(ctx, t, n, sock, sandboxConfig(t, dir, "bring", nodeName, nil, nil), ctr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "kfd: ls: /dev/kfd: No such file or directory") || !strings.Contains(out, "dri: ls: /dev/dri: No such file or directory") {
		t.Errorf("a container that brought /dev/kfd and /dev/dri printed:\n%s\nwant neither", out)
	}
	checkNoGPUTwice(ctx, t, n, sock, ns)
}
