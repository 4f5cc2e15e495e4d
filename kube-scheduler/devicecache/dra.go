package devicecache

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// kubegpu leaves to Dynamic Resource Allocation what DRA may hand out as
// well, so that no GPU is given twice:
//
//   - a node where another DRA driver's ResourceSlices publish any of the
//     node's kubegpu GPUs (same UUID or PCI bus ID, dra.Overlaps) gets no
//     GPU pods from kubegpu while they do;
//   - a pod that asks for a resource a DeviceClass maps to DRA
//     (spec.extendedResourceName) gets no devices from kubegpu on a node
//     where DRA serves that resource: one that advertises none of it
//     (upstream's rule). There the DynamicResources plugin decides whether
//     the pod fits and allocates its devices; kubegpu passes the node,
//     ranks it after the nodes it serves itself, and neither reserves nor
//     binds (Evaluate's error is a *DRAServes).
//
// The first refusal is unresolvable (preemption cannot help) and names the
// driver.

// ErrDRA is wrapped by every refusal that leaves a node's GPUs to DRA.
var ErrDRA = errors.New("left to DRA")

// DriverConflict is why a node gets no GPU pods: another DRA driver
// publishes its GPUs.
type DriverConflict struct {
	// Driver and Slice name the other driver's ResourceSlice, the first
	// by name that overlaps; Devices are the kubegpu GPUs it publishes.
	Driver, Slice string
	Devices       []string
}

// Error is the same for every node of the driver: Filter's statuses are
// counted by message.
func (e *DriverConflict) Error() string {
	return fmt.Sprintf("DRA driver %s publishes this node's GPUs as well: kubegpu leaves the node to DRA", e.Driver)
}

// Is makes errors.Is(err, ErrDRA) true.
func (e *DriverConflict) Is(target error) bool { return target == ErrDRA }

// Detail names the slice and the GPUs, for people.
func (e *DriverConflict) Detail() string {
	return fmt.Sprintf("GPUs %s of this node are published by DRA driver %s as well (ResourceSlice %s): kubegpu allocates no GPU of the node while another driver may hand them out",
		strings.Join(e.Devices, ", "), e.Driver, e.Slice)
}

// DRAServes says that DRA, not kubegpu, serves a pod's request on a node:
// a DeviceClass maps a resource the pod asks for, and the node advertises
// none of it. It is no refusal: Filter passes the node for the
// DynamicResources plugin to judge, and Reserve and Bind leave the pod to
// it.
type DRAServes struct {
	Class    string
	Resource corev1.ResourceName
}

func (e *DRAServes) Error() string {
	return fmt.Sprintf("DRA serves %s on this node (DeviceClass %s maps it, and the node advertises none): kubegpu allocates nothing here", e.Resource, e.Class)
}

// ServedByDRA returns a *DRAServes if DRA serves the request of in (see
// ForPod) on node, or nil.
func ServedByDRA(node *corev1.Node, in *Input) *DRAServes {
	for _, m := range in.mapped {
		if dra.ServedByDRA(node, m.Resource) {
			return &DRAServes{Class: m.Class, Resource: m.Resource}
		}
	}
	return nil
}

// foreignSlice is what the cache keeps of another driver's ResourceSlice:
// the identifiers of its devices, and the node's kubegpu devices they
// match.
type foreignSlice struct {
	node, driver string
	keys         [][]string
	overlap      []string
}

// draState is what the cache knows of DRA: other drivers' node-local
// ResourceSlices, and the DeviceClasses that map a resource kubegpu reads.
// A slice event costs the slice's devices and the node's overlapping
// slices, never all of the node's slices: a node may publish many.
type draState struct {
	slices map[string]*foreignSlice
	// byNode maps a node to the names of its foreign slices, overlapping
	// to those that publish one of its kubegpu devices.
	byNode, overlapping map[string]map[string]struct{}
	classes             map[string]dra.Mapping
	// mappings is classes sorted (dra.Mappings), read by Input.
	mappings []dra.Mapping
}

