package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/internal/localnode"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/plugins/simgpu"
	"github.com/kubegpu/kubegpu/types"
)

// nodeBinDir holds containerd, ctr and crictl (make node-binaries).
var nodeBinDir = os.Getenv("KUBEGPU_NODE_BIN_DIR")

const busyboxImage = "docker.io/library/busybox:latest"

// startNode starts containerd on a temp dir with the busybox image, or
// skips the test without the node binaries.
func startNode(ctx context.Context, t *testing.T) *localnode.Node {
	t.Helper()
	if nodeBinDir == "" {
		t.Skip("needs KUBEGPU_NODE_BIN_DIR with containerd, ctr and crictl (make node-binaries)")
	}
	dir, err := os.MkdirTemp("", "kg-node-") // short: containerd's socket path is limited
	if err != nil {
		t.Fatal(err)
	}
	n, err := localnode.Start(ctx, localnode.Options{Dir: dir, BinDir: nodeBinDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Stop(); err != nil {
			t.Error(err)
		}
		if !t.Failed() {
			os.RemoveAll(dir)
		}
	})
	archive := filepath.Join(dir, "busybox.tar")
	if err := localnode.WriteImageArchive(archive, localnode.ImageSpec{Names: []string{busyboxImage}}); err != nil {
		t.Fatal(err)
	}
	if err := n.ImportImage(ctx, archive); err != nil {
		t.Fatal(err)
	}
	return n
}

// startShim runs kubegpu-crishim in front of the node's containerd for
// nodeName with a simgpu preset, and waits for its socket.
func startShim(ctx context.Context, t *testing.T, n *localnode.Node, nodeName string, args ...string) (*localcluster.Process, string) {
	t.Helper()
	sock := filepath.Join(n.Dir, "crishim.sock")
	all := append([]string{"--node-name=" + nodeName, "--plugin-dir=" + pluginDir, "--listen=" + sock,
		"--runtime-endpoint=" + n.Endpoint(), "--allocation-key=" + pubFile, "--v=2",
		"--kubelet-root-dir=" + filepath.Join(n.Dir, "kubelet"), "--claims-dir=" + filepath.Join(n.Dir, "claims")}, args...)
	p, err := localcluster.StartProcess(filepath.Join(n.Dir, "kubegpu-crishim.log"), filepath.Join(binDir, "kubegpu-crishim"), all...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("%v; log %s", err, p.Log)
		}
	})
	if err := p.WaitFor(ctx, 30*time.Second, func(ctx context.Context) error {
		_, err := crictl(ctx, n, sock, "version")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return p, sock
}

// startKubelet runs a real kubelet registered as nodeName on n, with the
// shim at sock as its runtime and an 8 s Lease; restart caps its
// crash-loop back-off (0: kubelet's default). The Node goes with it.
func startKubelet(ctx context.Context, t *testing.T, n *localnode.Node, nodeName, sock string, restart time.Duration) *localcluster.Kubelet {
	t.Helper()
	k, err := cluster.StartKubelet(ctx, localcluster.KubeletOptions{Kubelet: filepath.Join(binDir, "kubelet"), Node: nodeName,
		RuntimeEndpoint: "unix://" + sock, Dir: n.Dir, IP: n.IP, LeaseDuration: 8 * time.Second, MaxContainerRestartPeriod: restart})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = k.Stop()
		_ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), nodeName, metav1.DeleteOptions{})
	})
	return k
}

// crictl runs crictl against endpoint (a socket path).
func crictl(ctx context.Context, n *localnode.Node, sock string, args ...string) (string, error) {
	out, err := n.Crictl(ctx, append([]string{"--runtime-endpoint", "unix://" + sock, "--image-endpoint", "unix://" + sock, "--timeout", "20s"}, args...)...)
	return strings.TrimSpace(string(out)), err
}

// sandboxConfig is a crictl pod config in namespace gpu; allocation, if
// set, is signed for it.
func sandboxConfig(t *testing.T, dir, name, node string, alloc *types.PodAllocation, key *kubeinterface.Key) string {
	t.Helper()
	podCfg, _ := guardPod{name: name, namespace: "gpu", alloc: alloc, key: key}.write(t, dir, node)
	return podCfg
}

