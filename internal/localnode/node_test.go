package localnode

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

	"github.com/kubegpu/kubegpu/internal/localcluster"
)

// nodeBinDir returns KUBEGPU_NODE_BIN_DIR or skips the test.
func nodeBinDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("KUBEGPU_NODE_BIN_DIR")
	if dir == "" {
		t.Skip("KUBEGPU_NODE_BIN_DIR is not set: point it at the directory holding containerd, " +
			"containerd-shim-runc-v2, ctr and crictl (make node-binaries builds them into _output/tools/bin)")
	}
	if os.Geteuid() != 0 {
		t.Skip("a local node needs root (containerd mounts and runs containers)")
	}
	return dir
}

// startNode starts a node in a directory of its own, stopped at the end of
// the test. On failure the directory, with containerd's log, is kept.
func startNode(ctx context.Context, t *testing.T) *Node {
	t.Helper()
	bin := nodeBinDir(t)
	dir, err := os.MkdirTemp("", "localnode-")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	n, err := Start(ctx, Options{Dir: dir, BinDir: bin})
	if err != nil {
		t.Fatalf("start node: %v (node files kept in %s)", err, dir)
	}
	t.Logf("containerd ready in %s; socket %s, log %s", time.Since(start).Round(time.Millisecond), n.Socket, n.Log)
	t.Cleanup(func() {
		if err := n.Stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("node files kept in %s; containerd log: %s", dir, n.Log)
			return
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Error(err)
		}
	})
	return n
}

// crictl runs crictl against the node and fails the test on error.
func crictl(ctx context.Context, t *testing.T, n *Node, args ...string) string {
	t.Helper()
	out, err := n.Crictl(ctx, args...)
	if err != nil {
		t.Fatalf("%v (containerd log: %s)", err, n.Log)
	}
	return strings.TrimSpace(string(out))
}

