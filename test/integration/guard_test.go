package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	ktypes "k8s.io/apimachinery/pkg/types"

	"github.com/kubegpu/kubegpu/crishim/metrics"
	"github.com/kubegpu/kubegpu/internal/localnode"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// A host GPU device node for the guard tests: the NVIDIA driver's major,
// a minor no real GPU has.
const fakeGPUNode = "/dev/nvidia250"

// cudaImage is an image that asks for every GPU, as CUDA images do.
const cudaImage = "docker.io/library/cuda-like:latest"

// guardNode starts containerd with busybox and cudaImage, CDI specs for
// the simulated GPUs (each injects SIMGPU_CDI_DEVICE_N=injected) and for a
// foreign allocator's nvidia.com/gpu=all (FOREIGN_NVIDIA_GPU=all), and a
// fake GPU device node on the host.
func guardNode(ctx context.Context, t *testing.T) *localnode.Node {
	t.Helper()
	if out, err := exec.Command("mknod", "-m", "0666", fakeGPUNode, "c", "195", "250").CombinedOutput(); err != nil && !strings.Contains(string(out), "exists") {
		t.Skipf("needs root to create the host GPU device node %s: %v: %s", fakeGPUNode, err, out)
	}
	t.Cleanup(func() { os.Remove(fakeGPUNode) })
	n := startNode(ctx, t)
	archive := filepath.Join(n.Dir, "cuda-like.tar")
	if err := localnode.WriteImageArchive(archive, localnode.ImageSpec{Names: []string{cudaImage},
		Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_MIG_CONFIG_DEVICES=all"}}); err != nil {
		t.Fatal(err)
	}
	if err := n.ImportImage(ctx, archive); err != nil {
		t.Fatal(err)
	}
	var devices []map[string]any
	for i := 0; i < 4; i++ {
		devices = append(devices, map[string]any{"name": fmt.Sprintf("gpu%d", i),
			"containerEdits": map[string]any{"env": []string{fmt.Sprintf("SIMGPU_CDI_DEVICE_%d=injected", i)}}})
	}
	writeJSON(t, filepath.Join(n.CDISpecDir, "simgpu.json"), map[string]any{"cdiVersion": "0.6.0", "kind": "kubegpu.io/simgpu", "devices": devices})
	writeJSON(t, filepath.Join(n.CDISpecDir, "foreign.json"), map[string]any{"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
		"devices": []map[string]any{{"name": "all", "containerEdits": map[string]any{"env": []string{"FOREIGN_NVIDIA_GPU=all"}}}}})
	return n
}

// guardPod is a crictl pod and container config.
type guardPod struct {
	name, namespace string
	labels          map[string]string
	privileged      bool
	alloc           *types.PodAllocation // signed with key for node
	key             *kubeinterface.Key
	image           string
	// What the container asks for itself.
	envs        map[string]string
	devices     []map[string]any
	mounts      []map[string]any
	cdiDevices  []string
	annotations map[string]string
	sleep       bool   // keep running after printing
	script      string // instead of listing GPU device nodes and printing env
}

// write writes the pod's sandbox and container configs into dir.
func (p guardPod) write(t *testing.T, dir, node string) (podCfg, ctrCfg string) {
	t.Helper()
	uid := "uid-" + p.name
	annotations := map[string]string{}
	if p.alloc != nil {
		a := *p.alloc
		a.Node = node
		signed, err := p.key.Sign(kubeinterface.Allocation{Pod: kubeinterface.PodRef{Namespace: p.namespace, Name: p.name, UID: ktypes.UID(uid)}, PodAllocation: a})
		if err != nil {
			t.Fatal(err)
		}
		value, err := kubeinterface.EncodeAllocation(signed)
		if err != nil {
			t.Fatal(err)
		}
		annotations[kubeinterface.AnnotationAllocation] = value
	}
	security := map[string]any{"privileged": p.privileged}
	podCfg = writeJSON(t, filepath.Join(dir, p.name+"-pod.json"), map[string]any{
		"metadata":      map[string]any{"name": p.name, "namespace": p.namespace, "uid": uid, "attempt": 0},
		"labels":        p.labels,
		"annotations":   annotations,
		"log_directory": filepath.Join(dir, "logs", p.name),
		"linux":         map[string]any{"security_context": security},
	})
	var envs []map[string]string
	for k, v := range p.envs {
		envs = append(envs, map[string]string{"key": k, "value": v})
	}
	var cdi []map[string]string
	for _, name := range p.cdiDevices {
		cdi = append(cdi, map[string]string{"name": name})
	}
	image := p.image
	if image == "" {
		image = busyboxImage
	}
	script := "ls -l /dev/nvidia* 2>&1; env"
	if p.script != "" {
		script = p.script + "; env"
	}
	if p.sleep {
		script += "; exec sleep 3600"
	}
	ctrCfg = writeJSON(t, filepath.Join(dir, p.name+"-ctr.json"), map[string]any{
		"metadata":    map[string]any{"name": "main"},
		"image":       map[string]any{"image": image},
		"command":     []string{"sh", "-c", script},
		"envs":        envs,
		"devices":     p.devices,
		"mounts":      p.mounts,
		"CDI_devices": cdi,
		"annotations": p.annotations,
		"log_path":    "main.log",
		"linux":       map[string]any{"security_context": security},
	})
	return podCfg, ctrCfg
}

// whole is an exclusive allocation of simulated GPU i of a t4x4 node.
func whole(t *testing.T, node string, i int) *types.PodAllocation {
	return &types.PodAllocation{Containers: []types.ContainerAllocation{{Name: "main",
		Devices: []types.DeviceShare{{ID: fmt.Sprintf("gpu%d", i), UUID: simUUID(t, node, i), Exclusive: true, MemoryMiB: 16384, ComputePercent: 100}}}}}
}

// TestShimDecidesEveryGPU: through kubegpu-crishim into containerd, a
// container gets exactly its allocation whatever it asks for itself (a
// host GPU device node, a mount of one, a foreign allocator's CDI device,
// an image or env asking for all GPUs, a privileged security context),
// and a monitoring agent on the node's allowlist keeps what it asks for.
func TestShimDecidesEveryGPU(t *testing.T) {
	ctx := context.Background()
	n := guardNode(ctx, t)
	const node = "guard-node"
	allowlist := filepath.Join(n.Dir, "allowlist.yaml")
	if err := os.WriteFile(allowlist, []byte(`apiVersion: crishim.kubegpu.io/v1alpha1
kind: GPUAllowlist
entries:
- namespace: gpu-monitoring
  podSelector:
    matchLabels:
      app.kubernetes.io/name: dcgm-exporter
`), 0o644); err != nil {
		t.Fatal(err)
	}
	metricsAddr := freeAddress(t)
	shim, sock := startShim(ctx, t, n, node, "--advertise=false", "--plugin-option=simgpu.preset=t4x4", "--plugin-option=simgpu.edits=cdi",
		"--gpu-allowlist="+allowlist, "--metrics-bind-address="+metricsAddr)
	dir := t.TempDir()
	// Everything a tenant's container can ask for to reach a GPU.
	greedy := func(p guardPod) guardPod {
		p.image = cudaImage
		p.envs = map[string]string{"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_IMEX_CHANNELS": "all"}
		p.devices = []map[string]any{{"host_path": fakeGPUNode, "container_path": fakeGPUNode, "permissions": "rw"}}
		if p.namespace != "gpu-monitoring" {
			// A directory, which containerd expands to every device in it.
			p.devices = append(p.devices, map[string]any{"host_path": "/dev", "container_path": "/hostdev", "permissions": "rw"})
		}
		p.mounts = []map[string]any{{"host_path": fakeGPUNode, "container_path": "/gpu"},
			{"host_path": "/dev/null", "container_path": "/var/run/nvidia-container-devices/all"}}
		p.cdiDevices = []string{"nvidia.com/gpu=all"}
		p.annotations = map[string]string{"cdi.k8s.io/foreign": "nvidia.com/gpu=all"}
		p.script = "ls -l /dev/nvidia* /host/dev/nvidia* 2>&1; " +
			"for f in /gpu /var/run/nvidia-container-devices/all /hostdev; do test -e $f && echo HAS $f; done"
		return p
	}
	run := func(p guardPod) (string, error) {
		podCfg, ctrCfg := p.write(t, dir, node)
		return runEnv(ctx, t, n, sock, podCfg, ctrCfg)
	}
	// hasNoGPU checks that out shows no GPU but those of allocated.
	check := func(name, out string, allocated []int, wantVisible string) {
		t.Helper()
		for i := 0; i < 4; i++ {
			has := strings.Contains(out, fmt.Sprintf("SIMGPU_CDI_DEVICE_%d=injected", i))
			if want := slices.Contains(allocated, i); has != want {
				t.Errorf("%s: gpu%d injected %v, want %v:\n%s", name, i, has, want, out)
			}
		}
		for _, bad := range []string{"FOREIGN_NVIDIA_GPU", "NVIDIA_MIG_CONFIG_DEVICES=all", "NVIDIA_IMEX_CHANNELS=all", "195, 250", "HAS "} {
			if strings.Contains(out, bad) {
				t.Errorf("%s: the container reaches a GPU it was not given (%s):\n%s", name, bad, out)
			}
		}
		if !strings.Contains(out+"\n", "NVIDIA_VISIBLE_DEVICES="+wantVisible+"\n") {
			t.Errorf("%s: want NVIDIA_VISIBLE_DEVICES=%s:\n%s", name, wantVisible, out)
		}
	}

	t.Run("allocated container asking for more", func(t *testing.T) {
		out, err := run(greedy(guardPod{name: "greedy", namespace: "tenant", alloc: whole(t, node, 1), key: signingKey}))
		if err != nil {
			t.Fatalf("%v; shim log %s", err, shim.Log)
		}
		check("greedy", out, []int{1}, "void")
	})
	t.Run("container without allocation", func(t *testing.T) {
		out, err := run(greedy(guardPod{name: "none", namespace: "tenant"}))
		if err != nil {
			t.Fatal(err)
		}
		check("none", out, nil, "void")
	})
	t.Run("privileged container", func(t *testing.T) {
		// containerd gives a privileged container every host device; the
		// shim hides the GPUs' behind /dev/null, also under a hostPath /dev.
		p := greedy(guardPod{name: "privileged", namespace: "tenant", privileged: true})
		p.mounts = append(p.mounts, map[string]any{"host_path": "/dev", "container_path": "/host/dev"})
		out, err := run(p)
		if err != nil {
			t.Fatal(err)
		}
		check("privileged", out, nil, "void")
		for _, path := range []string{fakeGPUNode, "/host" + fakeGPUNode} {
			if !regexp.MustCompile(`1,\s+3 .* ` + path + `\n`).MatchString(out + "\n") {
				t.Errorf("privileged: %s is not masked with /dev/null:\n%s", path, out)
			}
		}
		if _, err := run(greedy(guardPod{name: "privileged-gpu", namespace: "tenant", privileged: true, alloc: whole(t, node, 2), key: signingKey})); err == nil ||
			!strings.Contains(err.Error(), "privileged containers get GPUs only in pods on the node's GPU allowlist") {
			t.Errorf("privileged container with an allocation: %v, want refused", err)
		}
	})
	t.Run("allowlisted monitoring agent", func(t *testing.T) {
		p := greedy(guardPod{name: "dcgm", namespace: "gpu-monitoring", privileged: true, labels: map[string]string{"app.kubernetes.io/name": "dcgm-exporter"}})
		out, err := run(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"FOREIGN_NVIDIA_GPU=all", "NVIDIA_VISIBLE_DEVICES=all", "195, 250", "HAS /gpu", "HAS /var/run/nvidia-container-devices/all"} {
			if !strings.Contains(out, want) {
				t.Errorf("allowlisted agent lacks %q:\n%s", want, out)
			}
		}
		// The same namespace, a pod the selector does not match.
		out, err = run(greedy(guardPod{name: "impostor", namespace: "gpu-monitoring", labels: map[string]string{"app.kubernetes.io/name": "miner"}}))
		if err != nil {
			t.Fatal(err)
		}
		check("impostor", out, nil, "void")
	})
	metrics := scrape(t, metricsAddr)
	for _, want := range []string{`kubegpu_crishim_allowlisted_containers_total{namespace="gpu-monitoring"} 1`, "kubegpu_crishim_stripped_containers_total 4"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q:\n%s", want, metrics)
		}
	}
}

