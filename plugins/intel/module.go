package intel

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/plugins/sysfs"
	"github.com/kubegpu/kubegpu/types"
)

// Name is the module's name; its options are given as intel.KEY=VALUE.
const Name = "intel"

// Options of the node side: the host's root directory, under which sysfs
// is read, and the directory under which the host's device nodes are (a
// container's /dev/dri/card0 is DIR/dev/dri/card0 on the host); both "/"
// by default, a recorded tree and device nodes made by a test otherwise.
const (
	OptionRoot    = sysfs.OptionRoot
	OptionDevRoot = sysfs.OptionDevRoot
)

// ErrNotOnNode is wrapped by ContainerEdits' error when the allocation
// names a GPU the node does not have (or no longer has).
var ErrNotOnNode = errors.New("device is not on this node")

// NewModule returns the Intel GPU module.
func NewModule() types.Module { return module{} }

type module struct{}

func (module) Name() string { return Name }

// SchedulerPlugin rates Intel GPUs' links; it takes no options.
func (module) SchedulerPlugin(_ context.Context, cfg types.PluginConfig) (types.SchedulerPlugin, error) {
	if err := cfg.CheckOptions(Name); err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	return NewScheduler(), nil
}

// NodePlugin discovers the node's Intel GPUs under the root option. A node
// without them gives an error wrapping types.ErrNoDevices.
func (module) NodePlugin(ctx context.Context, cfg types.PluginConfig) (types.NodePlugin, error) {
	root, devRoot, err := sysfs.Dirs(cfg, Name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	n := &node{root: root, devRoot: devRoot, name: cfg.NodeName}
	t, err := n.discover()
	if errors.Is(err, errNoDRM) {
		return nil, fmt.Errorf("%s: %w: %w", Name, types.ErrNoDevices, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	for _, s := range t.Skipped {
		klog.FromContext(ctx).Info("Intel GPU not served", "card", s)
	}
	return n, nil
}

// node is the module's node side.
type node struct {
	root, devRoot, name string
	mu                  sync.Mutex
	last                Topology
}

var (
	_ types.NodePlugin         = (*node)(nil)
	_ types.GuardedNodesPlugin = (*node)(nil)
)

func (n *node) discover() (Topology, error) {
	t, err := Discover(os.DirFS(n.root), n.name)
	if err != nil {
		return Topology{}, err
	}
	n.mu.Lock()
	n.last = t
	n.mu.Unlock()
	return t, nil
}

// Discover returns the GPUs sysfs lists now.
func (n *node) Discover(context.Context) (types.Inventory, error) {
	t, err := n.discover()
	if err != nil {
		return types.Inventory{}, fmt.Errorf("%s: %w", Name, err)
	}
	return t.Inventory, nil
}

// ContainerEdits gives the container exactly its GPUs' card and render
// nodes, from a discovery made now: the kernel numbers cards anew when a
// GPU comes or goes, and a GPU is found by its ID and checked by UUID.
func (n *node) ContainerEdits(_ context.Context, alloc types.ContainerAllocation) (types.ContainerEdits, error) {
	var e types.ContainerEdits
	if len(alloc.Devices) == 0 {
		return e, nil
	}
	t, err := n.discover()
	if err != nil {
		return e, fmt.Errorf("%s: %w", Name, err)
	}
	seen := map[string]bool{}
	for _, d := range alloc.Devices {
		i := -1
		for j, g := range t.GPUs {
			if g.ID == d.ID && g.UUID == d.UUID {
				i = j
			}
		}
		if i < 0 {
			return types.ContainerEdits{}, fmt.Errorf("%s: %w: GPU %s (UUID %s)", Name, ErrNotOnNode, d.ID, d.UUID)
		}
		if seen[d.ID] {
			continue
		}
		seen[d.ID] = true
		for _, p := range devicePaths(t.GPUs[i]) {
			e.DeviceNodes = append(e.DeviceNodes, types.DeviceNode{HostPath: filepath.Join(n.devRoot, p), ContainerPath: p, Permissions: "rw"})
		}
	}
	return e, nil
}

// GuardedNodes are the card and render nodes of the GPUs of the last
// discovery: a container reaches an Intel GPU only through those the shim
// gives it.
func (n *node) GuardedNodes() []types.DeviceNode {
	n.mu.Lock()
	t := n.last
	n.mu.Unlock()
	var paths []string
	for _, g := range t.GPUs {
		paths = append(paths, devicePaths(g)...)
	}
	// And every Intel GPU's node sysfs lists now (renumbered since, or
	// not served).
	r := sysfs.Reader{FS: os.DirFS(n.root), MaxFileBytes: maxFileBytes, Budget: maxReadBytes}
	return r.Guarded(n.devRoot, paths, pciVendorIntel)
}

// devicePaths are a GPU's device nodes in a container.
func devicePaths(g GPU) []string {
	return []string{"/dev/dri/card" + strconv.Itoa(g.Card), "/dev/dri/renderD" + strconv.Itoa(g.RenderMinor)}
}

// Close releases nothing: the node side holds no handles.
func (n *node) Close() error { return nil }
