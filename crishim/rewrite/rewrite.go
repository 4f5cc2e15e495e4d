package rewrite

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// ErrForbidden is wrapped when a pod's allocation is not valid here: not
// signed with the cluster's key, or for another pod or node.
var ErrForbidden = errors.New("allocation refused")

// ErrInvalid is wrapped when an allocation cannot be applied: malformed, or
// naming devices this node does not have.
var ErrInvalid = errors.New("allocation cannot be applied")

// ErrOtherPod is wrapped, with ErrForbidden, when a pod carries another
// pod's allocation (an annotation copied from it).
var ErrOtherPod = errors.New("another pod's allocation")

// ErrOtherNode is wrapped, with ErrForbidden, when a pod's allocation is
// for another node.
var ErrOtherNode = errors.New("another node's allocation")

// ErrUnknownDevice is wrapped, with ErrInvalid, when an allocation names a
// device that no module serves on this node while every module serves.
var ErrUnknownDevice = errors.New("device not on this node")

// ModuleError is a device module's failure to make a container's edits,
// wrapped with ErrInvalid.
type ModuleError struct {
	// Module is the module's name.
	Module string
	// Err is what the module returned.
	Err error
}

func (e *ModuleError) Error() string { return "device module " + e.Module + ": " + e.Err.Error() }

// Unwrap returns the module's error.
func (e *ModuleError) Unwrap() error { return e.Err }

// ErrModulesFailed is wrapped, with ErrInvalid, when an allocation names a
// device that no module serves while some device module did not load or
// start on this node: the device is likely that module's.
var ErrModulesFailed = errors.New("device modules failed on this node")

// Module is a node's device module as the rewrite needs it.
type Module struct {
	// Name is the module's name, for errors.
	Name string
	// Plugin makes the container edits.
	Plugin interface {
		ContainerEdits(ctx context.Context, alloc types.ContainerAllocation) (types.ContainerEdits, error)
	}
	// Devices are the devices the module serves on this node, by ID.
	Devices map[string]types.Device
}

// Rewriter holds what deciding a container's devices needs.
type Rewriter struct {
	// Node is this node's name.
	Node string
	// Keys verify allocations: the scheduler's public keys.
	Keys *kubeinterface.KeySet
	// Modules returns the node's device modules and their current devices.
	Modules func() []Module
	// Failed names the device modules that did not load or start (e.g.
	// nvidia.so), for the refusal of a container whose devices no module
	// serves.
	Failed []string
}

// Guarded lists the device nodes the node's modules guard
// (types.GuardedNodesPlugin), for Strip and Masks.
func (r *Rewriter) Guarded() []types.DeviceNode {
	if r.Modules == nil {
		return nil
	}
	var out []types.DeviceNode
	for _, m := range r.Modules() {
		if g, ok := m.Plugin.(types.GuardedNodesPlugin); ok {
			out = append(out, g.GuardedNodes()...)
		}
	}
	return out
}

// ContainerAllocation returns the devices allocated to container name of
// the pod whose sandbox config is sb: an empty allocation if the pod has
// none or does not name the container, an error wrapping ErrForbidden
// (with kubeinterface.ErrBadSignature, ErrOtherPod or ErrOtherNode) or
// ErrInvalid if its allocation may not be used here.
func (r *Rewriter) ContainerAllocation(sb *runtimeapi.PodSandboxConfig, name string) (types.ContainerAllocation, error) {
	a, err := r.PodAllocation(sb)
	if err != nil {
		return types.ContainerAllocation{Name: name}, err
	}
	if c, ok := a.Container(name); ok {
		return c, nil
	}
	return types.ContainerAllocation{Name: name}, nil
}

// PodAllocation returns the verified allocation of the pod whose sandbox
// config is sb: empty if it has none, an error as ContainerAllocation's if
// it may not be used here.
func (r *Rewriter) PodAllocation(sb *runtimeapi.PodSandboxConfig) (types.PodAllocation, error) {
	value, ok := sb.GetAnnotations()[kubeinterface.AnnotationAllocation]
	if !ok {
		return types.PodAllocation{}, nil
	}
	md := sb.GetMetadata()
	pod := fmt.Sprintf("%s/%s", md.GetNamespace(), md.GetName())
	a, err := kubeinterface.DecodeAllocation(value)
	if err != nil {
		return types.PodAllocation{}, fmt.Errorf("%w: pod %s: %w", ErrInvalid, pod, err)
	}
	if err := r.Keys.Verify(a); err != nil {
		return types.PodAllocation{}, fmt.Errorf("%w: pod %s: %w", ErrForbidden, pod, err)
	}
	if a.Pod.Namespace != md.GetNamespace() || a.Pod.Name != md.GetName() || string(a.Pod.UID) != md.GetUid() {
		return types.PodAllocation{}, fmt.Errorf("%w: %w: pod %s (uid %s) carries the allocation of pod %s/%s (uid %s)",
			ErrForbidden, ErrOtherPod, pod, md.GetUid(), a.Pod.Namespace, a.Pod.Name, a.Pod.UID)
	}
	if a.Node != r.Node {
		return types.PodAllocation{}, fmt.Errorf("%w: %w: pod %s: the allocation is for node %q, this is node %q", ErrForbidden, ErrOtherNode, pod, a.Node, r.Node)
	}
	return a.PodAllocation, nil
}