// UpdateResourceSlice takes in a ResourceSlice. Slices of kubegpu's own
// driver, and slices of no one node, are not kept.
func (c *Cache) UpdateResourceSlice(logger klog.Logger, s *resourceapi.ResourceSlice) {
	if s.Spec.Driver == dra.DriverName || s.Spec.NodeName == nil || *s.Spec.NodeName == "" {
		c.DeleteResourceSlice(logger, s.Name)
		return
	}
	fs := &foreignSlice{node: *s.Spec.NodeName, driver: s.Spec.Driver}
	for i := range s.Spec.Devices {
		if k := dra.DeviceKeys(&s.Spec.Devices[i]); len(k) > 0 {
			fs.keys = append(fs.keys, k)
		}
	}
	c.mu.Lock()
	if c.dra.slices == nil {
		c.dra.slices, c.dra.byNode, c.dra.overlapping = map[string]*foreignSlice{}, map[string]map[string]struct{}{}, map[string]map[string]struct{}{}
	}
	old := c.dra.slices[s.Name]
	if old != nil {
		c.unindexSliceLocked(s.Name, old.node)
	}
	c.dra.slices[s.Name] = fs
	addTo(c.dra.byNode, fs.node, s.Name)
	c.matchSliceLocked(s.Name, fs)
	freed := c.refreshDRALocked(logger, fs.node)
	if old != nil && old.node != fs.node {
		freed = c.refreshDRALocked(logger, old.node) || freed
	}
	c.mu.Unlock()
	if freed {
		c.wake(c.draWaiters)
	}
}

// DeleteResourceSlice forgets a ResourceSlice.
func (c *Cache) DeleteResourceSlice(logger klog.Logger, name string) {
	c.mu.Lock()
	old, ok := c.dra.slices[name]
	freed := false
	if ok {
		delete(c.dra.slices, name)
		c.unindexSliceLocked(name, old.node)
		freed = c.refreshDRALocked(logger, old.node)
	}
	c.mu.Unlock()
	if freed {
		c.wake(c.draWaiters)
	}
}

func (c *Cache) unindexSliceLocked(name, node string) {
	removeFrom(c.dra.byNode, node, name)
	removeFrom(c.dra.overlapping, node, name)
}

// matchSliceLocked matches fs against its node's kubegpu devices and
// indexes it among the node's overlapping slices if it publishes one.
// Must hold c.mu.
func (c *Cache) matchSliceLocked(name string, fs *foreignSlice) {
	var keys map[string]string
	if ns, ok := c.nodes[fs.node]; ok {
		keys = ns.keys
	}
	if fs.overlap, _ = dra.MatchKeys(fs.keys, keys); len(fs.overlap) > 0 {
		addTo(c.dra.overlapping, fs.node, name)
	} else {
		removeFrom(c.dra.overlapping, fs.node, name)
	}
}

// rematchNodeLocked matches every foreign slice of the node again, after
// its devices changed, and reports whether a conflict ended. Must hold
// c.mu.
func (c *Cache) rematchNodeLocked(logger klog.Logger, node string) bool {
	for name := range c.dra.byNode[node] {
		c.matchSliceLocked(name, c.dra.slices[name])
	}
	return c.refreshDRALocked(logger, node)
}

func addTo(m map[string]map[string]struct{}, node, name string) {
	if m[node] == nil {
		m[node] = map[string]struct{}{}
	}
	m[node][name] = struct{}{}
}

func removeFrom(m map[string]map[string]struct{}, node, name string) {
	delete(m[node], name)
	if len(m[node]) == 0 {
		delete(m, node)
	}
}

