package plugin

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/mix"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// errNoInventory is why a node that publishes no devices gets no GPU pods.
var errNoInventory = errors.New("node publishes no kubegpu device inventory (is kubegpu-crishim running there?)")

// errNeverFits is joined to the reason a pod does not fit on a node when it
// would not fit there even with every pod gone: preemption cannot help.
var errNeverFits = errors.New("does not fit even on the idle node")

// deviceCache is the scheduler's view of every node's devices and of the
// devices that pods hold, built from informer events only: node inventories
// (annotation), liveness (the nodes' Leases and Ready conditions) and pods'
// verified allocations (the scheduler's record first). A
// restart rebuilds the same state from the API.
//
// Pods are counted from the moment Reserve assumes them; once the pod is
// bound with a valid allocation it is confirmed, and it is released when it
// is deleted or finishes (the scheduler's pod informer drops Succeeded and
// Failed pods). An allocation that is not signed by this scheduler's key, or
// is bound to another pod or node, holds nothing: kubegpu-crishim refuses to
// start such containers with devices.
//
// All methods are safe for concurrent use: Evaluate-style reads take the
// read lock, changes the write lock.
type deviceCache struct {
	engine *devicescheduler.Engine
	keys   *kubeinterface.KeySet
	// signingKey is the ID ("ALGORITHM:KEYID") of the key the scheduler
	// signs with: nodes whose shims say they refuse it get no GPU pods.
	// Empty: not checked.
	signingKey string
	staleness  time.Duration
	now        func() time.Time
	// started is when the cache was made, before its informers started,
	// and the origin of the clock the nodes' Lease observations are kept
	// on (see since): it must not change afterwards. warmed is set once
	// the cache has seen the nodes' Leases renewed since.
	started time.Time
	warmed  atomic.Bool
	metrics *cacheMetrics

	mu    sync.RWMutex
	nodes map[string]*nodeState
	// byObject holds the same states by the Node object the informer
	// last handed the cache for them, which the scheduler's NodeInfo
	// shares: Filter and Score find a node by a pointer, without hashing
	// and comparing its name (see lookup).
	byObject map[*corev1.Node]*nodeState
	pods     map[ktypes.UID]*podState

	// recorder writes the scheduler's records of allocations; nil in
	// tests that do not need it.
	recorder *recorder

	// activate moves pods back to the scheduling queue.
	activate func(pods map[string]*corev1.Pod)
	// liveWaiters are the pods refused by some node for not being live;
	// they are activated when a node is live again (the scheduler learns
	// of the Leases only through this cache). deviceWaiters are the pods
	// refused for want of devices; they are activated once the cache has
	// freed devices or rebuilt an inventory (see waitSet).
	liveWaiters, deviceWaiters *waitSet

	// learnMu guards learnState and gone: the pods forgotten while the mix
	// is learned from the pods listed at start (see learnPods).
	learnMu    sync.Mutex
	learnState learnState
	gone       map[ktypes.UID]struct{}
	// pending are the GPU pods tried and not placed, for the metrics.
	pending *pendingPods

	// listPods lists the pods the scheduler's informer holds.
	listPods func() ([]*corev1.Pod, error)

	shapeMu sync.Mutex
	shapes  map[shapeKey]uint32
	// shapeEpoch counts the times the shape table was full and started
	// over; memo results of an older epoch are not reused.
	shapeEpoch uint64
}

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
	// inventory is the raw annotation value the devices were built from;
	// built is false until the node object was seen.
	inventory    string
	hasInventory bool
	built        bool
	// gpus is true when the node's capacity advertises GPUs
	// (kubegpu.io/gpus or nvidia.com/gpu): a node that should publish an
	// inventory.
	gpus bool
	// idle is the node's devices with no pod: whether a pod could fit at
	// all, were pods evicted.
	idle *devicescheduler.Node
	err  error
	// refuses is why the node's shim would refuse the scheduler's
	// allocations (keyRefusal), or nil.
	refuses error
	// object is the Node object last seen, its key in byObject.
	object *corev1.Node
	pods   map[ktypes.UID]struct{}
}

