package amd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/plugins/sysfs"
	"github.com/kubegpu/kubegpu/types"
)

// Name is the module's name; its options are given as amd.KEY=VALUE.
const Name = "amd"

// Options of the node side (package sysfs): the host's root directory,
// under which sysfs is read, and the directory under which the host's
// device nodes are; both "/" by default.
const (
	OptionRoot    = sysfs.OptionRoot
	OptionDevRoot = sysfs.OptionDevRoot
)

// NewModule returns the AMD GPU module.
func NewModule() types.Module { return module{} }

type module struct{}

func (module) Name() string { return Name }

// SchedulerPlugin rates AMD GPUs' links; it takes no options.
func (module) SchedulerPlugin(_ context.Context, cfg types.PluginConfig) (types.SchedulerPlugin, error) {
	if err := cfg.CheckOptions(Name); err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	return NewScheduler(), nil
}

// NodePlugin discovers the node's AMD GPUs under the root option. A node
// without the amdgpu driver's topology, or without GPUs the shim may see,
// gives an error wrapping types.ErrNoDevices.
func (module) NodePlugin(ctx context.Context, cfg types.PluginConfig) (types.NodePlugin, error) {
	root, devRoot, err := sysfs.Dirs(cfg, Name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	n := &node{root: root, devRoot: devRoot}
	t, err := n.discover()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	if t.Hidden > 0 {
		klog.FromContext(ctx).Info("Some AMD GPUs are hidden from the shim by its device cgroup: they are not served", "hidden", t.Hidden, "root", root)
	}
	return n, nil
}

// node is the module's node side: the last discovery, from which container
// edits are built once it is checked to be current.
type node struct {
	root, devRoot string
	mu            sync.Mutex
	last          Topology
}

var _ types.NodePlugin = (*node)(nil)

func (n *node) discover() (Topology, error) {
	t, err := Discover(n.root)
	if err != nil {
		return Topology{}, err
	}
	n.mu.Lock()
	n.last = t
	n.mu.Unlock()
	return t, nil
}

// Discover returns the GPUs and links the KFD topology lists now.
func (n *node) Discover(context.Context) (types.Inventory, error) {
	t, err := n.discover()
	if err != nil {
		return types.Inventory{}, fmt.Errorf("%s: %w", Name, err)
	}
	return t.Inventory, nil
}

// ContainerEdits gives the container /dev/kfd and exactly its GPUs' render
// nodes, from a discovery of the topology's current generation: when a GPU
// came or went since the last one, the kernel renumbered render nodes, and
// the topology is read again first.
func (n *node) ContainerEdits(_ context.Context, alloc types.ContainerAllocation) (types.ContainerEdits, error) {
	n.mu.Lock()
	t := n.last
	n.mu.Unlock()
	r := &reader{fsys: os.DirFS(n.root), budget: maxFileBytes}
	g, err := r.generation()
	if err != nil {
		return types.ContainerEdits{}, fmt.Errorf("%s: %w", Name, err)
	}
	if g != t.Generation {
		if t, err = n.discover(); err != nil {
			return types.ContainerEdits{}, fmt.Errorf("%s: %w", Name, err)
		}
	}
	e, err := t.Edits(alloc)
	if err != nil {
		return types.ContainerEdits{}, fmt.Errorf("%s: %w", Name, err)
	}
	for i := range e.DeviceNodes {
		e.DeviceNodes[i].HostPath = filepath.Join(n.devRoot, e.DeviceNodes[i].ContainerPath)
	}
	return e, nil
}

var _ types.GuardedNodesPlugin = (*node)(nil)

// GuardedNodes are /dev/kfd, the render nodes of the GPUs of the last
// discovery, and every DRM node (card and render) sysfs lists now for an
// AMD PCI device (GPUs the shim may not see among them): a container
// reaches AMD GPUs only through those the shim gives it.
func (n *node) GuardedNodes() []types.DeviceNode {
	n.mu.Lock()
	t := n.last
	n.mu.Unlock()
	paths := []string{DeviceKFD}
	for _, g := range t.GPUs {
		paths = append(paths, renderNodePath+strconv.Itoa(g.RenderMinor))
	}
	r := sysfs.Reader{FS: os.DirFS(n.root), MaxFileBytes: maxFileBytes, Budget: maxFileBytes * 64}
	return r.Guarded(n.devRoot, paths, pciVendorAMD)
}

// pciVendorAMD is AMD's PCI vendor ID as uevent prints it.
const pciVendorAMD = "1002"

// Close releases nothing: the node side holds no handles.
func (n *node) Close() error { return nil }