// Baseline are the edits every container starts from, whatever modules are
// loaded: no NVIDIA GPU unless a module gives it one, and no device
// selected through the NVIDIA runtime's other variables (SelectionEnv). A
// node whose NVIDIA module is not running (driver not loaded yet, NVML
// broken) so still hides every GPU from images that ask for "all".
var Baseline = func() types.ContainerEdits {
	e := types.ContainerEdits{Env: []types.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}}}
	for _, name := range SelectionEnv {
		e.Env = append(e.Env, types.EnvVar{Name: name})
	}
	return e
}()

// Device returns the device with id from the modules' devices, or false.
func Device(modules []Module, id string) (types.Device, bool) {
	for _, m := range modules {
		if d, ok := m.Devices[id]; ok {
			return d, true
		}
	}
	return types.Device{}, false
}

// Edits asks every module for its part of alloc, for a container of the pod
// whose UID is podUID: the devices it serves, or none, so that it hides its
// devices; on top of Baseline. Its errors wrap ErrInvalid, with
// ErrModulesFailed or ErrUnknownDevice for a device no module serves, or a
// *ModuleError for a module that failed.
func (r *Rewriter) Edits(ctx context.Context, podUID string, alloc types.ContainerAllocation) (types.ContainerEdits, error) {
	modules, parts, err := r.ByModule(alloc)
	if err != nil {
		return types.ContainerEdits{}, err
	}
	all := merge(types.ContainerEdits{}, Baseline)
	for i, m := range modules {
		var e types.ContainerEdits
		var err error
		if ps, ok := m.Plugin.(types.PodScopedPlugin); ok && podUID != "" {
			e, err = ps.PodContainerEdits(ctx, podUID, parts[i])
		} else {
			e, err = m.Plugin.ContainerEdits(ctx, parts[i])
		}
		if err != nil {
			return types.ContainerEdits{}, fmt.Errorf("%w: %w", ErrInvalid, &ModuleError{Module: m.Name, Err: err})
		}
		all = merge(all, e)
	}
	return all, nil
}

// ByModule splits alloc among the node's modules: parts[i] is the part of
// the devices modules[i] serves (with the container's name, and no devices
// if none). A device no module serves is an error wrapping ErrInvalid.
func (r *Rewriter) ByModule(alloc types.ContainerAllocation) (modules []Module, parts []types.ContainerAllocation, err error) {
	modules = r.Modules()
	parts = make([]types.ContainerAllocation, len(modules))
	for i := range parts {
		parts[i].Name = alloc.Name
	}
	for _, d := range alloc.Devices {
		i := slices.IndexFunc(modules, func(m Module) bool { _, ok := m.Devices[d.ID]; return ok })
		if i < 0 && len(r.Failed) > 0 {
			return nil, nil, fmt.Errorf("%w: container %q: device %s (%s) is not served: %w: %s (the Node's condition %s says why)",
				ErrInvalid, alloc.Name, d.ID, d.UUID, ErrModulesFailed, strings.Join(r.Failed, ", "), kubeinterface.ConditionDevicesReady)
		}
		if i < 0 {
			return nil, nil, fmt.Errorf("%w: container %q: %w: %s (%s)", ErrInvalid, alloc.Name, ErrUnknownDevice, d.ID, d.UUID)
		}
		parts[i].Devices = append(parts[i].Devices, d)
	}
	return modules, parts, nil
}

func merge(a, b types.ContainerEdits) types.ContainerEdits {
	a.Env = append(a.Env, b.Env...)
	a.DeviceNodes = append(a.DeviceNodes, b.DeviceNodes...)
	a.Mounts = append(a.Mounts, b.Mounts...)
	a.CDIDevices = append(a.CDIDevices, b.CDIDevices...)
	if len(b.Annotations) > 0 {
		if a.Annotations == nil {
			a.Annotations = map[string]string{}
		}
		maps.Copy(a.Annotations, b.Annotations)
	}
	return a
}

// Apply rewrites cfg with the edits: env variables replace the container's
// own of the same name, and device nodes, mounts, CDI devices and
// annotations are added. It changes cfg in place.
func Apply(cfg *runtimeapi.ContainerConfig, e types.ContainerEdits) {
	if len(e.Env) > 0 {
		set := make(map[string]bool, len(e.Env))
		for _, v := range e.Env {
			set[v.Name] = true
		}
		cfg.Envs = slices.DeleteFunc(cfg.Envs, func(kv *runtimeapi.KeyValue) bool { return set[kv.GetKey()] })
		// A later edit of the same variable (a module's) overrides an
		// earlier one (the baseline's).
		last := make(map[string]int, len(e.Env))
		for i, v := range e.Env {
			last[v.Name] = i
		}
		for i, v := range e.Env {
			if last[v.Name] == i {
				cfg.Envs = append(cfg.Envs, &runtimeapi.KeyValue{Key: v.Name, Value: []byte(v.Value)})
			}
		}
	}
	for _, d := range e.DeviceNodes {
		perm := d.Permissions
		if perm == "" {
			perm = "rw"
		}
		cfg.Devices = append(cfg.Devices, &runtimeapi.Device{ContainerPath: d.ContainerPath, HostPath: d.HostPath, Permissions: perm})
	}
	for _, m := range e.Mounts {
		cfg.Mounts = append(cfg.Mounts, &runtimeapi.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, Readonly: m.ReadOnly})
	}
	for _, name := range e.CDIDevices {
		cfg.CDIDevices = append(cfg.CDIDevices, &runtimeapi.CDIDevice{Name: name})
	}
	if len(e.Annotations) > 0 {
		if cfg.Annotations == nil {
			cfg.Annotations = map[string]string{}
		}
		maps.Copy(cfg.Annotations, e.Annotations)
	}
}