// filterMemo remembers, per request shape, whether pods fit on a node and
// its score, for as long as the node's state, its host resources and the
// engine's workload do not change. Between two scheduling cycles only the node that got the last
// pod changes, so pods of the same shapes (a Job's, a Deployment's) are
// evaluated once per node change rather than once per node per cycle.
type filterMemo struct {
	mu      sync.Mutex
	version uint64
	// workload is the ID of the workload mix the results are for (not
	// the mix itself: a node's memo must not keep an old mix alive).
	workload uint64
	// epoch is the shape table's epoch the results' shapes belong to.
	epoch uint64
	// capacity and free are the node's host resources the results were
	// computed for.
	capacity, free devicescheduler.Host
	n              int
	results        [maxMemoShapes]memoResult
	// hostOnly is the last result for a pod without devices, by its CPU
	// and memory (see evaluateHostOnly), valid for the same version,
	// workload, capacity and free as results.
	hostOnly struct {
		valid   bool
		request devicescheduler.Host
		memoResult
	}
}

type memoResult struct {
	shape uint32
	score int64
	err   error
}

// Bounds of the memo: request shapes remembered per node version, and
// shapes numbered at a time (beyond it, numbering starts over).
const (
	maxMemoShapes = 8
	maxShapeIDs   = 1 << 14
)

// evalInput is what one scheduling cycle evaluates on every node.
type evalInput struct {
	request *devicescheduler.Request
	// shape numbers the request's shape (0: not remembered): pods of equal
	// shapes fit and score the same on a node in a given state.
	shape uint32
	// epoch is the shape table's epoch that numbered shape.
	epoch    uint64
	workload *devicescheduler.Workload
	now      time.Time
	// host is, for a pod without devices, its CPU and memory: the key of
	// the nodes' host-only memo.
	host devicescheduler.Host
}

// evalInput prepares a cycle's evaluations of request r, whose shape is key.
func (c *deviceCache) evalInput(key shapeKey, r *devicescheduler.Request) evalInput {
	c.shapeMu.Lock()
	id, ok := c.shapes[key]
	if !ok {
		if len(c.shapes) == maxShapeIDs {
			// Full: start over rather than stop remembering new shapes.
			clear(c.shapes)
			c.shapeEpoch++
		}
		id = uint32(len(c.shapes) + 1)
		c.shapes[key] = id
	}
	epoch := c.shapeEpoch
	c.shapeMu.Unlock()
	return evalInput{request: r, shape: id, epoch: epoch, workload: c.engine.Workload(), now: c.now()}
}

// podState is what one pod holds, or is assumed to hold.
type podState struct {
	pod   ktypes.NamespacedName
	node  string
	alloc types.PodAllocation
	// source is where alloc was read from (objects.SourceRecord or
	// SourceAnnotation); empty while the pod is only assumed.
	source string
	// seen is the pod's annotation and record as last taken in, so that
	// updates that change neither are not decoded and verified again.
	seen podSeen
	// value is the verified payload alloc was read from (or written with).
	value string
	// written is the annotation value this scheduler bound the pod with.
	written string
	// assumed is true from Reserve until the pod is seen bound.
	assumed bool
	// applied is true when alloc is counted in the node's state; false
	// while the node is unknown or its devices no longer match alloc.
	applied bool
	// preempted is set once the scheduler evicts the pod for a preemptor
	// (it is being deleted, with the DisruptionTarget condition the
	// scheduler sets): it holds its devices until it is gone, but
	// preemption's dry run counts them as freed, and nominated pods get
	// the free devices they will need held meanwhile. priority is the
	// pod's.
	preempted bool
	priority  int32
	// running is set once the cache has seen the pod running (for the
	// allocation-to-running metric).
	running atomic.Bool
}

// podSeen is what a pod says of its allocation: its annotation, which its
// tenant may change, and the scheduler's record in its status.
type podSeen struct {
	annotation, record  string
	annotated, recorded bool
}

func seenOf(pod *corev1.Pod) podSeen {
	var s podSeen
	s.annotation, s.annotated = pod.Annotations[kubeinterface.AnnotationAllocation]
	s.record, s.recorded = objects.RecordValue(pod)
	return s
}

func newDeviceCache(engine *devicescheduler.Engine, keys *kubeinterface.KeySet, staleness time.Duration, m *cacheMetrics) *deviceCache {
	return &deviceCache{
		engine: engine, keys: keys, staleness: staleness, now: time.Now, started: time.Now(), metrics: m,
		nodes: map[string]*nodeState{}, byObject: map[*corev1.Node]*nodeState{}, pods: map[ktypes.UID]*podState{},
		activate: func(map[string]*corev1.Pod) {}, liveWaiters: newWaitSet(), deviceWaiters: newWaitSet(),
		shapes: map[shapeKey]uint32{}, listPods: func() ([]*corev1.Pod, error) { return nil, nil },
		pending: newPendingPods(),
	}
}

