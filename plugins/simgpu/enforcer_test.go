package simgpu

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubegpu/kubegpu/types"
)

// TestEnforcerStandIn: with enforcer-root the GPUs publish the simulated
// enforcer, a container with slices gets its limits file (its grant) bound
// in, the read-back returns what the file says (a container that rewrites
// it shows as a mismatch), whole GPUs get no file, and released pods
// lose theirs.
func TestEnforcerStandIn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the enforcer stand-in mounts a tmpfs per container: needs root")
	}
	ctx := t.Context()
	root := filepath.Join(t.TempDir(), "enforcer")
	np, err := NewModule().NodePlugin(ctx, types.PluginConfig{NodeName: "n", Options: map[string]string{OptionPreset: "t4x4", OptionEnforcerRoot: root}})
	if err != nil {
		t.Fatal(err)
	}
	// Whatever fails, the tmpfs mounts go before the temporary directory.
	t.Cleanup(func() {
		_ = np.(types.PodScopedPlugin).ReleasePods(context.Background(), nil, time.Now().Add(time.Hour))
	})
	inv, err := np.Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range inv.Devices {
		if d.SliceEnforcer != types.EnforcerSimulated {
			t.Errorf("device %s publishes enforcer %q, want %q", d.ID, d.SliceEnforcer, types.EnforcerSimulated)
		}
	}
	g := inv.Devices[1]
	alloc := types.ContainerAllocation{Name: "main", Devices: []types.DeviceShare{{ID: g.ID, UUID: g.UUID, MemoryMiB: 4096, ComputePercent: 25}}}
	pp := np.(types.PodScopedPlugin)
	edits, err := pp.PodContainerEdits(ctx, "pod-a", alloc)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "pod-a", "main", EnforcerFile)
	if len(edits.Mounts) != 1 || edits.Mounts[0].HostPath != filepath.Dir(file) || edits.Mounts[0].ContainerPath != EnforcerContainerDir {
		t.Errorf("mounts %+v, want the container's limits directory at %s", edits.Mounts, EnforcerContainerDir)
	}
	prover := np.(types.EnforcementProver)
	e, err := prover.Enforced(ctx, "pod-a", alloc)
	if err != nil || e.Mismatch(alloc) != nil {
		t.Fatalf("read back %+v, %v; mismatch %v", e, err, e.Mismatch(alloc))
	}
	if err := os.WriteFile(file, []byte(`{"computePercent":100,"memoryMiB":[4096]}`), 0o666); err != nil {
		t.Fatal(err)
	}
	e, err = prover.Enforced(ctx, "pod-a", alloc)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Mismatch(alloc); err == nil || !strings.Contains(err.Error(), "compute 100%, granted 25%") {
		t.Errorf("a rewritten limits file: mismatch %v, want compute 100%% named", err)
	}
	for _, bad := range []string{`{`, strings.Repeat(" ", maxLimitsBytes+1) + "{}", `{"memoryMiB":[]}`} {
		if err := os.WriteFile(file, []byte(bad), 0o666); err != nil {
			t.Fatal(err)
		}
		if e, err := prover.Enforced(ctx, "pod-a", alloc); err == nil {
			t.Errorf("limits file %.20q read back as %+v", bad, e)
		}
	}
	// A FIFO, or a link to one, in its place: refused at once, not waited on.
	for _, plant := range []func() error{
		func() error { return syscall.Mkfifo(file, 0o666) },
		func() error {
			fifo := filepath.Join(t.TempDir(), "fifo")
			if err := syscall.Mkfifo(fifo, 0o666); err != nil {
				return err
			}
			return os.Symlink(fifo, file)
		},
	} {
		_ = os.Remove(file)
		if err := plant(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := prover.Enforced(ctx, "pod-a", alloc); done <- err }()
		select {
		case err := <-done:
			if err == nil {
				t.Error("a FIFO in place of the limits file was read back")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("reading a FIFO in place of the limits file blocks")
		}
	}
	// A restart of the container starts from its grant again.
	if _, err := pp.PodContainerEdits(ctx, "pod-a", alloc); err != nil {
		t.Fatal(err)
	}
	if e, err := prover.Enforced(ctx, "pod-a", alloc); err != nil || e.Mismatch(alloc) != nil {
		t.Errorf("after a restart: %+v, %v; want the grant", e, err)
	}
	whole := types.ContainerAllocation{Name: "w", Devices: []types.DeviceShare{{ID: g.ID, UUID: g.UUID, Exclusive: true, MemoryMiB: g.MemoryMiB, ComputePercent: 100}}}
	if edits, err := pp.PodContainerEdits(ctx, "pod-b", whole); err != nil || len(edits.Mounts) != 0 {
		t.Errorf("whole GPU: edits %+v, %v; want no limits file", edits, err)
	}
	if _, err := pp.PodContainerEdits(ctx, "../x", alloc); err == nil {
		t.Error("a pod UID with a path in it named a directory")
	}
	if err := pp.ReleasePods(ctx, map[string]bool{}, time.Now().Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(file)); !os.IsNotExist(err) {
		t.Errorf("released pod's limits: %v, want removed", err)
	}
	if _, err := NewModule().NodePlugin(ctx, types.PluginConfig{Options: map[string]string{OptionPreset: "t4x4", OptionEnforcerRoot: "relative"}}); err == nil {
		t.Error("a relative enforcer-root was accepted")
	}
}