// TestShimLedger: two pods given the same exclusive device on one node
// (the scheduler's state broken, or a pod force-deleted while its
// container runs): the second is refused while the first's container
// lives, also by a restarted shim, and runs once it has exited.
func TestShimLedger(t *testing.T) {
	ctx := context.Background()
	n := startNode(ctx, t)
	const node = "ledger-node"
	metricsAddr := freeAddress(t)
	args := []string{"--advertise=false", "--plugin-option=simgpu.preset=t4x4", "--metrics-bind-address=" + metricsAddr}
	shim, sock := startShim(ctx, t, n, node, args...)
	dir := t.TempDir()
	run := func(p guardPod) (string, error) {
		podCfg, ctrCfg := p.write(t, dir, node)
		return runEnv(ctx, t, n, sock, podCfg, ctrCfg)
	}
	first := guardPod{name: "first", namespace: "tenant-a", alloc: whole(t, node, 2), key: signingKey, sleep: true}
	if _, err := run(first); err != nil {
		t.Fatalf("%v; shim log %s", err, shim.Log)
	}
	second := guardPod{name: "second", namespace: "tenant-b", alloc: whole(t, node, 2), key: signingKey}
	const refused = "devices are held by another pod: gpu2 is held whole by another pod's container"
	if _, err := run(second); err == nil || !strings.Contains(err.Error(), refused) || !strings.Contains(err.Error(), "ResourceExhausted") {
		t.Fatalf("second pod on gpu2: %v, want ResourceExhausted: %s", err, refused)
	}
	// Slices of it are refused too; another device is not.
	slice := &types.PodAllocation{Containers: []types.ContainerAllocation{{Name: "main",
		Devices: []types.DeviceShare{{ID: "gpu2", UUID: simUUID(t, node, 2), MemoryMiB: 1024, ComputePercent: 10}}}}}
	if _, err := run(guardPod{name: "slice", namespace: "tenant-b", alloc: slice, key: signingKey}); err == nil || !strings.Contains(err.Error(), "held whole") {
		t.Errorf("slice of gpu2: %v, want refused", err)
	}
	if _, err := run(guardPod{name: "other", namespace: "tenant-b", alloc: whole(t, node, 3), key: signingKey}); err != nil {
		t.Errorf("gpu3: %v", err)
	}
	if m := scrape(t, metricsAddr); !strings.Contains(m, "kubegpu_crishim_ledger_refusals_total 2") {
		t.Errorf("metrics lack kubegpu_crishim_ledger_refusals_total 2:\n%s", m)
	}

	// A restarted shim reads the ledger back from containerd.
	if err := shim.Kill(); err != nil {
		t.Fatal(err)
	}
	shim, sock = startShim(ctx, t, n, node, args...)
	if _, err := run(guardPod{name: "third", namespace: "tenant-c", alloc: whole(t, node, 2), key: signingKey}); err == nil || !strings.Contains(err.Error(), refused) {
		t.Errorf("after the shim restarted, a third pod on gpu2: %v, want refused", err)
	}
	// Once the first pod's container has exited, gpu2 is free.
	ids, err := crictl(ctx, n, sock, "ps", "-q", "--pod", podID(ctx, t, n, sock, "first"))
	if err != nil || ids == "" {
		t.Fatalf("find the first pod's container: %v %q", err, ids)
	}
	if out, err := crictl(ctx, n, sock, "stop", "--timeout", "0", strings.Fields(ids)[0]); err != nil {
		t.Fatalf("stop: %v: %s", err, out)
	}
	if _, err := run(guardPod{name: "fourth", namespace: "tenant-c", alloc: whole(t, node, 2), key: signingKey}); err != nil {
		t.Errorf("gpu2 after its holder exited: %v; shim log %s", err, shim.Log)
	}
}

