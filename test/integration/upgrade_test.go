package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/internal/localnode"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// shimEndpoint is where the installed unit serves CRI, and what install.sh
// points kubelet at.
const shimEndpoint = "unix:///run/kubegpu/crishim.sock"

// installedNode is a real node (containerd, then kubelet) on which
// crishim/deploy/install.sh installs, upgrades and uninstalls
// kubegpu-crishim under a temp root (KUBEGPU_ROOT). The test machine has
// no systemd, so install.sh's KUBEGPU_SYSTEMCTL names a stand-in that only
// records each call, and the test then does what systemd would (act): it
// (re)starts the shim from the installed unit's ExecStart and its
// /etc/default file (so the installed binary, modules, pins, key and
// kubeconfig link are what runs), and restarts kubelet on the endpoint its
// installed configuration names. Only the CRI socket, containerd's
// endpoint and the metrics address are the test's own.
type installedNode struct {
	t    *testing.T
	n    *localnode.Node
	name string
	// root is KUBEGPU_ROOT; calls is the systemctl stand-in's record.
	root, systemctl, calls string
	kubeletConfig          string // relative to root
	sock, metrics          string
	shim                   *localcluster.Process
	shimStarts             int
	kubelet                *localcluster.Kubelet
}

// newInstalledNode starts containerd and a kubelet that talks to it
// directly, as a node runs before kubegpu is installed.
func newInstalledNode(ctx context.Context, t *testing.T, name string) *installedNode {
	t.Helper()
	n := startNode(ctx, t)
	dir := t.TempDir()
	u := &installedNode{t: t, n: n, name: name, root: filepath.Join(dir, "root"), calls: filepath.Join(dir, "systemctl.calls"),
		systemctl: filepath.Join(dir, "systemctl"), kubeletConfig: "/var/lib/kubelet/config.yaml",
		sock: filepath.Join(n.Dir, "crishim.sock"), metrics: freeAddress(t)}
	if err := os.WriteFile(u.systemctl, fmt.Appendf(nil, "#!/bin/sh\necho \"$*\" >> %s\n", u.calls), 0o755); err != nil {
		t.Fatal(err)
	}
	// kubelet's configuration as the node has it; the test's kubelet runs
	// with what it says (localcluster writes the rest).
	cfg := filepath.Join(u.root, u.kubeletConfig)
	if err := os.MkdirAll(filepath.Dir(cfg), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: "+n.Endpoint()+"\ncgroupDriver: cgroupfs\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if u.kubelet != nil {
			_ = u.kubelet.Stop()
		}
		if u.shim != nil {
			if err := u.shim.Stop(); err != nil {
				t.Errorf("%v; log %s", err, u.shim.Log)
			}
		}
		_ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	u.restartKubelet(ctx)
	return u
}

// install runs install.sh from build (a directory with bin/ and
// plugins/, as _output) with the node's credentials, the simgpu module and
// kubelet's configuration, plus extra arguments, and returns its output
// and the systemctl calls it made. It fails the test if the script fails.
func (u *installedNode) install(ctx context.Context, build string, extra ...string) (string, []string) {
	u.t.Helper()
	out, calls, err := u.installMayFail(ctx, build, extra...)
	if err != nil {
		u.t.Fatalf("install.sh: %v\n%s", err, out)
	}
	return out, calls
}

func (u *installedNode) installMayFail(ctx context.Context, build string, extra ...string) (string, []string, error) {
	u.t.Helper()
	nodeID, err := cluster.NodeIdentity(u.name)
	if err != nil {
		u.t.Fatal(err)
	}
	args := []string{filepath.Join(repoRoot, "crishim/deploy/install.sh")}
	if len(extra) == 0 || extra[0] != "--uninstall" {
		args = append(args, "--from", build, "--kubeconfig", nodeID.Kubeconfig, "--allocation-key", pubFile,
			"--module", "simgpu", "--plugin-option", "simgpu.preset=t4x4", "--kubelet-config", u.kubeletConfig)
	}
	cmd := exec.CommandContext(ctx, "bash", append(args, extra...)...)
	cmd.Env = append(os.Environ(), "KUBEGPU_ROOT="+u.root, "KUBEGPU_SYSTEMCTL="+u.systemctl)
	out, runErr := cmd.CombinedOutput()
	b, err := os.ReadFile(u.calls)
	if err != nil && !os.IsNotExist(err) {
		u.t.Fatal(err)
	}
	if err := os.Remove(u.calls); err != nil && !os.IsNotExist(err) {
		u.t.Fatal(err)
	}
	var calls []string
	if s := strings.TrimSpace(string(b)); s != "" {
		calls = strings.Split(s, "\n")
	}
	return string(out), calls, runErr
}

// act does what systemd would for install.sh's calls.
func (u *installedNode) act(ctx context.Context, calls []string) {
	u.t.Helper()
	for _, c := range calls {
		switch c {
		case "restart kubegpu-crishim":
			u.stopShim()
			u.startShim(ctx)
		case "start kubegpu-crishim":
			if u.shim == nil {
				u.startShim(ctx)
			}
		case "disable --now kubegpu-crishim":
			u.stopShim()
		case "restart kubelet":
			u.restartKubelet(ctx)
		case "daemon-reload", "enable kubegpu-crishim":
		default:
			u.t.Fatalf("install.sh called systemctl %s", c)
		}
	}
}

func (u *installedNode) stopShim() {
	u.t.Helper()
	if u.shim == nil {
		return
	}
	if err := u.shim.Stop(); err != nil {
		u.t.Fatalf("%v; log %s", err, u.shim.Log)
	}
	u.shim = nil
}

// startShim runs the installed unit's command line.
func (u *installedNode) startShim(ctx context.Context) {
	u.t.Helper()
	argv := u.unitCommand()
	u.shimStarts++
	p, err := localcluster.StartProcess(filepath.Join(u.n.Dir, fmt.Sprintf("kubegpu-crishim-%d.log", u.shimStarts)), argv[0], argv[1:]...)
	if err != nil {
		u.t.Fatal(err)
	}
	u.shim = p
	if err := p.WaitFor(ctx, 30*time.Second, func(ctx context.Context) error {
		_, err := crictl(ctx, u.n, u.sock, "version")
		return err
	}); err != nil {
		u.t.Fatal(err)
	}
}

// unitCommand is the installed unit's ExecStart with $KUBEGPU_CRISHIM_ARGS
// from the installed /etc/default file (read and split as systemd does),
// its paths under the root, and the test's own socket, runtime, metrics
// address, node name and interval.
func (u *installedNode) unitCommand() []string {
	u.t.Helper()
	unit, err := os.ReadFile(filepath.Join(u.root, "etc/systemd/system/kubegpu-crishim.service"))
	if err != nil {
		u.t.Fatal(err)
	}
	var exec string
	sc := bufio.NewScanner(strings.NewReader(string(unit)))
	for in := false; sc.Scan(); {
		line := strings.TrimSpace(sc.Text())
		if after, ok := strings.CutPrefix(line, "ExecStart="); ok {
			in, line = true, after
		}
		if !in {
			continue
		}
		cont := strings.HasSuffix(line, `\`)
		exec += " " + strings.TrimSuffix(line, `\`)
		if !cont {
			break
		}
	}
	args := installedArgs(u.t, u.root)
	ours := map[string]string{"--listen": u.sock, "--runtime-endpoint": u.n.Endpoint(), "--metrics-bind-address": u.metrics}
	var argv []string
	for i, f := range strings.Fields(exec) {
		if f == "$KUBEGPU_CRISHIM_ARGS" {
			argv = append(argv, args...)
			continue
		}
		name, _, _ := strings.Cut(f, "=")
		switch {
		case i == 0:
			f = filepath.Join(u.root, f)
		case ours[name] != "":
			f = name + "=" + ours[name]
		}
		argv = append(argv, f)
	}
	for i, f := range argv {
		name, v, _ := strings.Cut(f, "=")
		if slices.Contains([]string{"--plugin-dir", "--allocation-key", "--kubeconfig", "--gpu-allowlist"}, name) {
			argv[i] = name + "=" + filepath.Join(u.root, v)
		}
	}
	return append(argv, "--node-name="+u.name, "--interval=1s", "--v=2",
		"--kubelet-root-dir="+filepath.Join(u.n.Dir, "kubelet"), "--claims-dir="+filepath.Join(u.n.Dir, "claims"))
}

// installedArgs is $KUBEGPU_CRISHIM_ARGS of the /etc/default file
// installed under root, as systemd passes it to ExecStart.
func installedArgs(t *testing.T, root string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "etc/default/kubegpu-crishim"))
	if err != nil {
		t.Fatal(err)
	}
	env := systemdEnvFile(string(b))
	v, ok := env["KUBEGPU_CRISHIM_ARGS"]
	if !ok {
		t.Fatalf("installed /etc/default/kubegpu-crishim sets no KUBEGPU_CRISHIM_ARGS: %q", b)
	}
	return systemdSplit(v)
}

// restartKubelet (re)starts kubelet on the endpoint its installed
// configuration names (the shim's production socket stands for the test
// shim's).
func (u *installedNode) restartKubelet(ctx context.Context) {
	u.t.Helper()
	if u.kubelet != nil {
		if err := u.kubelet.Stop(); err != nil {
			u.t.Fatal(err)
		}
	}
	endpoint := u.kubeletEndpoint()
	if endpoint == shimEndpoint {
		endpoint = "unix://" + u.sock
	}
	k, err := cluster.StartKubelet(ctx, localcluster.KubeletOptions{Kubelet: filepath.Join(binDir, "kubelet"), Node: u.name,
		RuntimeEndpoint: endpoint, Dir: u.n.Dir, IP: u.n.IP, LeaseDuration: 8 * time.Second, MaxContainerRestartPeriod: time.Second})
	if err != nil {
		u.t.Fatal(err)
	}
	u.kubelet = k
}

// kubeletEndpoint is containerRuntimeEndpoint in kubelet's installed
// configuration.
func (u *installedNode) kubeletEndpoint() string {
	u.t.Helper()
	b, err := os.ReadFile(filepath.Join(u.root, u.kubeletConfig))
	if err != nil {
		u.t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "containerRuntimeEndpoint:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// installed returns the digests of the installed binary and module.
func (u *installedNode) installed() string {
	u.t.Helper()
	out, err := exec.Command("sha256sum", filepath.Join(u.root, "usr/local/bin/kubegpu-crishim"),
		filepath.Join(u.pluginDir(), "simgpu.so")).CombinedOutput()
	if err != nil {
		u.t.Fatalf("sha256sum: %v: %s", err, out)
	}
	return string(out)
}

// pluginDir is the installed release's plugin directory (the
// --plugin-dir of its options) under the root.
func (u *installedNode) pluginDir() string {
	u.t.Helper()
	for _, a := range installedArgs(u.t, u.root) {
		if v, ok := strings.CutPrefix(a, "--plugin-dir="); ok {
			return filepath.Join(u.root, v)
		}
	}
	u.t.Fatal("the installed options name no --plugin-dir")
	return ""
}

// get returns the status code and body of a GET of the shim's metrics
// server.
func (u *installedNode) get(path string) (int, string) {
	u.t.Helper()
	resp, err := http.Get("http://" + u.metrics + path)
	if err != nil {
		u.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		u.t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// devicesReady returns the Node's kubegpu.io/DevicesReady condition once
// it has status want.
func (u *installedNode) devicesReady(ctx context.Context, want corev1.ConditionStatus) corev1.NodeCondition {
	u.t.Helper()
	var got corev1.NodeCondition
	if err := wait.PollUntilContextTimeout(ctx, 300*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := viewer.Client.CoreV1().Nodes().Get(ctx, u.name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == kubeinterface.ConditionDevicesReady {
				got = c
			}
		}
		return got.Status == want, nil
	}); err != nil {
		u.t.Fatalf("node %s: condition %s is %+v, want status %s", u.name, kubeinterface.ConditionDevicesReady, got, want)
	}
	return got
}

// shimBuild makes a directory laid out as _output (bin/, plugins/) whose
// files are links to the given binary and simgpu module.
func shimBuild(t *testing.T, bin, module string) string {
	t.Helper()
	dir := t.TempDir()
	for link, target := range map[string]string{"bin/kubegpu-crishim": bin, "plugins/simgpu.so": module} {
		abs, err := filepath.Abs(target)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, link)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(abs, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// currentBuild is the build under test (make build plugins).
func currentBuild(t *testing.T) string {
	return shimBuild(t, filepath.Join(binDir, "kubegpu-crishim"), filepath.Join(pluginDir, "simgpu.so"))
}

// newBuild builds kubegpu-crishim and simgpu.so again from this checkout,
// stamped with version as `make build plugins` stamps a release, into a
// directory laid out as _output. With the Go build cache warm from the
// build under test this takes seconds (only the link steps run); both
// files differ from the build under test (the stamp is in the binary and
// in both files' build info).
func newBuild(ctx context.Context, t *testing.T, version string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("building a new version of the shim needs the go command")
	}
	dir := t.TempDir()
	ldflags := "-X github.com/kubegpu/kubegpu/utils/version.gitVersion=" + version
	for _, b := range [][]string{
		{"build", "-ldflags", ldflags, "-o", filepath.Join(dir, "bin/kubegpu-crishim"), "./crishim/cmd/kubegpu-crishim"},
		{"build", "-buildmode=plugin", "-ldflags", ldflags, "-o", filepath.Join(dir, "plugins/simgpu.so"), "./plugins/simgpu/plugin"},
	} {
		cmd := exec.CommandContext(ctx, goBin, b...)
		cmd.Dir = repoRoot
		// The Makefile's settings, which the build under test has.
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "GOFLAGS=-trimpath -buildvcs=false")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(b, " "), err, out)
		}
	}
	return dir
}

// brokenBuild is the build under test with simgpu.so cut short, as an
// interrupted copy leaves it: the file does not load.
func brokenBuild(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(pluginDir, "simgpu.so"))
	if err != nil {
		t.Fatal(err)
	}
	half := filepath.Join(t.TempDir(), "simgpu.so")
	if err := os.WriteFile(half, b[:len(b)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	return shimBuild(t, filepath.Join(binDir, "kubegpu-crishim"), half)
}

// upgradePod runs busybox with cmd on node; gpus 0 asks for none.
func upgradePod(node, name string, gpus int, cmd string, restart corev1.RestartPolicy) *corev1.Pod {
	p := gpuPod(name, gpus, 0, 0, nil)
	p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	if gpus == 0 {
		p.Spec.Containers[0].Resources.Limits = nil
	}
	p.Spec.RestartPolicy = restart
	p.Spec.Containers[0].Image = busyboxImage
	p.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
	p.Spec.Containers[0].Command = []string{"sh", "-c", cmd}
	p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}
	return p
}

// running waits until the pods run and returns each one's container ID
// and restart count.
func running(ctx context.Context, t *testing.T, ns string, names ...string) map[string]string {
	t.Helper()
	got := map[string]string{}
	var last []corev1.PodStatus
	if err := wait.PollUntilContextTimeout(ctx, 300*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		last = nil
		for _, name := range names {
			p, err := viewer.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			last = append(last, p.Status)
			if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Running == nil {
				return false, nil
			}
			st := p.Status.ContainerStatuses[0]
			got[name] = fmt.Sprintf("%s restarts=%d", st.ContainerID, st.RestartCount)
		}
		return true, nil
	}); err != nil {
		t.Fatalf("pods %v not running: %+v", names, last)
	}
	return got
}

// succeededWithItsDevices waits for the pod to succeed and checks that its
// container's env (printed to its log) names exactly the UUIDs of its
// allocation.
func succeededWithItsDevices(ctx context.Context, t *testing.T, u *installedNode, ns, name string) {
	t.Helper()
	var got *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := viewer.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		got = p
		return err == nil && p.Status.Phase == corev1.PodSucceeded, nil
	}); err != nil {
		t.Fatalf("pod %s did not succeed: %+v; shim log %s, kubelet log %s", name, got.Status, u.shim.Log, u.kubelet.Log)
	}
	a, err := objects.PodAllocation(got)
	if err != nil || len(a.Containers) != 1 || len(a.Containers[0].Devices) == 0 {
		t.Fatalf("pod %s: allocation %+v, %v", name, a, err)
	}
	var uuids []string
	for _, d := range a.Containers[0].Devices {
		uuids = append(uuids, d.UUID)
	}
	ids, err := crictl(ctx, u.n, u.sock, "ps", "-a", "-q", "--label", "io.kubernetes.pod.name="+name)
	if err != nil || ids == "" {
		t.Fatalf("find the container of %s: %v %q", name, err, ids)
	}
	logs, err := crictl(ctx, u.n, u.sock, "logs", strings.Fields(ids)[0])
	if err != nil {
		t.Fatal(err)
	}
	if want := "NVIDIA_VISIBLE_DEVICES=" + strings.Join(uuids, ","); !strings.Contains(logs, want) {
		t.Errorf("pod %s printed:\n%s\nwant %s", name, logs, want)
	}
}

// TestShimRollingUpgrade: on a node whose kubelet runs pods on containerd,
// install.sh installs the shim and points kubelet at it; the pods keep
// their containers. A new build (kubegpu-crishim and simgpu.so built again
// with another version stamp) replaces the installed one in place: no
// container restarts, a new GPU pod gets its devices from the new shim. A
// build whose module does not load is refused before anything is touched;
// running install.sh again changes nothing; uninstall gives kubelet its
// endpoint back, and the containers still run.
func TestShimRollingUpgrade(t *testing.T) {
	ctx := context.Background()
	const node = "upgrade-node"
	u := newInstalledNode(ctx, t, node)
	startScheduler(ctx, t)
	ns := namespace(ctx, t, "upgrade")
	createPods(ctx, t, ns, upgradePod(node, "before", 0, "exec sleep 3600", corev1.RestartPolicyAlways))
	before := running(ctx, t, ns, "before")

	// Install: the shim starts, kubelet is restarted onto it.
	out, calls := u.install(ctx, currentBuild(t))
	if want := []string{"daemon-reload", "enable kubegpu-crishim", "restart kubegpu-crishim", "restart kubelet"}; !slices.Equal(calls, want) {
		t.Fatalf("install called systemctl %q, want %q\n%s", calls, want, out)
	}
	if got := u.kubeletEndpoint(); got != shimEndpoint {
		t.Fatalf("kubelet's endpoint after install: %q, want %q", got, shimEndpoint)
	}
	u.act(ctx, calls)
	u.devicesReady(ctx, corev1.ConditionTrue)
	createPods(ctx, t, ns,
		upgradePod(node, "gpu-a", 1, "env; exec sleep 3600", corev1.RestartPolicyAlways),
		upgradePod(node, "gpu-b", 2, "env; exec sleep 3600", corev1.RestartPolicyAlways),
		upgradePod(node, "plain", 0, "exec sleep 3600", corev1.RestartPolicyAlways))
	pods := []string{"before", "gpu-a", "gpu-b", "plain"}
	want := running(ctx, t, ns, pods...)
	if want["before"] != before["before"] {
		t.Fatalf("kubelet moving onto the shim restarted a container: %s, was %s", want["before"], before["before"])
	}
	old := u.installed()

	// A build whose module does not load is refused before anything is
	// touched.
	out, calls, err := u.installMayFail(ctx, brokenBuild(t))
	if err == nil || !strings.Contains(out, "do not load on this node") || !strings.Contains(out, "nothing was changed") || len(calls) != 0 {
		t.Fatalf("install of a broken build: %v, calls %q\n%s", err, calls, out)
	}
	if u.installed() != old {
		t.Fatal("a refused build changed the installed files")
	}

	// The rolling upgrade: a new build replaces the binary and the module
	// in place, and the unit is restarted (kubelet is not).
	const version = "v9.9.9-upgrade-test"
	next := newBuild(ctx, t, version)
	out, calls = u.install(ctx, next)
	if want := []string{"enable kubegpu-crishim", "restart kubegpu-crishim"}; !slices.Equal(calls, want) {
		t.Fatalf("upgrade called systemctl %q, want %q\n%s", calls, want, out)
	}
	if u.installed() == old {
		t.Fatal("the upgrade left the installed binary and module as they were")
	}
	u.act(ctx, calls)
	if v, err := exec.Command(filepath.Join(u.root, "usr/local/bin/kubegpu-crishim"), "version").CombinedOutput(); err != nil || !strings.Contains(string(v), version) {
		t.Fatalf("installed version: %s %v, want %s", v, err, version)
	}
	if log, err := os.ReadFile(u.shim.Log); err != nil || !strings.Contains(string(log), `version="`+version+`"`) {
		t.Fatalf("the restarted shim is not the new build (%v); see %s", err, u.shim.Log)
	}
	// kubelet's next syncs and the advertiser's next rounds pass through
	// the new shim before the containers are compared: kubelet connected
	// to it, and two rounds of its advertiser done.
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, body := u.get("/metrics")
		return metricAtLeast(body, "kubegpu_crishim_connections_total", 1) &&
			metricAtLeast(body, `kubegpu_crishim_node_syncs_total{result="ok"}`, 2), nil
	}); err != nil {
		_, body := u.get("/metrics")
		t.Fatalf("kubelet and the advertiser did not go through the new shim within a minute:\n%s", body)
	}
	if after := running(ctx, t, ns, pods...); !maps.Equal(after, want) {
		t.Errorf("containers after the upgrade:\n%v\nwant them unchanged:\n%v", after, want)
	}
	if code, body := u.get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz of the new shim: %d %s", code, body)
	}
	if _, body := u.get("/metrics"); !strings.Contains(body, "kubegpu_crishim_modules 1") || strings.Contains(body, "kubegpu_crishim_modules_failed{") {
		t.Errorf("metrics of the new shim:\n%s", body)
	}
	createPods(ctx, t, ns, upgradePod(node, "after", 1, "env", corev1.RestartPolicyNever))
	succeededWithItsDevices(ctx, t, u, ns, "after")

	// The same install again changes nothing and restarts nothing.
	if _, calls = u.install(ctx, next); !slices.Equal(calls, []string{"enable kubegpu-crishim", "start kubegpu-crishim"}) {
		t.Errorf("second install of the same build called systemctl %q, want only enable and start", calls)
	}

	// Uninstall: kubelet back on containerd, the shim stopped and removed;
	// containers still run; a second uninstall has nothing to do.
	out, calls = u.install(ctx, "", "--uninstall")
	if want := []string{"restart kubelet", "disable --now kubegpu-crishim", "daemon-reload"}; !slices.Equal(calls, want) {
		t.Fatalf("uninstall called systemctl %q, want %q\n%s", calls, want, out)
	}
	if got := u.kubeletEndpoint(); got != u.n.Endpoint() {
		t.Fatalf("kubelet's endpoint after uninstall: %q, want the one before install, %q", got, u.n.Endpoint())
	}
	u.act(ctx, calls)
	for _, p := range []string{"usr/local/bin/kubegpu-crishim", "usr/lib/kubegpu", "etc/kubegpu", "etc/default/kubegpu-crishim", "etc/systemd/system/kubegpu-crishim.service"} {
		if _, err := os.Lstat(filepath.Join(u.root, p)); !os.IsNotExist(err) {
			t.Errorf("uninstall left /%s (%v)", p, err)
		}
	}
	if after := running(ctx, t, ns, pods...); !maps.Equal(after, want) {
		t.Errorf("containers after uninstall:\n%v\nwant them unchanged:\n%v", after, want)
	}
	if out, calls = u.install(ctx, "", "--uninstall"); len(calls) != 0 || !strings.Contains(out, "nothing to do") {
		t.Errorf("second uninstall: calls %q\n%s", calls, out)
	}
}

// TestShimModuleFailsToLoad: an upgrade installs a module that does not
// load (install.sh's check skipped). The shim serves CRI without it:
// running containers keep running, a pod without GPUs starts; and it says
// so on /healthz (503, naming the module and the error), in its metrics,
// and in the Node's DevicesReady condition; a GPU container that restarts
// is refused with a message naming the module. Installing a good build
// again mends it all.
func TestShimModuleFailsToLoad(t *testing.T) {
	ctx := context.Background()
	const node = "broken-module-node"
	u := newInstalledNode(ctx, t, node)
	good := currentBuild(t)
	_, calls := u.install(ctx, good)
	u.act(ctx, calls)
	startScheduler(ctx, t)
	ns := namespace(ctx, t, "broken-module")
	createPods(ctx, t, ns,
		upgradePod(node, "steady", 1, "env; exec sleep 3600", corev1.RestartPolicyAlways),
		// Its container exits and kubelet creates it again, every few
		// seconds: each time a CreateContainer with its devices.
		upgradePod(node, "restarting", 1, "env; sleep 2", corev1.RestartPolicyAlways))
	steady := running(ctx, t, ns, "steady")

	out, calls := u.install(ctx, brokenBuild(t), "--no-preflight")
	if !slices.Contains(calls, "restart kubegpu-crishim") {
		t.Fatalf("install of a changed module called systemctl %q\n%s", calls, out)
	}
	u.act(ctx, calls)

	code, body := u.get("/healthz")
	if want := "simgpu.so: load device plugin: plugin " + filepath.Join(u.pluginDir(), "simgpu.so") + ": not a kubegpu device module"; code != http.StatusServiceUnavailable || !strings.Contains(body, want) {
		t.Errorf("/healthz with a module that did not load: %d %q, want 503 and %q", code, body, want)
	}
	if _, body := u.get("/metrics"); !strings.Contains(body, `kubegpu_crishim_modules_failed{module="simgpu.so"} 1`) || !strings.Contains(body, "kubegpu_crishim_modules 0") {
		t.Errorf("metrics with a module that did not load:\n%s", body)
	}
	c := u.devicesReady(ctx, corev1.ConditionFalse)
	if c.Reason != kubeinterface.ReasonModuleLoadFailed || !strings.Contains(c.Message, "simgpu.so: load device plugin") {
		t.Errorf("condition %s: %+v", kubeinterface.ConditionDevicesReady, c)
	}

	// CRI is served: the running container is untouched, a pod without
	// GPUs starts, and the GPU container's next start is refused, saying
	// why.
	createPods(ctx, t, ns, upgradePod(node, "plain", 0, "exec sleep 3600", corev1.RestartPolicyAlways))
	running(ctx, t, ns, "plain")
	if got := running(ctx, t, ns, "steady"); got["steady"] != steady["steady"] {
		t.Errorf("steady container after the broken upgrade: %s, was %s", got["steady"], steady["steady"])
	}
	const refusal = "device modules failed on this node: simgpu.so (the Node's condition kubegpu.io/DevicesReady says why)"
	var last corev1.ContainerStatus
	if err := wait.PollUntilContextTimeout(ctx, 300*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := viewer.Client.CoreV1().Pods(ns).Get(ctx, "restarting", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false, nil
		}
		last = p.Status.ContainerStatuses[0]
		w := last.State.Waiting
		return w != nil && w.Reason == "CreateContainerError" && strings.Contains(w.Message, refusal), nil
	}); err != nil {
		t.Errorf("restarting GPU container: %+v, want CreateContainerError saying %q; shim log %s", last, refusal, u.shim.Log)
	}

	// A good build again: the condition clears and the GPU container runs.
	_, calls = u.install(ctx, good)
	u.act(ctx, calls)
	u.devicesReady(ctx, corev1.ConditionTrue)
	if code, body := u.get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz after the good build: %d %s", code, body)
	}
	from := last.RestartCount
	if err := wait.PollUntilContextTimeout(ctx, 300*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := viewer.Client.CoreV1().Pods(ns).Get(ctx, "restarting", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false, nil
		}
		last = p.Status.ContainerStatuses[0]
		return last.RestartCount >= from+2, nil
	}); err != nil {
		t.Errorf("restarting GPU container after the good build: %+v, want it restarted again", last)
	}
}

// metricAtLeast reports whether the Prometheus text body has the series
// (name with its labels, as printed) at min or more.
func metricAtLeast(body, series string, minimum float64) bool {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return err == nil && f >= minimum
		}
	}
	return false
}