func (c *deviceCache) node(name string) *nodeState {
	ns, ok := c.nodes[name]
	if !ok {
		ns = &nodeState{name: name, err: errNoInventory, pods: map[ktypes.UID]struct{}{}}
		c.nodes[name] = ns
	}
	return ns
}

// updateNode takes in a node's inventory annotation and Ready condition.
// The node's devices are rebuilt only when the annotation changed, and the
// pods on it are counted again.
func (c *deviceCache) updateNode(logger klog.Logger, node *corev1.Node) {
	value, has := node.Annotations[kubeinterface.AnnotationInventory]
	c.mu.Lock()
	ns := c.node(node.Name)
	delete(c.byObject, ns.object)
	ns.object, c.byObject[node] = node, ns
	becameReady := setReady(ns, node)
	ns.gpus = advertisesGPUs(node)
	rebuilt := !ns.built || has != ns.hasInventory || value != ns.inventory
	if rebuilt {
		c.rebuildNode(logger, ns, node, value, has)
	}
	c.mu.Unlock()
	if becameReady {
		c.activateWaiting()
	}
	if rebuilt && has {
		c.wake(c.deviceWaiters)
	}
}

// rebuildNode builds the node's devices from its inventory annotation and
// counts its pods again; must hold c.mu.
func (c *deviceCache) rebuildNode(logger klog.Logger, ns *nodeState, node *corev1.Node, value string, has bool) {
	ns.built, ns.hasInventory, ns.inventory, ns.devices, ns.idle, ns.err, ns.refuses = true, has, value, nil, nil, errNoInventory, nil
	// A rebuilt Node starts its version again: forget its Filter results.
	ns.memo.clear()
	if has {
		inv, err := objects.NodeInventory(node)
		if err == nil {
			if ns.refuses = keyRefusal(inv, c.signingKey); ns.refuses != nil {
				logger.Error(ns.refuses, "Node gets no GPU pods until its shim accepts the scheduler's key", "node", klog.KObj(node), "nodeAccepts", inv.KeyIDs)
			}
			ns.devices, err = c.engine.NewNode(node.Name, inv, devicescheduler.Host{})
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
	for uid := range ns.pods {
		c.pods[uid].applied = false
		c.apply(logger, uid, c.pods[uid])
	}
	logger.V(4).Info("Node devices updated", "node", klog.KObj(node), "devices", deviceCount(ns), "pods", len(ns.pods))
}

// devicesChanged records the devices' version after the cache changed
// them; must hold c.mu for writing. Every change the cache makes to a
// node's devices must be followed by it, or Filter would take the node's
// memo for current (snapshot reports a node where it was not).
func (ns *nodeState) devicesChanged() {
	if ns.devices != nil {
		ns.version = ns.devices.Version()
	}
}

// advertisesGPUs reports whether node's capacity has GPUs: kubegpu.io/gpus,
// which kubegpu-crishim's advertiser publishes, or nvidia.com/gpu, which
// any device plugin does.
func advertisesGPUs(node *corev1.Node) bool {
	for _, r := range []corev1.ResourceName{kubeinterface.ResourceGPUs, kubeinterface.ResourceGPU} {
		if q, ok := node.Status.Capacity[r]; ok && q.Sign() > 0 {
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

// deleteNode forgets a node's devices; its pods stay recorded and are
// counted again if the node comes back (e.g. kubelet re-registers it).
func (c *deviceCache) deleteNode(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ns, ok := c.nodes[name]
	if !ok {
		return
	}
	for uid := range ns.pods {
		c.pods[uid].applied = false
	}
	ns.built, ns.hasInventory, ns.inventory, ns.devices, ns.err, ns.gpus = false, false, "", nil, errNoInventory, false
	ns.memo.clear()
	delete(c.byObject, ns.object)
	ns.object = nil
	c.dropIfGoneLocked(name)
}

// dropIfGoneLocked forgets the named node once nothing refers to it: its
// Node and Lease deleted, no pod counted there. A cluster whose nodes come
// and go so keeps no state for the gone ones. Must hold c.mu.
func (c *deviceCache) dropIfGoneLocked(name string) {
	if ns, ok := c.nodes[name]; ok && ns.object == nil && !ns.live.leased && len(ns.pods) == 0 {
		delete(c.nodes, name)
	}
}

// updatePod takes in a pod from the informer. A bound pod holds the devices
// of its verified allocation: the scheduler's record in its status when it
// has one, else its annotation (see objects.HeldAllocation). Any other pod
// holds none, except that a pod this scheduler assumed stays assumed until
// it is seen bound or is unreserved, and a pod once counted keeps the
// devices it was counted with, whatever later happens to its annotation
// (which its tenant may change) or its status (which its node may change):
// its containers hold those devices.
func (c *deviceCache) updatePod(logger klog.Logger, pod *corev1.Pod) {
	c.updatePodDevices(logger, pod)
	if pod.Spec.NodeName != "" {
		c.pending.remove(pod.UID)
		c.observeRunning(pod)
	}
	if objects.PreemptedByScheduler(pod) {
		c.mu.Lock()
		if ps, ok := c.pods[pod.UID]; ok {
			ps.preempted, ps.priority = true, corev1helpers.PodPriority(pod)
		}
		c.mu.Unlock()
	}
	c.learnMu.Lock()
	state := c.learnState
	c.learnMu.Unlock()
	if state != notLearning && pod.Spec.NodeName != "" {
		// Bound by another replica, another scheduler, or before this
		// one started: learned once the cache counts its devices.
		mix.Observe(c.engine, pod, c.hasDevices(pod.Spec.NodeName), c.holds(pod.UID))
	}
}

// updatePodDevices takes in a pod's devices (see updatePod).
func (c *deviceCache) updatePodDevices(logger klog.Logger, pod *corev1.Pod) {
	if pod.Spec.NodeName == "" {
		return
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		c.forget(logger, pod.UID)
		return
	}
	seen := seenOf(pod)
	c.mu.RLock()
	ps, known := c.pods[pod.UID]
	var sameNode, counted, unchanged, confirm bool
	var prev podSeen
	var value, written, source string
	if known {
		sameNode = ps.node == pod.Spec.NodeName
		counted = sameNode && !ps.assumed
		unchanged = counted && ps.seen == seen
		prev, value, written, source = ps.seen, ps.value, ps.written, ps.source
		// Bound by this scheduler with what it signed: no need to verify.
		confirm = sameNode && ps.assumed && seen.annotated && seen.annotation == written
	}
	c.mu.RUnlock()
	nn := ktypes.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	annotationChanged := seen.annotated != prev.annotated || seen.annotation != prev.annotation
	annotationWrong := !seen.annotated || seen.annotation != value
	switch {
	case !known && !seen.annotated && !seen.recorded:
		return // holds nothing, and nothing to forget
	case unchanged:
		return
	case confirm:
		c.mu.Lock()
		if c.pods[pod.UID] == ps {
			ps.assumed, ps.source, ps.seen, ps.value = false, objects.SourceAnnotation, seen, written
			if seen.recorded && seen.record == written {
				ps.source = objects.SourceRecord
			}
		}
		c.mu.Unlock()
		return
	case counted && seen.recorded && seen.record == value:
		// Recorded with what it was counted with: nothing to verify, and
		// nothing left to record.
		c.takeSeen(pod.UID, ps, seen, objects.SourceRecord)
		c.recorder.forget(pod.UID)
		if annotationChanged && annotationWrong {
			c.changed(logger, pod, "kept by the scheduler's record")
		}
		return
	case counted && !seen.recorded && value != "" && annotationWrong:
		// The annotation no longer says what the pod holds and nothing
		// records it yet: record it now, whichever replica this is.
		c.recorder.addUrgent(pod.UID, nn, value)
		c.takeSeen(pod.UID, ps, seen, source)
		c.changed(logger, pod, "recorded now from what the scheduler counted")
		return
	}
	held, err := objects.HeldAllocation(pod, c.keys.Verify)
	if err == nil && held.AnnotationDiffers {
		c.metrics.rejected(errChanged)
		logger.Info("Pod's allocation annotation differs from the scheduler's record: it was changed after binding; counting the pod's devices by the record",
			"pod", klog.KObj(pod), "node", pod.Spec.NodeName)
	}
	if err != nil || (counted && !reflect.DeepEqual(ps.alloc, held.PodAllocation)) {
		if counted {
			// Its containers hold the devices it was counted with.
			c.metrics.rejected(errChanged)
			logger.Info("Allocation of a bound pod was changed or removed; keeping the devices it was counted with",
				"pod", klog.KObj(pod), "node", pod.Spec.NodeName, "err", err)
			c.mu.Lock()
			if c.pods[pod.UID] == ps {
				ps.seen = seen
			}
			c.mu.Unlock()
			return
		}
		c.forget(logger, pod.UID)
		if !errors.Is(err, kubeinterface.ErrNoAllocation) {
			c.metrics.rejected(err)
			if known || klog.V(2).Enabled() {
				logger.Info("Pod's allocation is not valid; it holds no devices", "pod", klog.KObj(pod), "node", pod.Spec.NodeName, "err", err)
			}
		}
		return
	}
	if held.Source == objects.SourceAnnotation {
		// Bound by a scheduler that died before recording it, or by an
		// older version: record it now (only the leader writes).
		c.recorder.add(pod.UID, nn, held.Value)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ps, ok := c.pods[pod.UID]; ok && ps.node == held.Node && reflect.DeepEqual(ps.alloc, held.PodAllocation) {
		ps.assumed, ps.source, ps.seen, ps.value = false, held.Source, seen, held.Value
		return
	}
	c.forgetLocked(pod.UID)
	ps = &podState{pod: ktypes.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, node: held.Node, alloc: held.PodAllocation,
		source: held.Source, seen: seen, value: held.Value}
	c.pods[pod.UID] = ps
	c.node(held.Node).pods[pod.UID] = struct{}{}
	c.apply(logger, pod.UID, ps)
}

// errChanged counts allocations changed after the pod was counted.
var errChanged = errors.New("allocation changed after binding")

// takeSeen records what a counted pod says now.
func (c *deviceCache) takeSeen(uid ktypes.UID, ps *podState, seen podSeen, source string) {
	c.mu.Lock()
	if c.pods[uid] == ps {
		ps.seen, ps.source = seen, source
	}
	c.mu.Unlock()
}

// changed reports a counted pod whose annotation no longer says what it
// holds.
func (c *deviceCache) changed(logger klog.Logger, pod *corev1.Pod, what string) {
	c.metrics.rejected(errChanged)
	logger.Info("Pod's allocation annotation was changed or removed after binding; its devices are "+what,
		"pod", klog.KObj(pod), "node", pod.Spec.NodeName)
}

// apply counts ps on its node, if the node is known; must hold c.mu.
func (c *deviceCache) apply(logger klog.Logger, uid ktypes.UID, ps *podState) {
	ns, ok := c.nodes[ps.node]
	if !ok || ns.devices == nil || ps.applied {
		return
	}
	err := ns.devices.Assume(string(uid), ps.alloc, devicescheduler.Host{})
	ns.devicesChanged()
	if err != nil {
		c.metrics.rejected(err)
		logger.Error(err, "Pod's devices do not match the node's inventory; not counted", "pod", ps.pod, "node", ps.node)
		return
	}
	ps.applied = true
}

// forget releases a pod's devices, and wakes the pods waiting for devices
// if it held any.
func (c *deviceCache) forget(_ klog.Logger, uid ktypes.UID) {
	c.learnMu.Lock()
	if c.learnState == learning {
		// learnPods may be observing it from its list: forgotten again
		// once it is done.
		c.gone[uid] = struct{}{}
	}
	c.learnMu.Unlock()
	c.engine.ForgetPod(string(uid))
	c.mu.Lock()
	node := ""
	if ps, ok := c.pods[uid]; ok {
		node = ps.node
	}
	freed := c.forgetLocked(uid)
	if node != "" {
		c.dropIfGoneLocked(node)
	}
	c.mu.Unlock()
	c.notWaiting(uid)
	c.pending.remove(uid)
	c.recorder.forget(uid)
	if freed {
		c.wake(c.deviceWaiters)
	}
}

// forgetLocked releases a pod's devices and reports whether it held any;
// must hold c.mu.
func (c *deviceCache) forgetLocked(uid ktypes.UID) bool {
	ps, ok := c.pods[uid]
	if !ok {
		return false
	}
	freed := false
	if ns, ok := c.nodes[ps.node]; ok {
		if ps.applied && ns.devices != nil {
			ns.devices.Release(string(uid))
			ns.devicesChanged()
			freed = true
		}
		delete(ns.pods, uid)
	}
	delete(c.pods, uid)
	return freed
}

// lookup is node's state: by the object itself, which the scheduler's
// NodeInfo shares with the informer's event that this cache took in, else
// (the cache has not seen that object yet, or node is a copy) by its name.
// Must hold c.mu for reading.
func (c *deviceCache) lookup(node *corev1.Node) (*nodeState, bool) {
	if ns, ok := c.byObject[node]; ok {
		return ns, true
	}
	ns, ok := c.nodes[node.Name]
	return ns, ok
}

// evaluate checks in's request against node under the read lock and
// returns the node's score. p is scratch space. Results are remembered per
// node version and request shape (see filterMemo).
func (c *deviceCache) evaluate(node *corev1.Node, in *evalInput, capacity, free devicescheduler.Host, p *devicescheduler.Placement) (int64, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	ns, ok := c.lookup(node)
	if !ok {
		return 0, errNoInventory
	}
	if err := c.usableAt(ns, in.now); err != nil {
		return 0, err
	}
	return c.evaluateLocked(ns, in, capacity, free, p)
}

// evaluateHostOnly scores node name for a pod without devices, r holding
// only the pod's CPU and memory. The node's liveness does not matter: the
// pod takes no devices, and its score only weighs the idle devices beside
// it. errNoInventory means the node publishes no devices.
func (c *deviceCache) evaluateHostOnly(node *corev1.Node, in *evalInput, capacity, free devicescheduler.Host, p *devicescheduler.Placement) (int64, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	ns, ok := c.lookup(node)
	switch {
	case !ok || (ns.devices == nil && !ns.hasInventory):
		return 0, errNoInventory
	case ns.devices == nil:
		return 0, ns.err // devices published but unusable: not a node without devices
	}
	// Remembered in a slot of its own, the last CPU and memory request
	// only: those come in many more shapes than device requests and would
	// crowd theirs out of the memo, but the pods of one Deployment or Job
	// share theirs.
	m := &ns.memo
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refresh(ns.version, in, capacity, free)
	if h := &m.hostOnly; h.valid && h.request == in.host {
		return h.score, h.err
	}
	res := c.evaluateNode(ns, in, capacity, free, p)
	m.hostOnly.valid, m.hostOnly.request, m.hostOnly.memoResult = true, in.host, res
	return res.score, res.err
}

// clear forgets the memo's results; must hold c.mu for writing.
func (m *filterMemo) clear() { m.n, m.hostOnly.valid = 0, false }

// refresh forgets the memo's results unless they are for the node's
// version, in's workload and shape epoch, and capacity and free; must hold
// m.mu.
func (m *filterMemo) refresh(version uint64, in *evalInput, capacity, free devicescheduler.Host) {
	stale := m.version != version || m.workload != in.workload.ID() || m.capacity != capacity || m.free != free
	if in.shape != 0 && m.epoch != in.epoch {
		stale = true
	}
	if stale {
		m.version, m.workload, m.capacity, m.free, m.n, m.hostOnly.valid = version, in.workload.ID(), capacity, free, 0, false
		if in.shape != 0 {
			m.epoch = in.epoch
		}
	}
}

// evaluateLocked evaluates on ns through its memo; must hold c.mu for reading.
func (c *deviceCache) evaluateLocked(ns *nodeState, in *evalInput, capacity, free devicescheduler.Host, p *devicescheduler.Placement) (int64, error) {
	m := &ns.memo
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refresh(ns.version, in, capacity, free)
	for i := 0; i < m.n && in.shape != 0; i++ {
		if m.results[i].shape == in.shape {
			return m.results[i].score, m.results[i].err
		}
	}
	res := c.evaluateNode(ns, in, capacity, free, p)
	if in.shape != 0 {
		// Keep the most recent shapes: the oldest is overwritten.
		copy(m.results[1:], m.results[:min(m.n, maxMemoShapes-1)])
		m.results[0] = res
		m.n = min(m.n+1, maxMemoShapes)
	}
	return res.score, res.err
}

// evaluateNode runs the engine for in's request on ns; must hold c.mu for
// reading.
func (c *deviceCache) evaluateNode(ns *nodeState, in *evalInput, capacity, free devicescheduler.Host, p *devicescheduler.Placement) memoResult {
	res := memoResult{shape: in.shape}
	var nf *devicescheduler.NotFitError
	if res.err = c.engine.EvaluateHost(ns.devices, in.request, capacity, free, p); res.err == nil {
		res.score = p.Score()
	} else if errors.As(res.err, &nf) && ns.idle != nil && c.engine.EvaluateHost(ns.idle, in.request, capacity, capacity, p) != nil {
		res.err = errors.Join(errNeverFits, res.err)
	}
	if res.err != nil {
		res.err = classify(res.err)
	}
	return res
}

// holds reports whether the cache counts (or assumes) devices for pod uid.
func (c *deviceCache) holds(uid ktypes.UID) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	_, ok := c.pods[uid]
	return ok
}

// hasDevices reports whether node name publishes devices.
func (c *deviceCache) hasDevices(name string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	ns, ok := c.nodes[name]
	return ok && (ns.devices != nil || ns.hasInventory)
}

// reserve chooses pod uid's devices on node name afresh and assumes them, in
// one step under the write lock, so that concurrent cycles never hand out the
// same device twice.
//
// capacity and free are the node's host resources as Filter and Score saw
// them, so that the devices chosen are those the node was scored for.
func (c *deviceCache) reserve(pod *corev1.Pod, name string, r *devicescheduler.Request, capacity, free devicescheduler.Host, nominated []addedPod) (types.PodAllocation, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ns, ok := c.nodes[name]
	if !ok {
		return types.PodAllocation{}, errNoInventory
	}
	if err := c.usable(ns); err != nil {
		return types.PodAllocation{}, err
	}
	var p devicescheduler.Placement
	var alloc types.PodAllocation
	if len(nominated) == 0 {
		if err := c.engine.EvaluateHost(ns.devices, r, capacity, free, &p); err != nil {
			return types.PodAllocation{}, err
		}
		c.forgetLocked(pod.UID)
		err := ns.devices.AssumePlacement(string(pod.UID), &p, devicescheduler.Host{})
		ns.devicesChanged()
		if err != nil {
			return types.PodAllocation{}, err
		}
		alloc = p.Allocation()
	} else {
		// The nominated pods' devices first, on a copy; the pod's from
		// what they leave, then on the node.
		n := ns.devices.Clone()
		h := holder{c: c, n: n, evicting: c.preemptedOn(ns, math.MaxInt32)}
		for _, a := range nominated {
			h.place(a, capacity, free, &p)
		}
		if err := c.engine.EvaluateHost(n, r, capacity, free, &p); err != nil {
			return types.PodAllocation{}, err
		}
		alloc = p.Allocation()
		c.forgetLocked(pod.UID)
		err := ns.devices.Assume(string(pod.UID), alloc, devicescheduler.Host{})
		ns.devicesChanged()
		if err != nil {
			return types.PodAllocation{}, err
		}
	}
	alloc.Node = name
	c.pods[pod.UID] = &podState{pod: ktypes.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, node: name, alloc: alloc, assumed: true, applied: true}
	ns.pods[pod.UID] = struct{}{}
	c.notWaiting(pod.UID)
	return alloc, nil
}

// written remembers the allocation annotation this scheduler signed and
// bound an assumed pod with, so that the pod's informer events need no
// verification.
func (c *deviceCache) written(uid ktypes.UID, value string) {
	c.mu.Lock()
	if ps, ok := c.pods[uid]; ok {
		ps.written = value
	}
	c.mu.Unlock()
}

// unreserve forgets an assumed pod; a pod already seen bound is kept.
func (c *deviceCache) unreserve(uid ktypes.UID) {
	c.mu.Lock()
	freed := false
	if ps, ok := c.pods[uid]; ok && ps.assumed {
		freed = c.forgetLocked(uid)
	}
	c.mu.Unlock()
	if freed {
		c.wake(c.deviceWaiters)
	}
}

// nodeSnapshot is one node's state for tests and debugging.
type nodeSnapshot struct {
	Usable string
	State  devicescheduler.State
	Pods   []string
}

// snapshot returns every node's state, keyed by node name.
func (c *deviceCache) snapshot() map[string]nodeSnapshot {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := map[string]nodeSnapshot{}
	for name, ns := range c.nodes {
		s := nodeSnapshot{Usable: "ok"}
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
