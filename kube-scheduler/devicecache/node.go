package devicecache

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// ErrNoInventory is why a node that publishes no devices gets no GPU pods.
var ErrNoInventory = errors.New("node publishes no kubegpu device inventory (is kubegpu-crishim running there?)")

// nodeState is one node's devices and liveness.
//
// The fields Filter and Score read for every node (devices, live, memo)
// come first, so that they share the struct's first cache lines: at
// 5,000 nodes each scheduling cycle reads a different tenth of the nodes,
// and each cache line a call touches is a miss.
type nodeState struct {
	// devices is nil when the node has no valid inventory; err says why.
	devices *devicescheduler.Node
	// version is devices.Version() as of the last change the cache made
	// to the devices (see devicesChanged), so that a Filter call does not
	// read the devices themselves, a cache miss of its own, to learn that
	// its memo is current.
	version uint64
	// live is what the scheduler has seen of the node's liveness.
	live liveness
	// memo holds Filter results for the devices' current version.
	memo filterMemo

	name string
	// inventory is the raw annotation value the devices were built from,
	// hasInventory whether the node publishes one (usable or not); built
	// is false until the node object was seen.
	inventory    string
	hasInventory bool
	built        bool
	// gpus is true when the node's capacity advertises GPUs
	// (kubegpu.io/gpus or a device resource): a node that should publish an
	// inventory.
	gpus bool
	// idle is the node's devices with no pod: whether a pod could fit at
	// all, were pods evicted.
	idle *devicescheduler.Node
	err  error
	// refuses is why the node's shim would refuse the scheduler's
	// allocations (keyRefusal), or nil.
	refuses error
	// keys identify the node's devices to other DRA drivers' slices
	// (dra.InventoryKeys); draConflict is the first such slice that
	// publishes one of them, or nil (see dra.go).
	keys        map[string]string
	draConflict *DriverConflict
	// object is the Node object last seen, its key in byObject.
	object *corev1.Node
	pods   map[ktypes.UID]struct{}
	// taintKey is the key of the taint set the node is counted under in
	// Cache.taints, if taintCounted.
	taintKey     string
	taintCounted bool
}

func (c *Cache) node(name string) *nodeState {
	ns, ok := c.nodes[name]
	if !ok {
		ns = &nodeState{name: name, err: ErrNoInventory, pods: map[ktypes.UID]struct{}{}}
		c.nodes[name] = ns
	}
	return ns
}

// UpdateNode takes in a node's inventory annotation and Ready condition.
// The node's devices are rebuilt only when the annotation changed, and the
// pods on it are counted again.
func (c *Cache) UpdateNode(logger klog.Logger, node *corev1.Node) {
	value, has := node.Annotations[kubeinterface.AnnotationInventory]
	taints := hardTaints(node)
	c.mu.Lock()
	ns := c.node(node.Name)
	delete(c.byObject, ns.object)
	ns.object, c.byObject[node] = node, ns
	becameReady := setReady(ns, node)
	ns.gpus = advertisesGPUs(node)
	rebuilt := !ns.built || has != ns.hasInventory || value != ns.inventory
	draFreed := false
	if rebuilt {
		draFreed = c.rebuildNode(logger, ns, node, value, has)
	}
	c.taints.set(ns, taints)
	c.mu.Unlock()
	if becameReady {
		c.activateWaiting()
	}
	if rebuilt && has {
		c.wake(c.deviceWaiters)
	}
	if draFreed {
		c.wake(c.draWaiters)
	}
}