func containerConfig(t *testing.T, dir, name string) string {
	t.Helper()
	return writeJSON(t, filepath.Join(dir, name+"-ctr.json"), map[string]any{
		"metadata": map[string]any{"name": "main"},
		"image":    map[string]any{"image": busyboxImage},
		"command":  []string{"env"},
		// The image or the pod asking for every GPU must not get them.
		"envs":     []map[string]string{{"key": "NVIDIA_VISIBLE_DEVICES", "value": "all"}},
		"log_path": "main.log",
		"linux":    map[string]any{},
	})
}

func writeJSON(t *testing.T, path string, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runEnv creates a sandbox and an `env` container through sock and returns
// the container's output, or the error of the step that failed.
func runEnv(ctx context.Context, t *testing.T, n *localnode.Node, sock, podCfg, ctrCfg string) (string, error) {
	t.Helper()
	pod, err := crictl(ctx, n, sock, "runp", podCfg)
	if err != nil {
		return "", fmt.Errorf("runp: %w: %s", err, pod)
	}
	t.Cleanup(func() {
		_, _ = crictl(context.Background(), n, sock, "stopp", pod)
		_, _ = crictl(context.Background(), n, sock, "rmp", pod)
	})
	ctr, err := crictl(ctx, n, sock, "create", pod, ctrCfg, podCfg)
	if err != nil {
		return "", fmt.Errorf("create: %w: %s", err, ctr)
	}
	if out, err := crictl(ctx, n, sock, "start", ctr); err != nil {
		return "", fmt.Errorf("start: %w: %s", err, out)
	}
	var logs string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		logs, err = crictl(ctx, n, sock, "logs", ctr)
		return err == nil && strings.Contains(logs, "PATH="), nil
	})
	return logs, err
}

// scrape returns the shim's metrics served on addr.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// freeAddress returns a loopback host:port nothing listens on.
func freeAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// simUUID is the UUID simgpu gives GPU i of a t4x4 node.
func simUUID(t *testing.T, node string, i int) string {
	t.Helper()
	topo, err := simgpu.Preset("t4x4")
	if err != nil {
		t.Fatal(err)
	}
	return simgpu.Inventory(topo, node).Devices[i].UUID
}

// TestShimGivesContainersTheirDevices: crictl through kubegpu-crishim into a
// real containerd: a container with a signed allocation gets its devices
// (env and CDI), one without gets none, a forged one is refused.
func TestShimGivesContainersTheirDevices(t *testing.T) {
	ctx := context.Background()
	n := startNode(ctx, t)
	// A CDI spec for the simulated GPUs, as nvidia-ctk writes one for real
	// GPUs: each device injects an env variable naming itself.
	var devices []map[string]any
	for i := 0; i < 4; i++ {
		devices = append(devices, map[string]any{"name": fmt.Sprintf("gpu%d", i),
			"containerEdits": map[string]any{"env": []string{fmt.Sprintf("SIMGPU_CDI_DEVICE_%d=injected", i)}}})
	}
	writeJSON(t, filepath.Join(n.CDISpecDir, "simgpu.json"), map[string]any{"cdiVersion": "0.6.0", "kind": "kubegpu.io/simgpu", "devices": devices})

	for _, edits := range []string{"env", "cdi"} {
		t.Run(edits, func(t *testing.T) {
			metricsAddr := freeAddress(t)
			shim, sock := startShim(ctx, t, n, "shim-node", "--advertise=false", "--plugin-option=simgpu.preset=t4x4", "--plugin-option=simgpu.edits="+edits,
				"--metrics-bind-address="+metricsAddr)
			defer func() {
				if err := shim.Stop(); err != nil {
					t.Errorf("%v; log %s", err, shim.Log)
				}
			}()
			alloc := &types.PodAllocation{Containers: []types.ContainerAllocation{{Name: "main",
				Devices: []types.DeviceShare{{ID: "gpu2", UUID: simUUID(t, "shim-node", 2), Exclusive: true}}}}}
			dir := t.TempDir()

			out, err := runEnv(ctx, t, n, sock, sandboxConfig(t, dir, "with-"+edits, "shim-node", alloc, signingKey), containerConfig(t, dir, "with-"+edits))
			if err != nil {
				t.Fatalf("%v; shim log %s", err, shim.Log)
			}
			want := "NVIDIA_VISIBLE_DEVICES=" + simUUID(t, "shim-node", 2)
			if edits == "cdi" {
				want = "SIMGPU_CDI_DEVICE_2=injected"
			}
			if !strings.Contains(out, want) || strings.Contains(out, "NVIDIA_VISIBLE_DEVICES=all") {
				t.Errorf("container with gpu2 printed:\n%s\nwant %s and not NVIDIA_VISIBLE_DEVICES=all", out, want)
			}

			out, err = runEnv(ctx, t, n, sock, sandboxConfig(t, dir, "without-"+edits, "shim-node", nil, nil), containerConfig(t, dir, "without-"+edits))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "NVIDIA_VISIBLE_DEVICES=void") || strings.Contains(out, "SIMGPU_CDI_DEVICE") {
				t.Errorf("container without an allocation printed:\n%s\nwant NVIDIA_VISIBLE_DEVICES=void and no device", out)
			}

			forger, err := kubeinterface.NewHMACKey([]byte(strings.Repeat("f", 32)))
			if err != nil {
				t.Fatal(err)
			}
			_, err = runEnv(ctx, t, n, sock, sandboxConfig(t, dir, "forged-"+edits, "shim-node", alloc, forger), containerConfig(t, dir, "forged-"+edits))
			if err == nil || !strings.Contains(err.Error(), "allocation refused") {
				t.Errorf("forged allocation: %v, want CreateContainer refused", err)
			}

			// Two containers rewritten, the forged one refused.
			body := scrape(t, metricsAddr)
			for _, want := range []string{`kubegpu_crishim_create_container_total{result="rewritten"} 2`,
				`kubegpu_crishim_create_container_total{result="PermissionDenied"} 1`, "kubegpu_crishim_devices 4"} {
				if !strings.Contains(body, want) {
					t.Errorf("metrics lack %q:\n%s", want, body)
				}
			}
		})
	}
}

