package nvidia

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubegpu/kubegpu/plugins/nvidia/internal/cudaprobe"
	"github.com/kubegpu/kubegpu/types"
)

// envProbe makes the test binary a CUDA client (TestCUDAProbeHelper):
// TestHardware runs it inside a slice's environment.
const envProbe = "KUBEGPU_CUDA_PROBE"

// probeJob is what one CUDA client does: allocate each of AllocMiB in turn
// (keeping them, so that they add up), then time the kernel for Spin.
type probeJob struct {
	AllocMiB []uint64      `json:"allocMiB,omitempty"`
	Spin     time.Duration `json:"spin,omitempty"`
	// Spinning, if set, is a file the client makes once its kernel is
	// compiled and launched: from then on it keeps the GPU busy.
	Spinning string `json:"spinning,omitempty"`
}

// probeResult is what the client saw.
type probeResult struct {
	SMs        int      `json:"sms"`
	FreeMiB    uint64   `json:"freeMiB"`
	Allocated  []bool   `json:"allocated,omitempty"`
	OOM        []bool   `json:"oom,omitempty"`
	GFMAPerSec float64  `json:"gfmaPerSec,omitempty"`
	Errors     []string `json:"errors,omitempty"`
}

// TestCUDAProbeHelper is the CUDA client, run by TestHardware as a
// process of its own: it prints one probeResult as JSON.
func TestCUDAProbeHelper(t *testing.T) {
	job := os.Getenv(envProbe)
	if job == "" {
		t.Skip("a helper process of TestHardware")
	}
	var j probeJob
	var r probeResult
	defer func() {
		b, _ := json.Marshal(r)
		fmt.Printf("PROBE %s\n", b)
	}()
	if err := json.Unmarshal([]byte(job), &j); err != nil {
		r.Errors = append(r.Errors, err.Error())
		return
	}
	d, err := cudaprobe.Open("", 0)
	if err != nil {
		r.Errors = append(r.Errors, err.Error())
		return
	}
	r.SMs = d.SMs
	free, _, err := d.MemInfo()
	if err != nil {
		r.Errors = append(r.Errors, err.Error())
	}
	r.FreeMiB = free >> 20
	for _, mib := range j.AllocMiB {
		_, err := d.Alloc(mib << 20)
		r.Allocated = append(r.Allocated, err == nil)
		r.OOM = append(r.OOM, errors.Is(err, cudaprobe.ErrOutOfMemory))
		if err != nil && !errors.Is(err, cudaprobe.ErrOutOfMemory) {
			r.Errors = append(r.Errors, err.Error())
		}
	}
	if j.Spin > 0 {
		warm := func() {
			if j.Spinning != "" {
				_ = os.WriteFile(j.Spinning, nil, 0o644)
			}
		}
		if r.GFMAPerSec, err = d.Spin(j.Spin, warm); err != nil {
			r.Errors = append(r.Errors, err.Error())
		}
	}
}

// slice is one container's MPS environment on the host: its pipe and
// shared memory directories, and its GPU.
type slice struct {
	pipe, shm, gpu string
}