// TestShimLedgerForgetsRemovedPods: a GPU pod removed (as kubelet removes
// a deleted pod: its containers and sandbox stopped and removed) before
// any other container is created on the node holds nothing: the next pod
// given the same device runs at once, and so does a chain of such pods.
// The ledger's claim on a container's devices ends with its
// CreateContainer call, not minutes later.
func TestShimLedgerForgetsRemovedPods(t *testing.T) {
	ctx := context.Background()
	n := startNode(ctx, t)
	const node = "reuse-node"
	metricsAddr := freeAddress(t)
	shim, sock := startShim(ctx, t, n, node, "--advertise=false", "--plugin-option=simgpu.preset=t4x4", "--metrics-bind-address="+metricsAddr)
	dir := t.TempDir()
	for i := range 3 {
		p := guardPod{name: fmt.Sprintf("short-%d", i), namespace: "tenant-a", alloc: whole(t, node, 2), key: signingKey, sleep: true}
		podCfg, ctrCfg := p.write(t, dir, node)
		if _, err := runEnv(ctx, t, n, sock, podCfg, ctrCfg); err != nil {
			t.Fatalf("pod %s on gpu2, right after the one before it was removed: %v; shim log %s", p.name, err, shim.Log)
		}
		id := podID(ctx, t, n, sock, p.name)
		for _, verb := range []string{"stopp", "rmp"} {
			if out, err := crictl(ctx, n, sock, verb, id); err != nil {
				t.Fatalf("%s %s: %v: %s", verb, p.name, err, out)
			}
		}
	}
	if m := scrape(t, metricsAddr); !strings.Contains(m, "kubegpu_crishim_ledger_refusals_total 0") {
		t.Errorf("the ledger refused a container:\n%s", m)
	}
}

