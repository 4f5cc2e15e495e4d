package nvidia

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/kubegpu/kubegpu/plugins/nvidia/nvmltest"
	"github.com/kubegpu/kubegpu/types"
)

// newTestDaemons runs the MPS stand-in; it mounts tmpfs, so it needs root.
func newTestDaemons(t *testing.T) (*mpsDaemons, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the MPS daemons mount tmpfs: needs root")
	}
	dir := t.TempDir()
	control := filepath.Join(dir, "nvidia-cuda-mps-control")
	if err := os.WriteFile(control, []byte(nvmltest.MPSControlStandIn), 0o755); err != nil {
		t.Fatal(err)
	}
	m, err := newMPSDaemons(config{mpsRoot: filepath.Join(dir, "mps"), mpsControl: control, mpsShmMiB: DefaultMPSShmMiB})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.release(t.Context(), nil, time.Now().Add(time.Hour)) })
	return m, dir
}

func TestMPSDaemons(t *testing.T) {
	m, dir := newTestDaemons(t)
	ctx := t.Context()
	limits := mpsLimits{ThreadPercent: 25, PinnedMemory: "0=1024M"}
	for _, bad := range [][2]string{{"../etc", "main"}, {"uid", "a/b"}, {"UID", "main"}, {"", "main"}} {
		if _, err := m.ensure(ctx, bad[0], bad[1], []string{"GPU-1"}, limits); err == nil {
			t.Errorf("ensure(%q, %q) made directories", bad[0], bad[1])
		}
	}
	d, err := m.ensure(ctx, "pod-a", "main", []string{"GPU-1"}, limits)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := readRecord(filepath.Dir(d.pipe))
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.shm, &st); err != nil || st.Blocks*uint64(st.Bsize) > DefaultMPSShmMiB<<20 {
		t.Errorf("shm %s: %v, %d bytes: want a tmpfs of at most %d", d.shm, err, st.Blocks*uint64(st.Bsize), DefaultMPSShmMiB<<20)
	}
	log, _ := os.ReadFile(filepath.Join(dir, "standin.log"))
	if want := "start " + d.pipe + " devices=GPU-1 threads=25 pinned=0=1024M\n"; !strings.Contains(string(log), want) {
		t.Errorf("daemon started without its limits: want %q in\n%s", want, log)
	}
	if b, err := os.ReadFile(filepath.Join(d.shm, "mps-daemon")); err != nil || strings.TrimSpace(string(b)) != d.pipe {
		t.Errorf("the daemon's /dev/shm is not the container's shm directory: %q, %v", b, err)
	}
	// A restart of the container gets a daemon started afresh; a shim
	// that starts anew sets a running daemon's limits again.
	if _, err := m.query(ctx, d.pipe, "set_default_active_thread_percentage 100"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ensure(ctx, "pod-a", "main", []string{"GPU-1"}, limits); err != nil {
		t.Fatal(err)
	}
	again, _ := readRecord(filepath.Dir(d.pipe))
	if again.PID == first.PID || m.alive(first) || !m.alive(again) {
		t.Errorf("restart: daemon %d (alive %v), then %d (alive %v); want a new one alone", first.PID, m.alive(first), again.PID, m.alive(again))
	}
	if got, err := m.query(ctx, d.pipe, "get_default_active_thread_percentage"); err != nil || got != "25.0" {
		t.Errorf("the restarted container's daemon: %q, %v; want its own 25.0", got, err)
	}
	if _, err := m.query(ctx, d.pipe, "set_default_active_thread_percentage 100"); err != nil {
		t.Fatal(err)
	}
	m.restore(ctx)
	if got, err := m.query(ctx, d.pipe, "get_default_active_thread_percentage"); err != nil || got != "25.0" {
		t.Errorf("after restore: %q, %v; want 25.0", got, err)
	}
	first = again
	// A tenant replaces its control pipe with one nobody reads: the
	// daemon still stops, within the timeouts.
	if err := os.Remove(filepath.Join(d.pipe, "control")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(d.pipe, "control"), 0o666); err != nil {
		t.Fatal(err)
	}
	// Pods whose directories postdate the list are kept.
	if err := m.release(ctx, nil, time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if !m.alive(first) {
		t.Fatal("release stopped a daemon started after the list of live pods")
	}
	start := time.Now()
	if err := m.release(ctx, map[string]bool{"pod-b": true}, time.Now().Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if m.alive(first) || time.Since(start) > 3*mpsQuitTimeout {
		t.Errorf("tampered daemon: alive %v after %v", m.alive(first), time.Since(start))
	}
	if left, _ := os.ReadDir(m.root); len(left) != 0 {
		t.Errorf("pod-a's directories outlive it: %v", left)
	}
	if mounts, _ := os.ReadFile("/proc/self/mounts"); strings.Contains(string(mounts), m.root) {
		t.Errorf("mounts left under %s", m.root)
	}
}

// TestMPSRelease: a released pod's directory is renamed out of the way
// under the lock, so a container of the same pod started afterwards (its
// sandbox missed the list) gets a daemon and directories of its own; a
// release cut short is finished by the next one.
func TestMPSRelease(t *testing.T) {
	m, _ := newTestDaemons(t)
	ctx := t.Context()
	limits := mpsLimits{ThreadPercent: 10}
	if _, err := m.ensure(ctx, "pod-a", "c1", []string{"GPU-1"}, limits); err != nil {
		t.Fatal(err)
	}
	if err := m.release(ctx, nil, time.Now().Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	d, err := m.ensure(ctx, "pod-a", "c2", []string{"GPU-1"}, limits)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := readRecord(filepath.Dir(d.pipe)); !ok || !m.alive(r) {
		t.Fatalf("a container started after the release has no daemon: %+v %v", r, ok)
	}
	if err := os.MkdirAll(filepath.Join(m.root, tombstonePrefix+"pod-z-1", "c"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := m.release(ctx, map[string]bool{"pod-a": true}, time.Now().Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(m.root); len(left) != 1 || left[0].Name() != "pod-a" {
		t.Errorf("after the release: %v, want pod-a alone", left)
	}
}

// TestMPSEnforcedReadBack: a container's daemon gets its memory limit set
// through its pipe as well as in its environment, and Enforced reads back
// what the daemon reports, per device of the allocation; a client that
// raises a default through the pipe shows in the read-back; a daemon that
// is gone is an error, not an empty report.
func TestMPSEnforcedReadBack(t *testing.T) {
	m, _ := newTestDaemons(t)
	ctx := t.Context()
	// NVML's view of the two GPUs: GPU-A runs the daemon's server (PID
	// 100) serving a client (101) of pod-a, and a process of pod-a's own
	// context (102) once it escapes; GPU-B another pod's process (200).
	proc := t.TempDir()
	for pid, p := range map[int][2]string{
		100: {"nvidia-cuda-mps", "0::/system.slice/kubegpu-crishim.service"}, // the server, in the shim's cgroup
		101: {"python", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podpod_a.slice/cri-containerd-1.scope"},
		102: {"python", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podpod_a.slice/cri-containerd-1.scope"},
		200: {"python", "0::/kubepods/besteffort/podpod-b/2"},
	} {
		dir := filepath.Join(proc, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		_ = os.WriteFile(filepath.Join(dir, "comm"), []byte(p[0]+"\n"), 0o644)
		_ = os.WriteFile(filepath.Join(dir, "cgroup"), []byte(p[1]+"\n"), 0o644)
	}
	escaped := false
	gpuA := &mock.Device{
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			procs := []nvml.ProcessInfo{{Pid: 100}, {Pid: 101}}
			if escaped {
				procs = append(procs, nvml.ProcessInfo{Pid: 102})
			}
			return procs, nvml.SUCCESS
		},
		GetMPSComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return []nvml.ProcessInfo{{Pid: 101}}, nvml.SUCCESS },
	}
	gpuB := &mock.Device{
		GetComputeRunningProcessesFunc:    func() ([]nvml.ProcessInfo, nvml.Return) { return []nvml.ProcessInfo{{Pid: 200}}, nvml.SUCCESS },
		GetMPSComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS },
	}
	n := &node{mps: m, procRoot: proc, answering: []gpuRecord{
		{handle: gpuA, dev: types.Device{UUID: "GPU-A"}}, {handle: gpuB, dev: types.Device{UUID: "GPU-B"}}}}
	alloc := types.ContainerAllocation{Name: "main", Devices: []types.DeviceShare{
		{ID: "gpu1", UUID: "GPU-B", MemoryMiB: 2500, ComputePercent: 25},
		{ID: "gpu0", UUID: "GPU-A", MemoryMiB: 4096, ComputePercent: 25},
	}}
	// Ordinals in PCI order: GPU-A (ordinal 0) holds 4096 MiB, GPU-B 2500
	// (which the daemon reports as "2G", exact to its unit).
	d, err := m.ensure(ctx, "pod-a", "main", []string{"GPU-A", "GPU-B"}, mpsLimits{ThreadPercent: 25, PinnedMemory: "0=4096M,1=2500M"})
	if err != nil {
		t.Fatal(err)
	}
	e, err := n.Enforced(ctx, "pod-a", alloc)
	if err != nil {
		t.Fatal(err)
	}
	want := types.Enforcement{Mechanism: types.EnforcerMPS, ComputePercent: 25, MemoryMiB: []int64{2500, 4096}}
	if !reflect.DeepEqual(e, want) {
		t.Fatalf("Enforced = %+v, want %+v", e, want)
	}
	if err := e.Mismatch(alloc); err != nil {
		t.Errorf("the limits set are reported a mismatch: %v", err)
	}
	// A client raises the default through the pipe.
	if _, err := m.query(ctx, d.pipe, "set_default_active_thread_percentage 100"); err != nil {
		t.Fatal(err)
	}
	e, err = n.Enforced(ctx, "pod-a", alloc)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Mismatch(alloc); err == nil || !strings.Contains(err.Error(), "compute unlimited, granted 25%") {
		t.Errorf("a raised thread percentage: mismatch %v, want compute unlimited named", err)
	}
	if _, err := n.Enforced(ctx, "pod-b", alloc); err == nil {
		t.Error("Enforced for a container without a daemon reported limits")
	}
	// A server of the daemon (as a client with the pipe can start one)
	// runs with the whole GPU while the defaults say 25%.
	if _, err := m.query(ctx, d.pipe, "set_default_active_thread_percentage 25"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.pipe, ".servers"), []byte("4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := m.query(ctx, d.pipe, "set_active_thread_percentage 4242 100"); err != nil {
		t.Fatal(err)
	}
	e, err = n.Enforced(ctx, "pod-a", alloc)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Mismatch(alloc); err == nil || !strings.Contains(err.Error(), "compute unlimited, granted 25%") {
		t.Errorf("a server at 100%% beside 25%% defaults: mismatch %v, want compute unlimited named", err)
	}
	_ = os.Remove(filepath.Join(d.pipe, ".servers"))

	// A process of the pod with a CUDA context of its own on GPU-A.
	escaped = true
	if _, err := m.query(ctx, d.pipe, "set_default_active_thread_percentage 25"); err != nil {
		t.Fatal(err)
	}
	e, err = n.Enforced(ctx, "pod-a", alloc)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Mismatch(alloc); err == nil || !strings.Contains(err.Error(), "processes outside mps: PID 102 on GPU GPU-A") {
		t.Errorf("a process outside MPS: mismatch %v, want PID 102 named", err)
	}
	// A driver that cannot list the MPS clients (every client would look
	// like an escape) or the processes: the limits are proven, escapes
	// said unknown.
	gpuA.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	e, err = n.Enforced(ctx, "pod-a", alloc)
	if err != nil || e.Mismatch(alloc) != nil || !strings.Contains(e.String(), "processes outside it not checked") {
		t.Errorf("MPS clients not listed: %s, %v, mismatch %v; want the limits proven and escapes unknown", e, err, e.Mismatch(alloc))
	}
}

func TestParseMPSAnswers(t *testing.T) {
	for in, want := range map[string]memLimit{"": {}, "4G": {4096, 1024}, "2048M": {2048, 1}, "512K": {0, 1}, "70G": {71680, 1024}, "1T": {1 << 20, 1 << 20}} {
		if got, err := parseMemoryLimit(in); err != nil || got != want {
			t.Errorf("parseMemoryLimit(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	if l, _ := parseMemoryLimit("70G"); !l.holds(71885) || l.holds(72704) || l.holds(71679) {
		t.Error(`"70G" must hold 71885 MiB and not 72704 or 71679`)
	}
	for _, bad := range []string{"4", "G", "-1G", "4X", "1.5G", "99999999999G"} {
		if _, err := parseMemoryLimit(bad); err == nil {
			t.Errorf("parseMemoryLimit(%q) accepted", bad)
		}
	}
	for in, want := range map[string]int{"": 100, "25.0": 25, "100.0": 100, "12.5": 13, "0": 0} {
		if got, err := parseThreads(in); err != nil || got != want {
			t.Errorf("parseThreads(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"x", "101", "-1"} {
		if _, err := parseThreads(bad); err == nil {
			t.Errorf("parseThreads(%q) accepted", bad)
		}
	}
}

// FuzzParseMPSAnswers: whatever a daemon answers, the parsers return a
// limit in range or an error, never panic.
func FuzzParseMPSAnswers(f *testing.F) {
	for _, s := range []string{"", "4G", "2048M", "25.0", "100.0", "512K", "1T", "G", "-1", "NaN",
		"/kubepods/burstable/pod0a1b/0123", "/kubepods.slice/kubepods-pod0a_1b.slice/x", "kubepods/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if l, err := parseMemoryLimit(s); err == nil && (l.mib < 0 || l.unit < 0) {
			t.Errorf("parseMemoryLimit(%q) = %+v", s, l)
		}
		if p, err := parseThreads(s); err == nil && (p < 0 || p > 100) {
			t.Errorf("parseThreads(%q) = %d", s, p)
		}
		// A cgroup path, which a container partly names.
		if uid := kubeletPod(s); uid != "" && !strings.Contains(s, "pod") {
			t.Errorf("kubeletPod(%q) = %q without a pod segment", s, uid)
		}
	})
}

func TestKubeletPod(t *testing.T) {
	for path, want := range map[string]string{
		"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a1b_2c.slice/cri-containerd-1.scope": "0a1b-2c",
		"/kubepods.slice/kubepods-pod0a1b_2c.slice/cri-containerd-1.scope":                                    "0a1b-2c",
		"/kubepods/besteffort/pod0a1b-2c/0123":                                                                "0a1b-2c",
		"/kubepods/pod0a1b-2c/0123":                                                                           "0a1b-2c",
		"/system.slice/containerd.service/kubepods/burstable/pod0a1b-2c/0123":                                 "0a1b-2c",
		// A cgroup a container made below its own names no other pod.
		"/kubepods/burstable/podaaaa/0123/podbbbb":                                             "aaaa",
		"/kubepods.slice/kubepods-podaaaa.slice/cri-containerd-1.scope/kubepods-podbbbb.slice": "aaaa",
		"/kubepods/burstable/0123/podbbbb":                                                     "",
		"/system.slice/kubegpu-crishim.service":                                                "",
		"/kubegpu-hardware-podpod-rest":                                                        "",
		"/kubepods.slice/other.slice/kubepods-podbbbb.slice":                                   "",
	} {
		if got := kubeletPod(path); got != want {
			t.Errorf("kubeletPod(%q) = %q, want %q", path, got, want)
		}
	}
}