// runProbe runs the test binary as a CUDA client doing job: inside s as a
// container sees it (its daemon's /dev/shm, its pipe directory bound
// read-only), or with no MPS daemon when s is nil; in the cgroup cgroup
// (a directory of the cgroup v2 tree) when it is not empty.
func runProbe(ctx context.Context, t *testing.T, s *slice, gpu, cgroup string, job probeJob) probeResult {
	t.Helper()
	b, _ := json.Marshal(job)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), envProbe+"="+string(b), "CUDA_VISIBLE_DEVICES="+gpu, "CUDA_DEVICE_ORDER=PCI_BUS_ID")
	join := `true`
	if cgroup != "" {
		join = `echo $$ > "$5/cgroup.procs"`
	}
	var cmd *exec.Cmd
	switch {
	case s == nil && cgroup == "":
		cmd = exec.CommandContext(ctx, self, "-test.run=^TestCUDAProbeHelper$")
		env = append(env, "CUDA_MPS_PIPE_DIRECTORY="+filepath.Join(t.TempDir(), "no-daemon"))
	case s == nil:
		// A pod's process: a PID namespace of its own.
		cmd = exec.CommandContext(ctx, "unshare", "--pid", "--fork", "--mount-proc", "--", "/bin/sh", "-c",
			join+` && exec "$4" -test.run='^TestCUDAProbeHelper$'`, "probe", "", "", "", self, cgroup)
		env = append(env, "CUDA_MPS_PIPE_DIRECTORY="+filepath.Join(t.TempDir(), "no-daemon"))
	default:
		ro := filepath.Join(t.TempDir(), "nvidia-mps")
		if err := os.Mkdir(ro, 0o755); err != nil {
			t.Fatal(err)
		}
		// As a container: mount and PID namespaces of its own.
		cmd = exec.CommandContext(ctx, "unshare", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "slave", "--", "/bin/sh", "-c",
			join+` && mount --bind "$1" /dev/shm && mount --bind "$2" "$3" && mount -o remount,bind,ro "$3" && exec "$4" -test.run='^TestCUDAProbeHelper$'`,
			"probe", s.shm, s.pipe, ro, self, cgroup)
		env = append(env, "CUDA_MPS_PIPE_DIRECTORY="+ro)
	}
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	i := strings.LastIndex(string(out), "PROBE ")
	if i < 0 {
		t.Fatalf("CUDA client: %v\n%s", err, out)
	}
	line, _, _ := strings.Cut(string(out[i+len("PROBE "):]), "\n")
	var r probeResult
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		t.Fatalf("CUDA client's result %q: %v", line, err)
	}
	return r
}

