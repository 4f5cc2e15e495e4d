package simgpu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/kubegpu/kubegpu/types"
)

// The enforcer stand-in: with OptionEnforcerRoot, each container with
// slices gets a limits file of its own that stands for an MPS daemon's
// state, set from its grant when the container is created and read back
// by Enforced. The file is bound read-write into the container, as an MPS
// daemon's pipe is reachable from it: a container that rewrites it has
// changed its own limits, as one running as root can through MPS's
// control pipe, and the read-back shows it. Nothing limits a simulated
// GPU, so the stand-in proves the host's policy, proof and refusal paths,
// not a limit.
const (
	// EnforcerContainerDir is where a container finds its limits file.
	EnforcerContainerDir = "/run/kubegpu/simgpu"
	// EnforcerFile is the limits file's name.
	EnforcerFile = "limits.json"
	// EnvLimits is the container's path of its limits file.
	EnvLimits = "KUBEGPU_SIMGPU_LIMITS"
	// maxLimitsBytes bounds the limits file the read-back takes.
	maxLimitsBytes = 4096
	// limitsFSBytes is the size of each container's limits directory.
	limitsFSBytes = 64 << 10
)

// safeName is what a pod UID or container name must look like to name a
// directory.
var safeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// enforcer keeps the containers' limits files under root.
type enforcer struct{ root string }

func newEnforcer(root string) (*enforcer, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("simgpu: %s must be an absolute path, got %q", OptionEnforcerRoot, root)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("simgpu: %s: %w", OptionEnforcerRoot, err)
	}
	if err := os.Chmod(root, 0o700); err != nil { // containers reach only their own directories
		return nil, fmt.Errorf("simgpu: %s: %w", OptionEnforcerRoot, err)
	}
	return &enforcer{root: root}, nil
}

func (e *enforcer) dir(podUID, container string) (string, error) {
	if !safeName.MatchString(podUID) || !safeName.MatchString(container) {
		return "", fmt.Errorf("pod UID %q or container name %q cannot name a directory", podUID, container)
	}
	return filepath.Join(e.root, podUID, container), nil
}

// apply writes the container's limits, its grant, into a directory of its
// own: a tmpfs of limitsFSBytes (a container cannot fill the host's disk
// through it), mounted afresh for each container start, as each start gets
// an MPS daemon afresh.
func (e *enforcer) apply(podUID string, alloc types.ContainerAllocation) (types.ContainerEdits, error) {
	dir, err := e.dir(podUID, alloc.Name)
	if err != nil {
		return types.ContainerEdits{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return types.ContainerEdits{}, fmt.Errorf("simgpu enforcer: %w", err)
	}
	_ = syscall.Unmount(dir, syscall.MNT_DETACH) // the last start's
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC,
		fmt.Sprintf("size=%d,mode=0777", limitsFSBytes)); err != nil {
		return types.ContainerEdits{}, fmt.Errorf("simgpu enforcer: mount a tmpfs on %s: %w", dir, err)
	}
	limits := types.Enforcement{Mechanism: types.EnforcerSimulated, MemoryMiB: make([]int64, len(alloc.Devices))}
	for i, s := range alloc.Devices {
		if !s.Exclusive {
			limits.MemoryMiB[i] = s.MemoryMiB
			if s.ComputePercent < types.MaxComputePercent {
				limits.ComputePercent = s.ComputePercent
			}
		}
	}
	b, _ := json.Marshal(limits)
	path := filepath.Join(dir, EnforcerFile)
	if err := os.WriteFile(path, b, 0o666); err != nil {
		return types.ContainerEdits{}, fmt.Errorf("simgpu enforcer: %w", err)
	}
	_ = os.Chmod(path, 0o666) // whatever the umask: any user of the container may change it
	return types.ContainerEdits{
		Env:    []types.EnvVar{{Name: EnvLimits, Value: EnforcerContainerDir + "/" + EnforcerFile}},
		Mounts: []types.Mount{{HostPath: dir, ContainerPath: EnforcerContainerDir}},
	}, nil
}