// refreshDRALocked sets the named node's conflict from its overlapping
// slices, the first by name, and reports whether a conflict ended. Must
// hold c.mu.
func (c *Cache) refreshDRALocked(logger klog.Logger, node string) bool {
	ns, ok := c.nodes[node]
	if !ok {
		return false
	}
	was := ns.draConflict
	ns.draConflict = nil
	first := ""
	for name := range c.dra.overlapping[node] {
		if first == "" || name < first {
			first = name
		}
	}
	if fs := c.dra.slices[first]; first != "" && fs != nil {
		ns.draConflict = &DriverConflict{Driver: fs.driver, Slice: first, Devices: fs.overlap}
	}
	switch {
	case ns.draConflict != nil && (was == nil || was.Driver != ns.draConflict.Driver || was.Slice != ns.draConflict.Slice):
		logger.Info("Another DRA driver publishes the node's GPUs: the node gets no GPU pods from kubegpu while it does",
			"node", klog.KRef("", node), "driver", ns.draConflict.Driver, "resourceSlice", ns.draConflict.Slice, "gpus", ns.draConflict.Devices)
	case ns.draConflict == nil && was != nil:
		logger.Info("No other DRA driver publishes the node's GPUs any longer", "node", klog.KRef("", node))
		return true
	}
	return false
}

// ServedByDRAOn is ServedByDRA for the named node as the cache last saw
// it, for callers without the Node object (Reserve without a snapshot).
func (c *Cache) ServedByDRAOn(name string, in *Input) *DRAServes {
	if len(in.mapped) == 0 {
		return nil
	}
	c.mu.RLock()
	ns, ok := c.nodes[name]
	var node *corev1.Node
	if ok {
		node = ns.object
	}
	c.mu.RUnlock()
	if node == nil {
		return nil
	}
	return ServedByDRA(node, in)
}

// UpdateDeviceClass takes in a DeviceClass.
func (c *Cache) UpdateDeviceClass(class *resourceapi.DeviceClass) {
	m := dra.Mappings([]*resourceapi.DeviceClass{class}, objects.RequestResources)
	c.mu.Lock()
	_, had := c.dra.classes[class.Name]
	if len(m) == 0 {
		delete(c.dra.classes, class.Name)
	} else {
		if c.dra.classes == nil {
			c.dra.classes = map[string]dra.Mapping{}
		}
		c.dra.classes[class.Name] = m[0]
	}
	c.sortMappingsLocked()
	c.mu.Unlock()
	if had {
		c.wake(c.draWaiters) // its mapping may have changed or gone
	}
}

// DeleteDeviceClass forgets a DeviceClass.
func (c *Cache) DeleteDeviceClass(name string) {
	c.mu.Lock()
	_, had := c.dra.classes[name]
	delete(c.dra.classes, name)
	c.sortMappingsLocked()
	c.mu.Unlock()
	if had {
		c.wake(c.draWaiters)
	}
}

func (c *Cache) sortMappingsLocked() {
	ms := make([]dra.Mapping, 0, len(c.dra.classes))
	for _, m := range c.dra.classes {
		ms = append(ms, m)
	}
	slices.SortFunc(ms, func(a, b dra.Mapping) int {
		if x := strings.Compare(string(a.Resource), string(b.Resource)); x != 0 {
			return x
		}
		return strings.Compare(a.Class, b.Class)
	})
	c.dra.mappings = ms
}

// ForPod completes in for pod: the resources it asks for that a
// DeviceClass maps to DRA. PreFilter and `kubegpu explain` call it after
// Input or InputOnce.
func (c *Cache) ForPod(in *Input, pod *corev1.Pod) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	in.mapped = nil
	for _, m := range c.dra.mappings {
		if objects.AsksFor(pod, m.Resource) && (len(in.mapped) == 0 || in.mapped[len(in.mapped)-1].Resource != m.Resource) {
			in.mapped = append(in.mapped, m) // the first class by name, per resource
		}
	}
}

// WaitForDRA remembers a pod that a node refused for DRA's sake: it is
// activated when a conflict ends.
func (c *Cache) WaitForDRA(pod *corev1.Pod) { c.draWaiters.add(pod) }