// podID returns the ID of the sandbox named name.
func podID(ctx context.Context, t *testing.T, n *localnode.Node, sock, name string) string {
	t.Helper()
	id, err := crictl(ctx, n, sock, "pods", "-q", "--name", name)
	if err != nil || id == "" {
		t.Fatalf("pods --name %s: %v %q", name, err, id)
	}
	return strings.Fields(id)[0]
}

// TestShimMetricsSurviveIdleConnections: 2,000 idle connections to the
// shim's metrics port (a local user's, or a hostNetwork pod's) hold at
// most metrics.MaxConnections of its file descriptors, and a scrape still
// gets its answer.
func TestShimMetricsSurviveIdleConnections(t *testing.T) {
	ctx := context.Background()
	n := startNode(ctx, t)
	addr := freeAddress(t)
	shim, _ := startShim(ctx, t, n, "metrics-node", "--advertise=false", "--plugin-option=simgpu.preset=t4x4", "--metrics-bind-address="+addr)
	before := openFDs(t, shim.Pid())
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 2000; i++ {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	// The shim has taken every connection off its listen queue by the time
	// a scrape is answered.
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape with 2000 idle connections open: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "kubegpu_crishim_devices 4") {
		t.Fatalf("scrape: %s\n%s", resp.Status, body)
	}
	if after := openFDs(t, shim.Pid()); after > before+metrics.MaxConnections+8 {
		t.Errorf("the shim holds %d file descriptors with 2000 idle connections, %d before: not bounded by %d connections", after, before, metrics.MaxConnections)
	}
	// CRI is served throughout.
	if _, err := crictl(ctx, n, filepath.Join(n.Dir, "crishim.sock"), "version"); err != nil {
		t.Errorf("CRI with 2000 idle metrics connections: %v", err)
	}
}

func openFDs(t *testing.T, pid int) int {
	t.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}