// TestShimSurvivesRestarts: containerd restarted under the shim, and the
// shim restarted, lose no container and need no help to reconnect.
func TestShimSurvivesRestarts(t *testing.T) {
	ctx := context.Background()
	n := startNode(ctx, t)
	shim, sock := startShim(ctx, t, n, "restart-node", "--advertise=false", "--plugin-option=simgpu.preset=t4x4")
	dir := t.TempDir()
	if _, err := runEnv(ctx, t, n, sock, sandboxConfig(t, dir, "survivor", "restart-node", nil, nil), containerConfig(t, dir, "survivor")); err != nil {
		t.Fatal(err)
	}
	before, err := crictl(ctx, n, sock, "ps", "-a", "-q")
	if err != nil || before == "" {
		t.Fatalf("ps: %v %q", err, before)
	}

	if err := n.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		after, err := crictl(ctx, n, sock, "ps", "-a", "-q")
		return err == nil && after == before, nil
	}); err != nil {
		t.Errorf("through the shim after containerd restarted: containers not back (%v); shim log %s", err, shim.Log)
	}

	if err := shim.Kill(); err != nil {
		t.Fatal(err)
	}
	_, sock = startShim(ctx, t, n, "restart-node", "--advertise=false", "--plugin-option=simgpu.preset=t4x4")
	if after, err := crictl(ctx, n, sock, "ps", "-a", "-q"); err != nil || after != before {
		t.Errorf("after the shim restarted: containers %q (%v), want %q", after, err, before)
	}
}

// startKubeletNode starts a real node of 4 simulated T4s: containerd,
// the shim (publishing with the node's credentials, kubelet's own) and
// kubelet. It returns the node, the shim's socket and the kubelet.
func startKubeletNode(ctx context.Context, t *testing.T, nodeName string) (*localnode.Node, string, *localcluster.Kubelet) {
	t.Helper()
	n := startNode(ctx, t)
	nodeID, err := cluster.NodeIdentity(nodeName)
	if err != nil {
		t.Fatal(err)
	}
	_, sock := startShim(ctx, t, n, nodeName, "--plugin-option=simgpu.preset=t4x4", "--kubeconfig="+nodeID.Kubeconfig, "--interval=1s")
	return n, sock, startKubelet(ctx, t, n, nodeName, sock, 0)
}