// rebuildNode builds the node's devices from its inventory annotation,
// matches them against other DRA drivers' slices and counts its pods
// again; must hold c.mu. It reports whether a conflict with DRA ended.
func (c *Cache) rebuildNode(logger klog.Logger, ns *nodeState, node *corev1.Node, value string, has bool) (draFreed bool) {
	ns.built, ns.hasInventory, ns.inventory, ns.devices, ns.idle, ns.err, ns.refuses, ns.keys = true, has, value, nil, nil, ErrNoInventory, nil, nil
	// A rebuilt Node starts its version again: forget its Filter results.
	ns.memo.clear()
	if has {
		inv, err := objects.NodeInventory(node)
		if err == nil {
			if ns.refuses = keyRefusal(inv, c.signingKey); ns.refuses != nil {
				logger.Error(ns.refuses, "Node gets no GPU pods until its shim accepts the scheduler's key", "node", klog.KObj(node), "nodeAccepts", inv.KeyIDs)
			}
			ns.devices, err = c.engine.NewNode(node.Name, inv, devicescheduler.Host{})
			ns.keys = dra.InventoryKeys(inv)
		}
		if err == nil {
			ns.idle = ns.devices.Clone()
			ns.devicesChanged()
		}
		if err != nil {
			ns.err = fmt.Errorf("node's device inventory is unusable: %w", err)
			logger.Error(err, "Node's kubegpu inventory is unusable; the node gets no GPU pods until it is fixed", "node", klog.KObj(node))
		}
	}
	freed := c.rematchNodeLocked(logger, ns.name)
	for uid := range ns.pods {
		c.pods[uid].applied = false
		c.apply(logger, uid, c.pods[uid])
	}
	logger.V(4).Info("Node devices updated", "node", klog.KObj(node), "devices", deviceCount(ns), "pods", len(ns.pods))
	return freed
}

// devicesChanged records the devices' version after the cache changed
// them; must hold c.mu for writing. Every change the cache makes to a
// node's devices must be followed by it, or Filter would take the node's
// memo for current (Snapshot reports a node where it was not).
func (ns *nodeState) devicesChanged() {
	if ns.devices != nil {
		ns.version = ns.devices.Version()
	}
}

// advertisesGPUs reports whether node's capacity has GPUs: kubegpu.io/gpus,
// which kubegpu-crishim's advertiser publishes, or a device resource
// (nvidia.com/gpu, amd.com/gpu), which any device plugin does.
func advertisesGPUs(node *corev1.Node) bool {
	if q, ok := node.Status.Capacity[kubeinterface.ResourceGPUs]; ok && q.Sign() > 0 {
		return true
	}
	for _, r := range types.DeviceResources() {
		if q, ok := node.Status.Capacity[corev1.ResourceName(r)]; ok && q.Sign() > 0 {
			return true
		}
	}
	return false
}

func deviceCount(ns *nodeState) int {
	if ns.devices == nil {
		return 0
	}
	return ns.devices.NumDevices()
}

// DeleteNode forgets a node's devices; its pods stay recorded and are
// counted again if the node comes back (e.g. kubelet re-registers it).
func (c *Cache) DeleteNode(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ns, ok := c.nodes[name]
	if !ok {
		return
	}
	for uid := range ns.pods {
		c.pods[uid].applied = false
	}
	ns.built, ns.hasInventory, ns.inventory, ns.devices, ns.err, ns.gpus, ns.keys, ns.draConflict = false, false, "", nil, ErrNoInventory, false, nil, nil
	ns.memo.clear()
	c.rematchNodeLocked(klog.Background(), name) // its slices overlap nothing now
	c.taints.unset(ns)
	delete(c.byObject, ns.object)
	ns.object = nil
	c.dropIfGoneLocked(name)
}

// dropIfGoneLocked forgets the named node once nothing refers to it: its
// Node and Lease deleted, no pod counted there. A cluster whose nodes come
// and go so keeps no state for the gone ones. Must hold c.mu.
func (c *Cache) dropIfGoneLocked(name string) {
	if ns, ok := c.nodes[name]; ok && ns.object == nil && !ns.live.leased && len(ns.pods) == 0 {
		delete(c.nodes, name)
	}
}

// lookup is node's state: by the object itself, which the scheduler's
// NodeInfo shares with the informer's event that this cache took in, else
// (the cache has not seen that object yet, or node is a copy) by its name.
// Must hold c.mu for reading.
func (c *Cache) lookup(node *corev1.Node) (*nodeState, bool) {
	if ns, ok := c.byObject[node]; ok {
		return ns, true
	}
	ns, ok := c.nodes[node.Name]
	return ns, ok
}

// HasDevices reports whether node name publishes devices.
func (c *Cache) HasDevices(name string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	ns, ok := c.nodes[name]
	return ok && (ns.devices != nil || ns.hasInventory)
}