func writeJSON(t *testing.T, path string, v any) string {
	t.Helper()
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

type obj = map[string]any

// runContainer creates and starts a container in the pod and returns its ID.
func runContainer(ctx context.Context, t *testing.T, n *Node, podID, podConfig, name string, config obj) string {
	t.Helper()
	config["metadata"] = obj{"name": name}
	config["image"] = obj{"image": BusyboxImage}
	config["log_path"] = name + ".log"
	path := writeJSON(t, filepath.Join(n.Dir, "container-"+name+".json"), config)
	id := crictl(ctx, t, n, "create", podID, path, podConfig)
	crictl(ctx, t, n, "start", id)
	return id
}

// containerState returns the container's CRI state and exit code.
func containerState(ctx context.Context, t *testing.T, n *Node, id string) (string, int) {
	t.Helper()
	var status struct {
		Status struct {
			State    string `json:"state"`
			ExitCode int    `json:"exitCode"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(crictl(ctx, t, n, "inspect", "-o", "json", id)), &status); err != nil {
		t.Fatal(err)
	}
	return status.Status.State, status.Status.ExitCode
}

// infoPID returns the host PID crictl inspect or inspectp reports.
func infoPID(ctx context.Context, t *testing.T, n *Node, verb, id string) int {
	t.Helper()
	var v struct {
		Info struct {
			PID int `json:"pid"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(crictl(ctx, t, n, verb, "-o", "json", id)), &v); err != nil || v.Info.PID == 0 {
		t.Fatalf("no PID in crictl %s %s (%v)", verb, id, err)
	}
	return v.Info.PID
}

// alive reports whether pid is a process that is not a zombie.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || !strings.HasPrefix(s[i+1:], " Z")
}

// output waits for the container to exit with 0 and returns its log.
func output(ctx context.Context, t *testing.T, n *Node, id string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		state, code := containerState(ctx, t, n, id)
		if state == "CONTAINER_EXITED" {
			logs := crictl(ctx, t, n, "logs", id)
			if code != 0 {
				t.Fatalf("container %s exited with %d; log:\n%s", id, code, logs)
			}
			return logs
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s still %s after 30s", id, state)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestNode runs pods on a real containerd: images imported from an archive,
// a container's environment, a CDI device injected from a spec file, the
// pod network and a host port, a restart of containerd under a running container, and a
// Stop that leaves no process, mount or bridge behind.
func TestNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n := startNode(ctx, t)

	// Images: busybox under two names, from one archive.
	archive := filepath.Join(n.Dir, "images", "busybox.tar")
	const alias = "registry.k8s.io/e2e-test-images/busybox:1.29-2"
	if err := WriteImageArchive(archive, ImageSpec{Names: []string{BusyboxImage, alias}}); err != nil {
		t.Fatal(err)
	}
	if err := n.ImportImage(ctx, archive); err != nil {
		t.Fatal(err)
	}
	for _, img := range []string{BusyboxImage, alias, PauseImage} {
		crictl(ctx, t, n, "inspecti", img)
	}

	// A CDI spec, written after containerd started.
	writeJSON(t, filepath.Join(n.CDISpecDir, "kubegpu-test.json"), obj{
		"cdiVersion": "0.6.0",
		"kind":       "kubegpu.io/test",
		"devices": []obj{{
			"name":           "gpu0",
			"containerEdits": obj{"env": []string{"FOO=bar"}},
		}},
	})

	hostPort, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	podConfig := writeJSON(t, filepath.Join(n.Dir, "pod.json"), obj{
		"metadata":      obj{"name": "localnode-test", "namespace": "default", "uid": "localnode-test-uid"},
		"log_directory": filepath.Join(n.Dir, "pod-logs"),
		"port_mappings": []obj{{"container_port": 80, "host_port": hostPort}},
		"linux":         obj{},
	})
	podID := crictl(ctx, t, n, "runp", podConfig)
	pids := []int{infoPID(ctx, t, n, "inspectp", podID)}

	t.Run("pod network", func(t *testing.T) {
		var pod struct {
			Status struct {
				Network struct {
					IP string `json:"ip"`
				} `json:"network"`
			} `json:"status"`
		}
		if err := json.Unmarshal([]byte(crictl(ctx, t, n, "inspectp", "-o", "json", podID)), &pod); err != nil {
			t.Fatal(err)
		}
		_, subnet, _ := net.ParseCIDR(n.Subnet)
		if ip := net.ParseIP(pod.Status.Network.IP); ip == nil || !subnet.Contains(ip) {
			t.Errorf("pod IP %q, want one in the node's subnet %s", pod.Status.Network.IP, n.Subnet)
		}
	})

	t.Run("host port", func(t *testing.T) {
		runContainer(ctx, t, n, podID, podConfig, "web", webServer())
		url := fmt.Sprintf("http://127.0.0.1:%d/", hostPort)
		if body := httpGet(t, url); body != "kubegpu\n" {
			t.Errorf("GET %s: %q, want kubegpu", url, body)
		}
	})

	t.Run("env", func(t *testing.T) {
		id := runContainer(ctx, t, n, podID, podConfig, "env", obj{
			"command": []string{"env"},
			"envs":    []obj{{"key": "HELLO", "value": "world"}},
		})
		if out := output(ctx, t, n, id); !strings.Contains(out, "HELLO=world") {
			t.Errorf("env printed\n%s\nwant HELLO=world", out)
		}
	})

	t.Run("CDI device", func(t *testing.T) {
		id := runContainer(ctx, t, n, podID, podConfig, "cdi", obj{
			"command":     []string{"env"},
			"CDI_devices": []obj{{"name": "kubegpu.io/test=gpu0"}},
		})
		if out := output(ctx, t, n, id); !strings.Contains(out, "FOO=bar") {
			t.Errorf("env printed\n%s\nwant FOO=bar, injected from the CDI spec", out)
		}
	})

	t.Run("restart", func(t *testing.T) {
		id := runContainer(ctx, t, n, podID, podConfig, "sleeper", obj{"command": []string{"sleep", "inf"}})
		pids = append(pids, infoPID(ctx, t, n, "inspect", id))
		if err := n.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		if state, _ := containerState(ctx, t, n, id); state != "CONTAINER_RUNNING" {
			t.Fatalf("container %s is %s after a containerd restart, want CONTAINER_RUNNING", id, state)
		}
		if out := crictl(ctx, t, n, "exec", "--sync", id, "echo", "alive"); out != "alive" {
			t.Errorf("exec after restart printed %q, want alive", out)
		}
	})

	t.Run("registry mirror", func(t *testing.T) {
		registry := filepath.Join(nodeBinDir(t), "loopback-registry")
		if _, err := os.Stat(registry); err != nil {
			t.Skipf("%s missing (make node-binaries builds it)", registry)
		}
		layout := filepath.Join(n.Dir, "images", "mirrored")
		if err := WriteImageLayout(layout, ImageSpec{Names: []string{"registry.k8s.io/kubegpu/mirrored:1"}}); err != nil {
			t.Fatal(err)
		}
		addrFile := filepath.Join(n.Dir, "registry.addr")
		p, err := localcluster.StartProcess(filepath.Join(n.Dir, "registry.log"), registry,
			"--addr-file", addrFile, "kubegpu/mirrored:1="+layout)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = p.Stop() }()
		var addr []byte
		if err := p.WaitFor(ctx, 30*time.Second, func(context.Context) error {
			addr, err = os.ReadFile(addrFile)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if err := n.MirrorRegistry("registry.k8s.io", "http://"+strings.TrimSpace(string(addr))); err != nil {
			t.Fatal(err)
		}
		crictl(ctx, t, n, "pull", "registry.k8s.io/kubegpu/mirrored:1")
		crictl(ctx, t, n, "inspecti", "registry.k8s.io/kubegpu/mirrored:1")
	})

	// Stop with the pod and the sleeper still running: nothing may be left.
	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, n, pids)
}

// TestNodeStopAfterCrash stops a node whose containerd was killed with a
// pod running: Stop cannot remove the pod through CRI and must kill the
// containers and shims, unmount, and delete the host port rules and
// whatever else is left itself.
func TestNodeStopAfterCrash(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n := startNode(ctx, t)
	archive := filepath.Join(n.Dir, "images", "busybox.tar")
	if err := WriteImageArchive(archive, ImageSpec{}); err != nil {
		t.Fatal(err)
	}
	if err := n.ImportImage(ctx, archive); err != nil {
		t.Fatal(err)
	}
	hostPort, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	podConfig := writeJSON(t, filepath.Join(n.Dir, "pod.json"), obj{
		"metadata":      obj{"name": "localnode-crash", "namespace": "default", "uid": "localnode-crash-uid"},
		"log_directory": filepath.Join(n.Dir, "pod-logs"),
		"port_mappings": []obj{{"container_port": 80, "host_port": hostPort}},
		"linux":         obj{},
	})
	podID := crictl(ctx, t, n, "runp", podConfig)
	id := runContainer(ctx, t, n, podID, podConfig, "web", webServer())
	httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/", hostPort))
	pids := []int{infoPID(ctx, t, n, "inspectp", podID), infoPID(ctx, t, n, "inspect", id)}
	if mounts, _ := MountsUnder(n.Dir); len(mounts) == 0 {
		t.Fatalf("no mounts under %s with a pod running; the test checks nothing", n.Dir)
	}

	if err := n.Kill(); err != nil {
		t.Fatal(err)
	}
	if shims, _ := n.shimPIDs(); len(shims) == 0 || !alive(pids[1]) {
		t.Fatalf("shims %v, container alive %v after killing containerd; want both running", shims, alive(pids[1]))
	}
	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, n, pids)
}

// assertNothingLeft checks that a stopped node left no mount under its
// directory, no process naming it (containerd, shims), none of the
// container processes pids, no bridge and no CNI cache entry.
func assertNothingLeft(t *testing.T, n *Node, pids []int) {
	t.Helper()
	if mounts, err := MountsUnder(n.Dir); err != nil || len(mounts) > 0 {
		t.Errorf("mounts left under %s: %v %v", n.Dir, mounts, err)
	}
	left, err := FindProcesses(func(args []string) bool {
		return strings.Contains(strings.Join(args, " "), n.Dir)
	})
	if err != nil {
		t.Error(err)
	}
	for _, pid := range left {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		t.Errorf("process %d left: %s", pid, strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("container process %d left", pid)
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", n.Bridge)); err == nil {
		t.Errorf("bridge %s left", n.Bridge)
	}
	if results, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", n.cniNetwork+"-*")); len(results) > 0 {
		t.Errorf("CNI cache entries left: %v", results)
	}
	sandboxes, _ := filepath.Glob(filepath.Join(n.Dir, "*", "io.containerd.grpc.v1.cri", "sandboxes", "*"))
	for _, sb := range sandboxes {
		if _, err := os.Stat(filepath.Join("/var/lib/cni/results", "cni-loopback-"+filepath.Base(sb)+"-lo")); err == nil {
			t.Errorf("CNI loopback cache entry of sandbox %s left", filepath.Base(sb))
		}
	}
	if out, err := run(context.Background(), "iptables", "-w", "-t", "nat", "-S"); err == nil {
		if rules := portMappingRules(string(out), n.cniNetwork); len(rules) > 0 {
			t.Errorf("host port rules left: %v", rules)
		}
	}
}

// webServer is a container running busybox httpd on port 80.
func webServer() obj {
	return obj{"command": []string{"sh", "-c", "mkdir -p /www && echo kubegpu >/www/index.html && exec httpd -f -p 80 -h /www"}}
}

// httpGet gets url, retrying for 10 s while the server starts, and returns
// the body of a 200 response.
func httpGet(t *testing.T, url string) string {
	t.Helper()
	var last error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get(url)
		if err != nil {
			last = err
			continue
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			last = err
			continue
		}
		if resp.StatusCode != http.StatusOK {
			last = fmt.Errorf("%s: %s", resp.Status, body)
			continue
		}
		return string(body)
	}
	t.Fatalf("GET %s: %v", url, last)
	return ""
}