// TestKubeletThroughShim: a real kubelet → kubegpu-crishim → containerd
// node; a GPU pod placed by kubegpu-scheduler starts and its container's
// env shows the devices it was allocated.
func TestKubeletThroughShim(t *testing.T) {
	ctx := context.Background()
	n, sock, k := startKubeletNode(ctx, t, "kubelet-node")
	startScheduler(ctx, t)
	ns := namespace(ctx, t, "kubelet")
	pod := gpuPod("env", 2, 0, 0, nil)
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	pod.Spec.Containers[0].Image = busyboxImage
	pod.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
	pod.Spec.Containers[0].Command = []string{"env"}
	pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}
	createPods(ctx, t, ns, pod)
	var got *corev1.Pod
	var err error
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err = viewer.Client.CoreV1().Pods(ns).Get(ctx, "env", metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.PodSucceeded, nil
	}); err != nil {
		t.Fatalf("pod did not succeed: %v; phase %s, status %+v; kubelet log %s", err, got.Status.Phase, got.Status.ContainerStatuses, k.Log)
	}
	a, err := objects.PodAllocation(got)
	if err != nil {
		t.Fatal(err)
	}
	var uuids []string
	for _, d := range a.Containers[0].Devices {
		uuids = append(uuids, d.UUID)
	}
	ids, err := crictl(ctx, n, sock, "ps", "-a", "-q", "--label", "io.kubernetes.pod.name=env")
	if err != nil || ids == "" {
		t.Fatalf("find the container: %v %q", err, ids)
	}
	logs, err := crictl(ctx, n, sock, "logs", strings.Fields(ids)[0])
	if err != nil {
		t.Fatal(err)
	}
	if want := "NVIDIA_VISIBLE_DEVICES=" + strings.Join(uuids, ","); !strings.Contains(logs, want) {
		t.Errorf("container printed:\n%s\nwant %s", logs, want)
	}
	// kubectl logs: the API server reaches the kubelet at the node's address.
	apiLogs, err := cluster.Client.CoreV1().Pods(ns).GetLogs("env", &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil || !strings.Contains(string(apiLogs), "NVIDIA_VISIBLE_DEVICES=") {
		t.Errorf("the pod's logs through the API server (kubectl logs): %v\n%s", err, apiLogs)
	}
	// The kubelet's API asks the API server: the viewer's certificate
	// (the cluster's CA signed it) reads no logs there.
	kubeletLogs(ctx, t, n.IP, "kubelet-node", ns, "env")

	// containerd restarts under kubelet's kept connection to the shim:
	// the shim closes it, kubelet reconnects by itself, and the next GPU
	// pod runs with its devices.
	if err := n.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	again := gpuPod("after-restart", 1, 0, 0, nil)
	again.Spec.RestartPolicy = corev1.RestartPolicyNever
	again.Spec.Containers[0] = *pod.Spec.Containers[0].DeepCopy()
	again.Spec.Containers[0].Resources.Limits[kubeinterface.ResourceGPU] = resource.MustParse("1")
	createPods(ctx, t, ns, again)
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err = viewer.Client.CoreV1().Pods(ns).Get(ctx, "after-restart", metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.PodSucceeded, nil
	}); err != nil {
		t.Fatalf("pod after containerd restarted did not succeed: %v; phase %s, status %+v; kubelet log %s", err, got.Status.Phase, got.Status.ContainerStatuses, k.Log)
	}
	if a, err = objects.PodAllocation(got); err != nil || len(a.Containers) != 1 || len(a.Containers[0].Devices) != 1 {
		t.Fatalf("allocation after restart: %+v, %v", a, err)
	}
	ids, err = crictl(ctx, n, sock, "ps", "-a", "-q", "--label", "io.kubernetes.pod.name=after-restart")
	if err != nil || ids == "" {
		t.Fatalf("find the container: %v %q", err, ids)
	}
	if logs, err = crictl(ctx, n, sock, "logs", strings.Fields(ids)[0]); err != nil {
		t.Fatal(err)
	}
	if want := "NVIDIA_VISIBLE_DEVICES=" + a.Containers[0].Devices[0].UUID; !strings.Contains(logs, want) {
		t.Errorf("container after the restart printed:\n%s\nwant %s", logs, want)
	}
}

// kubeletLogs checks that the viewer, who may not read pod logs, is
// refused them by the kubelet of node at ip.
func kubeletLogs(ctx context.Context, t *testing.T, ip, node, ns, pod string) {
	t.Helper()
	n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(viewer.Config)
	cfg.Host = fmt.Sprintf("https://%s:%d", ip, n.Status.DaemonEndpoints.KubeletEndpoint.Port)
	cfg.Insecure, cfg.CAData, cfg.CAFile, cfg.ServerName = true, nil, "", "" // kubelet's serving certificate is its own
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Get(fmt.Sprintf("%s/containerLogs/%s/%s/main", cfg.Host, ns, pod))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("the viewer's certificate at the kubelet's API: %s, want 403 Forbidden", resp.Status)
	}
}