// checkSliceLimits proves a 25% / 4 GiB MPS slice on g with real CUDA
// clients: allocations within the slice succeed and beyond it fail, and
// the compute-bound kernel's rate follows the thread percentage, alone and
// while a 75% slice on the same GPU spins.
func checkSliceLimits(ctx context.Context, t *testing.T, pp types.PodScopedPlugin, g types.Device, root string) {
	t.Helper()
	prover, ok := pp.(types.EnforcementProver)
	if !ok {
		t.Fatal("the node side with MPS does not read back what it enforces")
	}
	const quarterMiB = 4096
	solo := runProbe(ctx, t, nil, g.UUID, "", probeJob{Spin: 3 * time.Second})
	if len(solo.Errors) > 0 || solo.GFMAPerSec <= 0 {
		t.Fatalf("CUDA client with the whole GPU: %+v", solo)
	}
	t.Logf("whole GPU, no MPS: %d SMs, %.0f GFMA/s", solo.SMs, solo.GFMAPerSec)

	allocs := map[string]types.ContainerAllocation{}
	start := func(pod string, percent int, mib int64) *slice {
		alloc := types.ContainerAllocation{Name: "main", Devices: []types.DeviceShare{{ID: g.ID, UUID: g.UUID, MemoryMiB: mib, ComputePercent: percent}}}
		allocs[pod] = alloc
		if _, err := pp.PodContainerEdits(ctx, pod, alloc); err != nil {
			t.Fatalf("edits for a %d%% / %d MiB slice: %v", percent, mib, err)
		}
		e, err := prover.Enforced(ctx, pod, alloc)
		if err != nil {
			t.Fatalf("read back the %d%% slice's limits: %v", percent, err)
		}
		t.Logf("%d%% / %d MiB slice, read back through its pipe: %s", percent, mib, e)
		if err := e.Mismatch(alloc); err != nil {
			t.Errorf("%d%% / %d MiB slice: %v", percent, mib, err)
		}
		dir := filepath.Join(root, pod, "main")
		return &slice{pipe: filepath.Join(dir, "pipe"), shm: filepath.Join(dir, "shm"), gpu: g.UUID}
	}
	q := start("pod-quarter", 25, quarterMiB)
	// The unprivileged user first: what it gets is not masked by root's.
	tryControl(ctx, t, q, "nobody", "--reuid=65534 --regid=65534 --clear-groups")
	tryControl(ctx, t, q, "root", "")
	if e, err := prover.Enforced(ctx, "pod-quarter", allocs["pod-quarter"]); err != nil || e.Mismatch(allocs["pod-quarter"]) != nil {
		// A container's user changed the limits: put them back for the
		// checks below (a restart of the container would).
		t.Logf("read back after the container users' attempts: %+v, %v", e, err)
		if _, err := exec.CommandContext(ctx, "sh", "-c", `echo "set_default_active_thread_percentage 25" | CUDA_MPS_PIPE_DIRECTORY="$0" nvidia-cuda-mps-control`, q.pipe).CombinedOutput(); err != nil {
			t.Fatal(err)
		}
	}

	mem := runProbe(ctx, t, q, g.UUID, "", probeJob{AllocMiB: []uint64{3072, 2048}})
	t.Logf("in the slice: %d SMs, %d MiB free, 3072 MiB allocated %v, 2048 MiB more %v (out of memory %v)", mem.SMs, mem.FreeMiB, mem.Allocated, mem.OOM, mem.OOM)
	switch {
	case len(mem.Errors) > 0:
		t.Errorf("CUDA client in the slice: %v", mem.Errors)
	case len(mem.Allocated) != 2 || !mem.Allocated[0]:
		t.Errorf("3 GiB in a 4 GiB slice was not allocated: %+v", mem)
	case mem.Allocated[1] || !mem.OOM[1]:
		t.Errorf("5 GiB in all in a 4 GiB slice: the second allocation %+v, want out of memory", mem)
	}
	if mem.FreeMiB > quarterMiB {
		t.Errorf("the slice's client sees %d MiB free, more than its %d MiB", mem.FreeMiB, quarterMiB)
	}
	big := runProbe(ctx, t, q, g.UUID, "", probeJob{AllocMiB: []uint64{5120}})
	if len(big.OOM) != 1 || !big.OOM[0] {
		t.Errorf("5 GiB at once in a 4 GiB slice: %+v, want out of memory", big)
	}

	alone := runProbe(ctx, t, q, g.UUID, "", probeJob{Spin: 3 * time.Second})
	ratio := alone.GFMAPerSec / solo.GFMAPerSec
	t.Logf("25%% slice alone: %d SMs, %.0f GFMA/s, %.2f of the whole GPU's rate", alone.SMs, alone.GFMAPerSec, ratio)
	if ratio < 0.15 || ratio > 0.35 {
		t.Errorf("25%% slice alone ran at %.2f of the whole GPU's rate, want about 0.25", ratio)
	}

	other := start("pod-rest", 75, g.MemoryMiB/2)
	done := make(chan probeResult, 1)
	spinning := filepath.Join(t.TempDir(), "spinning")
	cgRest, cgQuarter := podCgroup(t, "pod-rest"), podCgroup(t, "pod-quarter")
	go func() {
		done <- runProbe(ctx, t, other, g.UUID, cgRest, probeJob{Spin: 9 * time.Second, Spinning: spinning})
	}()
	waitFile(t, spinning, "the 75% slice's CUDA client did not start spinning")
	// A client of the pod's own daemon is not an escape.
	if cgRest != "" {
		e, err := prover.Enforced(ctx, "pod-rest", allocs["pod-rest"])
		switch {
		case err != nil:
			t.Errorf("read back the 75%% slice while its client spins: %v", err)
		case len(e.Escapes) > 0:
			t.Errorf("the 75%% slice's own MPS client was taken for an escape: %v", e.Escapes)
		default:
			t.Log("75% slice while its client (in its pod's cgroup) spins: no process outside MPS")
		}
	}
	busy := runProbe(ctx, t, q, g.UUID, "", probeJob{Spin: 3 * time.Second})
	rest := <-done
	ratio = busy.GFMAPerSec / solo.GFMAPerSec
	t.Logf("25%% slice while a 75%% slice (its own MPS daemon) spins: %.0f GFMA/s, %.2f of the whole GPU's rate; the 75%% slice %.0f GFMA/s (%.2f, over its 9 s)",
		busy.GFMAPerSec, ratio, rest.GFMAPerSec, rest.GFMAPerSec/solo.GFMAPerSec)
	if ratio > 0.35 {
		t.Errorf("25%% slice beside another ran at %.2f of the whole GPU's rate, more than its share", ratio)
	}
	// Two daemons' servers are two contexts that the GPU time-slices:
	// each slice then gets its SMs about half of the time.
	if ratio < 0.08 {
		t.Errorf("25%% slice beside another ran at %.2f of the whole GPU's rate: starved", ratio)
	}
	t.Logf("summary: solo %.0f, slice alone %.2f, slice beside a 75%% slice %.2f (ratios of the solo rate)", solo.GFMAPerSec, alone.GFMAPerSec/solo.GFMAPerSec, ratio)

	// A process of the 25% slice's pod that skips its daemon: a context
	// of its own on the whole GPU, found and named.
	if cgQuarter == "" {
		return
	}
	escaping := filepath.Join(t.TempDir(), "escaping")
	go func() {
		done <- runProbe(ctx, t, nil, g.UUID, cgQuarter, probeJob{Spin: 6 * time.Second, Spinning: escaping})
	}()
	waitFile(t, escaping, "the escaping CUDA client did not start spinning")
	e, err := prover.Enforced(ctx, "pod-quarter", allocs["pod-quarter"])
	if err != nil {
		t.Errorf("read back the 25%% slice while a process of its pod escapes: %v", err)
	} else if merr := e.Mismatch(allocs["pod-quarter"]); merr == nil || len(e.Escapes) == 0 {
		t.Errorf("a process of the pod outside its MPS daemon was not found: %+v", e)
	} else {
		t.Logf("a process of the 25%% slice's pod outside MPS: %v", merr)
	}
	esc := <-done
	t.Logf("the escaping client ran at %.2f of the whole GPU's rate", esc.GFMAPerSec/solo.GFMAPerSec)
}

