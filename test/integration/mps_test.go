package integration

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubegpu/kubegpu/plugins/nvidia/nvmltest"
	"github.com/kubegpu/kubegpu/types"
	"github.com/kubegpu/kubegpu/utils/plugintest"
)

// TestShimMPSDaemonPerContainer: with MPS on, the real nvidia.so in the
// real shim (NVML faked, nvidia-cuda-mps-control stood in for by
// nvmltest.MPSControlStandIn) gives each container with slices an MPS
// daemon of its own, for its GPUs, with its limits as the daemon's
// defaults, and its own pipe directory and /dev/shm (the daemon's, a
// tmpfs) under a root-only directory; two pods sharing a GPU never see
// each other's; the daemon stops when its pod is gone.
func TestShimMPSDaemonPerContainer(t *testing.T) {
	ctx := context.Background()
	n := startNode(ctx, t)
	dir := t.TempDir()
	plugins := filepath.Join(dir, "plugins")
	so, err := os.ReadFile(filepath.Join(pluginDir, "nvidia.so"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(plugins, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(plugins, "nvidia.so"), so, 0o644); err != nil {
		t.Fatal(err)
	}
	control := filepath.Join(dir, "nvidia-cuda-mps-control")
	if err := os.WriteFile(control, []byte(nvmltest.MPSControlStandIn), 0o755); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "mps")
	t.Cleanup(func() { quitStandIns(root) })
	const node = "mps-node"
	shim, sock := startShim(ctx, t, n, node, "--advertise=false", "--interval=1s", "--plugin-dir="+plugins,
		"--plugin-option=nvidia.nvml-library="+plugintest.BuildCLibrary(t, nvmltest.FakeLibrary, "libnvidia-ml.so.1"),
		"--plugin-option=nvidia.health-checks=false", "--plugin-option=nvidia.edits=env", "--plugin-option=nvidia.mps=true",
		"--plugin-option=nvidia.mps-root="+root, "--plugin-option=nvidia.mps-control="+control)
	slice := &types.PodAllocation{Containers: []types.ContainerAllocation{{Name: "main",
		Devices: []types.DeviceShare{{ID: "gpu0", UUID: nvmltest.FakeLibraryGPU, MemoryMiB: 8192, ComputePercent: 25}}}}}
	run := func(name string) string {
		t.Helper()
		p := guardPod{name: name, namespace: "tenant-" + name, alloc: slice, key: signingKey, sleep: true,
			script: "cat /tmp/nvidia-mps/whoami; echo " + name + " > /dev/shm/from-" + name + "; ls /dev/shm"}
		podCfg, ctrCfg := p.write(t, t.TempDir(), node)
		out, err := runEnv(ctx, t, n, sock, podCfg, ctrCfg)
		if err != nil {
			t.Fatalf("%s: %v; shim log %s", name, err, shim.Log)
		}
		return out
	}
	a, b := run("a"), run("b")
	for name, out := range map[string]string{"a": a, "b": b} {
		other := map[string]string{"a": "b", "b": "a"}[name]
		pipe := filepath.Join(root, "uid-"+name, "main", "pipe")
		for _, want := range []string{pipe, "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M", "from-" + name, "mps-daemon"} {
			if !strings.Contains(out, want) {
				t.Errorf("pod %s lacks %q:\n%s", name, want, out)
			}
		}
		if strings.Contains(out, "uid-"+other) || strings.Contains(out, "from-"+other) {
			t.Errorf("pod %s sees pod %s's MPS daemon or shared memory:\n%s", name, other, out)
		}
		shm := filepath.Join(root, "uid-"+name, "main", "shm")
		if _, err := os.Stat(filepath.Join(shm, "from-"+name)); err != nil {
			t.Errorf("pod %s's /dev/shm is not its own MPS shm directory: %v", name, err)
		}
	}
	log, _ := os.ReadFile(filepath.Join(dir, "standin.log"))
	for _, name := range []string{"a", "b"} {
		// The limits are the daemon's own defaults, which the container
		// can only lower.
		want := "start " + filepath.Join(root, "uid-"+name, "main", "pipe") + " devices=" + nvmltest.FakeLibraryGPU +
			" threads=25 pinned=0=8192M\n"
		if !strings.Contains(string(log), want) {
			t.Errorf("stand-in log lacks %q:\n%s", want, log)
		}
	}
	if fi, err := os.Stat(root); err != nil || fi.Mode().Perm() != 0o700 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("MPS root %s: %v, mode %v: want root's alone", root, err, fi.Mode())
	}

	// Pod a is gone: its daemon is told to quit and its directories go.
	id := podID(ctx, t, n, sock, "a")
	for _, verb := range []string{"stopp", "rmp"} {
		if out, err := crictl(ctx, n, sock, verb, id); err != nil {
			t.Fatalf("%s: %v: %s", verb, err, out)
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		_, err := os.Stat(filepath.Join(root, "uid-a"))
		return os.IsNotExist(err), nil
	}); err != nil {
		t.Errorf("pod a's MPS directories outlive it; shim log %s", shim.Log)
	}
	if n := daemons(filepath.Join(root, "uid-a", "main", "pipe")); n != 0 {
		t.Errorf("pod a's daemon outlives it (%d processes)", n)
	}
	if n := daemons(filepath.Join(root, "uid-b", "main", "pipe")); n == 0 {
		t.Error("pod b's daemon stopped with pod a")
	}
}

// quitStandIns ends the stand-in daemons left under root (the shim stopped
// before it released them) and unmounts their directories.
func quitStandIns(root string) {
	envs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, e := range envs {
		b, err := os.ReadFile(e)
		if err != nil || !strings.Contains(string(b), "CUDA_MPS_PIPE_DIRECTORY="+root+"/") {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(e))); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for _, sub := range []string{"pipe", "shm", "log"} {
		dirs, _ := filepath.Glob(filepath.Join(root, "*", "*", sub))
		for _, d := range dirs {
			_ = syscall.Unmount(d, syscall.MNT_DETACH)
		}
	}
}

// daemons counts the processes whose CUDA_MPS_PIPE_DIRECTORY is pipe.
func daemons(pipe string) int {
	n := 0
	envs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, e := range envs {
		b, err := os.ReadFile(e)
		if err == nil && strings.Contains("\x00"+string(b)+"\x00", "\x00CUDA_MPS_PIPE_DIRECTORY="+pipe+"\x00") {
			n++
		}
	}
	return n
}
