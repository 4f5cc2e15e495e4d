package types

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// ModuleSymbol is the one symbol a device module's .so exports: a function of
// type ModuleConstructor.
//
//	package main
//
//	import "github.com/kubegpu/kubegpu/types"
//
//	func NewModule() types.Module { return simgpu.NewModule() }
const ModuleSymbol = "NewModule"

// ModuleConstructor is the type of the function a .so exports as ModuleSymbol.
type ModuleConstructor = func() Module

// ErrNotImplemented is returned by a Module that has no plugin for one side.
var ErrNotImplemented = errors.New("not implemented by this module")

// ErrNoDevices is wrapped by a NodePlugin error that means the node has
// nothing for the module to serve: its devices, driver or vendor library are
// absent. Hosts skip such a module, saying why, and carry on with the others;
// any other error means the module is misconfigured or broken.
var ErrNoDevices = errors.New("no devices of this module on this node")

// Module is a device module: a factory for its node side and its scheduler
// side. Both hosts, kubegpu-crishim and kubegpu-scheduler, load every module
// from the plugin directory and ask for the side they need.
type Module interface {
	// Name is the module's short, unique name (e.g. "nvidia", "simgpu"); it
	// keys the module's options and appears in logs and metrics.
	Name() string
	// NodePlugin builds the node side. It may touch hardware (e.g. load
	// the vendor's library); an error means the module cannot serve this
	// node and says why, wrapping ErrNoDevices when the node simply has
	// none of the module's devices (or their driver). Returns
	// ErrNotImplemented if the module has none.
	NodePlugin(ctx context.Context, cfg PluginConfig) (NodePlugin, error)
	// SchedulerPlugin builds the scheduler side. It must not touch
	// hardware. Returns ErrNotImplemented if the module has none.
	SchedulerPlugin(ctx context.Context, cfg PluginConfig) (SchedulerPlugin, error)
}

// PluginConfig is what a host passes to a module's constructors. The logger
// comes in the context (klog.FromContext).
type PluginConfig struct {
	// NodeName is the Kubernetes node the plugin serves (empty on the
	// scheduler side).
	NodeName string
	// Options are the module's own settings, from the host's
	// --plugin-option NAME.KEY=VALUE flags. A module rejects keys it does not
	// know.
	Options map[string]string
}

// CheckOptions refuses the first option key (in sorted order) that known
// does not list, naming the side's options or saying it takes none: a
// misspelt option is an error, never ignored. module is the module's name,
// which prefixes the keys as operators write them (MODULE.KEY).
func (c PluginConfig) CheckOptions(module string, known ...string) error {
	for _, k := range slices.Sorted(maps.Keys(c.Options)) {
		switch {
		case slices.Contains(known, k):
		case len(known) == 0:
			return fmt.Errorf("option %s.%s: this side of the module takes no options", module, k)
		default:
			return fmt.Errorf("unknown option %s.%s (known: %s)", module, k, strings.Join(known, ", "))
		}
	}
	return nil
}

// NodePlugin is the node side of a device module, used by kubegpu-crishim.
// Implementations must be safe for concurrent use.
type NodePlugin interface {
	// Discover returns the node's devices of this module, with their
	// current health, and the links between them. IDs must be stable for
	// the same hardware. It is called at start-up and then periodically, so
	// it should be cheap. An error means discovery failed as a whole; the
	// caller keeps the last good inventory.
	Discover(ctx context.Context) (Inventory, error)
	// ContainerEdits returns the edits that give a container exactly the
	// devices in alloc, which the caller has already verified belong to this
	// node and pod. Called with an allocation that has no devices, it returns
	// the edits that hide every device of the module from the container (e.g.
	// NVIDIA_VISIBLE_DEVICES=void). It must depend only on alloc and the
	// node's configuration, never on the container's own settings.
	ContainerEdits(ctx context.Context, alloc ContainerAllocation) (ContainerEdits, error)
	// Close releases what the plugin holds (library handles, event
	// watchers). The plugin is not used afterwards.
	Close() error
}

// PodScopedPlugin is implemented by a NodePlugin whose edits start
// something for the container on the node (an MPS control daemon of its
// own) that must be stopped once the pod is gone. The host calls
// PodContainerEdits instead of ContainerEdits, and ReleasePods
// periodically with the pods that still have a sandbox.
type PodScopedPlugin interface {
	// PodContainerEdits is ContainerEdits for a container of the pod whose
	// UID is podUID.
	PodContainerEdits(ctx context.Context, podUID string, alloc ContainerAllocation) (ContainerEdits, error)
	// ReleasePods stops what the plugin started for pods whose UIDs are not
	// in live, the pods with a sandbox when listed: what it started after
	// listed (for pods the list may have missed) it keeps.
	ReleasePods(ctx context.Context, live map[string]bool, listed time.Time) error
}

// GuardedNodesPlugin is implemented by a NodePlugin whose devices a
// container reaches through device nodes that kubegpu-crishim knows no
// other way to find (the NVIDIA driver's it knows itself): every one of
// them a container config brings, but for those the module's own edits
// add, the shim removes, and it masks them in privileged containers, so
// that a container gets only the devices allocated to it.
type GuardedNodesPlugin interface {
	// GuardedNodes lists the device nodes of the module's devices on the
	// node now, with the path each has on the host and in a container.
	GuardedNodes() []DeviceNode
}

// SchedulerPlugin is the device-specific part of fit and score, used by the
// allocation engine. Its methods are called in the engine's hot loops: they
// must be pure, fast, safe for concurrent use and must not allocate.
type SchedulerPlugin interface {
	// Vendor is the Device.Vendor whose devices this plugin rates.
	Vendor() string
	// LinkWeight rates the path l between two devices, from 0 (no useful
	// peer-to-peer path) to MaxLinkWeight (the best the vendor has).
	LinkWeight(l Link) int
	// Admit reports why device d cannot serve request r for reasons only
	// the vendor knows (e.g. a MIG slice cannot be shared further), or nil
	// if it can. The engine checks capacity, health, selectors and topology
	// itself. Returned errors should be preallocated sentinels.
	Admit(d Device, r ContainerRequest) error
}

// MaxLinkWeight is the highest weight SchedulerPlugin.LinkWeight returns.
const MaxLinkWeight = 100

// ContainerEdits are the changes a node plugin makes to a container's config
// so that it sees exactly its devices.
type ContainerEdits struct {
	// Env variables to set; they replace any the container sets itself.
	Env []EnvVar `json:"env,omitempty"`
	// DeviceNodes to create in the container.
	DeviceNodes []DeviceNode `json:"deviceNodes,omitempty"`
	// Mounts to add.
	Mounts []Mount `json:"mounts,omitempty"`
	// CDIDevices are fully qualified CDI device names (vendor/class=name)
	// for a CDI-enabled runtime to inject.
	CDIDevices []string `json:"cdiDevices,omitempty"`
	// Annotations to add to the container.
	Annotations map[string]string `json:"annotations,omitempty"`
}

// EnvVar is one environment variable.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// DeviceNode is a device file to expose in the container.
type DeviceNode struct {
	HostPath      string `json:"hostPath"`
	ContainerPath string `json:"containerPath"`
	// Permissions are cgroup device permissions, e.g. "rw" or "rwm".
	Permissions string `json:"permissions,omitempty"`
}

// Mount is a host path to bind into the container.
type Mount struct {
	HostPath      string `json:"hostPath"`
	ContainerPath string `json:"containerPath"`
	ReadOnly      bool   `json:"readOnly,omitempty"`
}