// tryControl has a user of the container (root as the container's own,
// or an unprivileged one; setprivArgs for setpriv) raise its daemon's
// default thread percentage through the read-only pipe, and logs what the
// daemon then reports: what a container's user can do to its limits.
func tryControl(ctx context.Context, t *testing.T, s *slice, who, setprivArgs string) {
	t.Helper()
	ro := filepath.Join(t.TempDir(), "nvidia-mps")
	if err := os.Mkdir(ro, 0o755); err != nil {
		t.Fatal(err)
	}
	control, err := exec.LookPath(DefaultMPSControl)
	if err != nil {
		t.Fatal(err)
	}
	as := `exec "$3"`
	if setprivArgs != "" {
		as = `exec setpriv ` + setprivArgs + ` "$3"`
	}
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "slave", "--", "/bin/sh", "-c",
		`mount --bind "$1" "$2" && mount -o remount,bind,ro "$2" && export CUDA_MPS_PIPE_DIRECTORY="$2" && `+as, "control", s.pipe, ro, control)
	cmd.Stdin = strings.NewReader("set_default_active_thread_percentage 100\n")
	out, err := cmd.CombinedOutput()
	after, qerr := mpsQuery(ctx, s.pipe, "get_default_active_thread_percentage")
	t.Logf("the container's %s asked its daemon for 100%% through the read-only pipe: %q, %v; the daemon now reports %q, %v",
		who, strings.TrimSpace(string(out)), err, after, qerr)
}

// podCgroup makes a cgroup v2 directory named as kubelet's cgroupfs
// driver names a pod's (kubepods/pod<UID>), removed at the end; "" (and a
// log line) where no writable cgroup v2 tree is mounted.
func podCgroup(t *testing.T, pod string) string {
	t.Helper()
	parent := "/sys/fs/cgroup/kubepods"
	made := false
	if err := os.Mkdir(parent, 0o755); err == nil {
		made = true
	} else if !errors.Is(err, os.ErrExist) {
		t.Logf("no cgroup for pod %s (%v): processes outside MPS not checked", pod, err)
		return ""
	}
	dir := filepath.Join(parent, "pod"+pod)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		t.Logf("no cgroup for pod %s (%v): processes outside MPS not checked", pod, err)
		return ""
	}
	t.Cleanup(func() {
		// Its processes have exited by then; a cgroup with none is
		// removed with rmdir.
		_ = os.Remove(dir)
		if made {
			_ = os.Remove(parent)
		}
	})
	if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err != nil {
		t.Logf("%s is not a cgroup v2 directory (%v): processes outside MPS not checked", dir, err)
		return ""
	}
	return dir
}

// waitFile polls for path, failing with msg after 30 s.
func waitFile(t *testing.T, path, msg string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(msg + " within 30 s")
		}
	}
}
