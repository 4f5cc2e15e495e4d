package devicecache

import (
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// NodeSnapshot is one node's state for tests and debugging.
type NodeSnapshot struct {
	Usable string
	State  devicescheduler.State
	Pods   []string
}

// Snapshot returns every node's state, keyed by node name.
func (c *Cache) Snapshot() map[string]NodeSnapshot {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := map[string]NodeSnapshot{}
	for name, ns := range c.nodes {
		s := NodeSnapshot{Usable: "ok"}
		if err := c.usable(ns); err != nil {
			s.Usable = err.Error()
		}
		if ns.devices != nil && ns.version != ns.devices.Version() {
			s.Usable = fmt.Sprintf("memo out of date: devices changed without devicesChanged (version %d, devices at %d)", ns.version, ns.devices.Version())
		}
		if ns.devices != nil {
			s.State = ns.devices.State()
		}
		for uid := range ns.pods {
			if c.pods[uid].applied {
				s.Pods = append(s.Pods, string(uid))
			}
		}
		slices.Sort(s.Pods)
		out[name] = s
	}
	return out
}

// InventoryState is a node's inventory as kubegpu_scheduler_nodes counts it.
type InventoryState int

// The states, in the order of the metric's label values; StateUnbuilt is a
// node of which only a Lease was seen, not counted.
const (
	StateOK InventoryState = iota
	StateMissing
	StateInvalid
	StateNone
	NumInventoryStates
	StateUnbuilt InventoryState = -1
)

var inventoryStateNames = [NumInventoryStates]string{"ok", "missing", "invalid", "none"}

// String is the state's label value.
func (s InventoryState) String() string {
	if s < 0 || s >= NumInventoryStates {
		return "unbuilt"
	}
	return inventoryStateNames[s]
}

func inventoryState(ns *nodeState) InventoryState {
	switch {
	case !ns.built:
		return StateUnbuilt // only a Lease seen: no Node (yet)
	case ns.devices != nil:
		return StateOK
	case errors.Is(ns.err, ErrNoInventory) && ns.gpus:
		return StateMissing
	case errors.Is(ns.err, ErrNoInventory):
		return StateNone
	}
	return StateInvalid
}

// NodeView is one node as the metrics read it: copied under the read
// lock, so that a scrape does not hold up scheduling.
type NodeView struct {
	Name      string
	Inventory InventoryState
	// Devices is nil without a usable inventory. It is the cache's own:
	// read only Allocatable, MemoryMiB and the model, which never change.
	Devices *devicescheduler.Node
	// State is the devices' state when copied.
	State devicescheduler.State
	// Pods counts each device's pods, when asked for.
	Pods *[devicescheduler.MaxDevices]int
	// Live reports whether the node gets new GPU pods.
	Live bool
}

// Nodes copies every node's view at now; withPods adds the pods per
// device (about a kilobyte per node).
func (c *Cache) Nodes(now time.Time, withPods bool) []NodeView {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]NodeView, 0, len(c.nodes))
	for name, ns := range c.nodes {
		v := NodeView{Name: name, Inventory: inventoryState(ns)}
		if ns.devices != nil {
			v.Devices, v.State, v.Live = ns.devices, ns.devices.State(), c.liveAt(ns, now) == nil
			if withPods {
				pods := ns.devices.DevicePods()
				v.Pods = &pods
			}
		}
		out = append(out, v)
	}
	return out
}

// UnallocatedGPUPods counts the pods that are bound, have not finished
// and ask for GPUs, but hold no allocation the cache counts (or assumes)
// and are not served by DRA: their containers run without GPUs. It takes
// the read lock once.
func (c *Cache) UnallocatedGPUPods(pods []*corev1.Pod) int {
	n := 0
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, p := range pods {
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if _, ok := c.pods[p.UID]; ok || !objects.WantsDevices(p) || objects.ServedByDRA(p) {
			continue
		}
		n++
	}
	return n
}

// ListPods lists the pods the scheduler's informer holds.
func (c *Cache) ListPods() ([]*corev1.Pod, error) { return c.listPods() }