// enforced reads back the container's limits file.
func (e *enforcer) enforced(podUID string, alloc types.ContainerAllocation) (types.Enforcement, error) {
	dir, err := e.dir(podUID, alloc.Name)
	if err != nil {
		return types.Enforcement{}, err
	}
	// The container may have put anything there: a FIFO or a link to one
	// would block a plain open, and a link could point anywhere.
	f, err := os.OpenFile(filepath.Join(dir, EnforcerFile), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return types.Enforcement{}, fmt.Errorf("simgpu enforcer: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return types.Enforcement{}, fmt.Errorf("simgpu enforcer: %s is not a regular file", EnforcerFile)
	}
	b := make([]byte, maxLimitsBytes+1)
	n, _ := f.Read(b)
	if n > maxLimitsBytes {
		return types.Enforcement{}, fmt.Errorf("simgpu enforcer: limits file over %d bytes", maxLimitsBytes)
	}
	var got types.Enforcement
	if err := json.Unmarshal(b[:n], &got); err != nil {
		return types.Enforcement{}, fmt.Errorf("simgpu enforcer: limits file: %w", err)
	}
	got.Mechanism = types.EnforcerSimulated
	if len(got.MemoryMiB) != len(alloc.Devices) {
		return types.Enforcement{}, fmt.Errorf("simgpu enforcer: limits for %d devices, the container has %d", len(got.MemoryMiB), len(alloc.Devices))
	}
	return got, nil
}

// release removes the limits of pods not in live whose directories
// predate listed.
func (e *enforcer) release(live map[string]bool, listed time.Time) error {
	pods, err := os.ReadDir(e.root)
	if err != nil {
		return fmt.Errorf("simgpu enforcer: %w", err)
	}
	var errs []error
	for _, p := range pods {
		if live[p.Name()] || strings.HasPrefix(p.Name(), ".") {
			continue
		}
		if fi, err := p.Info(); err != nil || !fi.ModTime().Before(listed.Add(-time.Second)) {
			continue
		}
		containers, _ := os.ReadDir(filepath.Join(e.root, p.Name()))
		for _, c := range containers {
			_ = syscall.Unmount(filepath.Join(e.root, p.Name(), c.Name()), syscall.MNT_DETACH)
		}
		if err := os.RemoveAll(filepath.Join(e.root, p.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// PodContainerEdits is ContainerEdits with the container's limits file
// when the stand-in enforcer is on and the container has slices.
func (n *node) PodContainerEdits(ctx context.Context, podUID string, alloc types.ContainerAllocation) (types.ContainerEdits, error) {
	edits, err := n.ContainerEdits(ctx, alloc)
	if err != nil || n.enforcer == nil || !alloc.Shared() {
		return edits, err
	}
	more, err := n.enforcer.apply(podUID, alloc)
	if err != nil {
		return types.ContainerEdits{}, fmt.Errorf("simgpu: container %q: %w", alloc.Name, err)
	}
	edits.Env = append(edits.Env, more.Env...)
	edits.Mounts = append(edits.Mounts, more.Mounts...)
	return edits, nil
}

// ReleasePods removes the limits of pods that are gone.
func (n *node) ReleasePods(_ context.Context, live map[string]bool, listed time.Time) error {
	if n.enforcer == nil {
		return nil
	}
	return n.enforcer.release(live, listed)
}

// Enforced reads back the container's limits from the stand-in.
func (n *node) Enforced(_ context.Context, podUID string, alloc types.ContainerAllocation) (types.Enforcement, error) {
	if n.enforcer == nil {
		return types.Enforcement{}, errors.New("simgpu: no enforcer on this node (set " + Name + "." + OptionEnforcerRoot + ")")
	}
	return n.enforcer.enforced(podUID, alloc)
}

var (
	_ types.PodScopedPlugin   = (*node)(nil)
	_ types.EnforcementProver = (*node)(nil)
)
