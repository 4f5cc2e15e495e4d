package devicescheduler

import (
	"fmt"
	"strings"

	"github.com/kubegpu/kubegpu/types"
)

// MaxContainers is the most containers with device requests one pod may have.
const MaxContainers = types.MaxDeviceContainers

// Container is one container's request, compiled.
type Container struct {
	// Name is the container's name.
	Name string
	// Init is true for an init container.
	Init bool
	// Count is how many devices.
	Count int
	// Exclusive asks for whole devices; otherwise Milli and MemoryMiB say
	// how much of each device the slice needs.
	Exclusive bool
	Milli     int32
	MemoryMiB int64
	// Topology is how strictly the devices must be interconnected.
	Topology types.TopologyPolicy
	// Enforced is true for slices that must go to devices whose node
	// enforces them (Device.SliceEnforcer): under EnforcementRequired.
	Enforced bool

	// resource is the device resource the devices must be served as;
	// empty: any.
	resource                                                 string
	includeModels, excludeModels, includeUUIDs, excludeUUIDs []string
	// includeSet holds includeUUIDs when they are many (a ResourceClaim's
	// selector, evaluated over the cluster's devices).
	includeSet map[string]struct{}
	selector   types.Selector
}

// Request is a pod's request, compiled once and evaluated against many
// nodes. It is immutable and safe to share.
type Request struct {
	Containers []Container
	// Host is the pod's CPU and memory request.
	Host Host
	// Placement overrides the engine's policy for this pod.
	Placement types.PlacementPolicy
	// Enforcement is the policy the pod's slices are placed under (see
	// SetEnforcement); empty is EnforcementBestEffort.
	Enforcement types.EnforcementPolicy
}

// SetEnforcement sets the policy the pod's slices are placed under: with
// EnforcementRequired, each slice goes only to a device with a
// SliceEnforcer, and must name both its memory and its compute share (an
// enforcer holds a slice to what it names: one without memory would have
// the whole GPU's). The policy is the cluster's or the namespace's, never
// the pod's own: call it before the request is shared. An error says
// which container's slice is incomplete; the request is unchanged.
func (r *Request) SetEnforcement(p types.EnforcementPolicy) error {
	if p == types.EnforcementRequired {
		for _, c := range r.Containers {
			if !c.Exclusive && (c.Milli == 0 || c.MemoryMiB == 0) {
				return fmt.Errorf("container %q: under enforcement %s a GPU slice must set both %s and %s (a ResourceClaim's request: the capacities memory and cores), so that the node can hold it to both",
					c.Name, types.EnforcementRequired, "kubegpu.io/gpu-memory", "kubegpu.io/gpu-cores")
			}
		}
	}
	r.Enforcement = p
	for i := range r.Containers {
		c := &r.Containers[i]
		c.Enforced = p == types.EnforcementRequired && !c.Exclusive
	}
	return nil
}

// NewRequest compiles a decoded pod request. Unset topology policies get the
// engine's default.
func (e *Engine) NewRequest(req types.PodRequest, host Host) (*Request, error) {
	r := &Request{Host: host, Placement: req.Placement}
	add := func(c types.ContainerRequest, init bool) error {
		if c.Count < 1 || c.Count > MaxDevices {
			return fmt.Errorf("container %q: count must be 1..%d, got %d", c.Name, MaxDevices, c.Count)
		}
		if c.ComputePercent < 0 || c.ComputePercent > types.MaxComputePercent || c.MemoryMiB < 0 {
			return fmt.Errorf("container %q: share out of range (%d%%, %d MiB)", c.Name, c.ComputePercent, c.MemoryMiB)
		}
		ct := Container{
			Name: c.Name, Init: init, Count: c.Count,
			Exclusive: !c.Shared(),
			Milli:     int32(c.ComputePercent) * 10,
			MemoryMiB: c.MemoryMiB,
			Topology:  c.Topology,
		}
		if ct.Topology == "" {
			ct.Topology = e.defaultTopology
		}
		ct.SetSelector(c.Selector)
		r.Containers = append(r.Containers, ct)
		return nil
	}
	// Regular containers first: they hold their devices for the pod's life.
	for _, c := range req.Containers {
		if err := add(c, false); err != nil {
			return nil, err
		}
	}
	for _, c := range req.InitContainers {
		if err := add(c, true); err != nil {
			return nil, err
		}
	}
	if len(r.Containers) > MaxContainers {
		return nil, fmt.Errorf("%d containers ask for devices, at most %d are supported", len(r.Containers), MaxContainers)
	}
	return r, nil
}

// SetSelector sets the models and UUIDs the container may get.
func (c *Container) SetSelector(s types.Selector) {
	c.selector = s
	c.resource = s.Resource
	c.includeModels = lower(s.IncludeModels)
	c.excludeModels = lower(s.ExcludeModels)
	c.includeUUIDs = lower(s.IncludeUUIDs)
	c.excludeUUIDs = lower(s.ExcludeUUIDs)
	c.includeSet = nil
	if len(c.includeUUIDs) > maxListedUUIDs {
		c.includeSet = make(map[string]struct{}, len(c.includeUUIDs))
		for _, u := range c.includeUUIDs {
			c.includeSet[u] = struct{}{}
		}
	}
}

// maxListedUUIDs is the most included UUIDs admits looks up in a list;
// more go in a set.
const maxListedUUIDs = 16

// Selector returns the container's selector.
func (c *Container) Selector() types.Selector { return c.selector }

// admits reports whether device d of node n passes the container's selector.
func (c *Container) admits(n *Node, d int) bool {
	if n.ServedAs(c.resource)&(1<<d) == 0 {
		return false
	}
	if len(c.includeModels) > 0 && !contains(c.includeModels, n.models[d]) {
		return false
	}
	if contains(c.excludeModels, n.models[d]) {
		return false
	}
	if c.includeSet != nil {
		if _, ok := c.includeSet[n.uuids[d]]; !ok {
			return false
		}
	} else if len(c.includeUUIDs) > 0 && !contains(c.includeUUIDs, n.uuids[d]) {
		return false
	}
	return !contains(c.excludeUUIDs, n.uuids[d])
}

func lower(in []string) []string {
	if len(in) == 0 {
		return nil
	}
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = strings.ToLower(s)
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
