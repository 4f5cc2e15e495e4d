package plugin

import (
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"

	fwk "k8s.io/kube-scheduler/framework"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kube-scheduler/metrics"
	"github.com/kubegpu/kubegpu/types"
)

// stateKey keys the plugin's data in the CycleState.
const stateKey fwk.StateKey = Name

// cycleState is one scheduling cycle's data for a GPU pod: the decoded
// request from PreFilter and what Filter and Score share, and the devices
// Reserve chose for Bind.
type cycleState struct {
	request *devicescheduler.Request
	// eval is what every Filter and Score call of the cycle evaluates.
	eval devicecache.Input
	// others are the variants after request, in DRA's order of
	// preference, of a pod whose claims have alternatives (firstAvailable,
	// claims.Compile): a node takes the first variant that fits there.
	others []variant
	// waitsForDevices is set once a node refused the pod for want of
	// devices, and the cache remembers the pod to wake it.
	waitsForDevices atomic.Bool
	// pending counts the nodes' refusals by reason, for the metrics.
	pending *metrics.PendingPod
	// scores are the scores of the nodes Filter passed, for Score.
	scores filterScores
	// claims are the pod's kubegpu ResourceClaims; nil when it has none.
	claims *claimCycle
	// claimsElsewhere is set once a node was refused because the pod's
	// claims are allocated on another node (PostFilter).
	claimsElsewhere atomic.Bool

	// Set by Reserve. dra is set when DRA serves the pod on its node
	// (devicecache.ServedByDRA): kubegpu reserves and binds nothing.
	alloc types.PodAllocation
	dra   bool
	// claimOnly is set when all the devices Reserve chose are the pod's
	// claims': the pod itself carries no allocation, and DefaultBinder
	// binds it.
	claimOnly bool
	// written is set once the allocation is on the pod (Bind or PreBind);
	// value is the annotation value written.
	written bool
	value   string
}

// variant is one way to satisfy the pod's claims with alternatives.
type variant struct {
	request *devicescheduler.Request
	eval    devicecache.Input
}

// input is variant i's input: 0 is eval, the others in order.
func (s *cycleState) input(i int) *devicecache.Input {
	if i == 0 {
		return &s.eval
	}
	return &s.others[i-1].eval
}

// requestOf is variant i's request: 0 is request, the others in order.
func (s *cycleState) requestOf(i int) *devicescheduler.Request {
	if i == 0 {
		return s.request
	}
	return s.others[i-1].request
}

// Clone shares the state: after PreFilter it is written only by Reserve
// and Bind, once per cycle.
func (s *cycleState) Clone() fwk.StateData { return s }

// filterScores are the engine's scores of the nodes Filter passed in a
// cycle, so that Score need not look each node up and evaluate it again.
// Filter runs on many goroutines at once: each call takes a slot of its own
// with one atomic add, where a lock per call was the largest part of
// Filter's cost on 8 cores. The framework runs Filter on every node before
// PreScore, which indexes the slots for Score's reads, a later slot of a
// node over an earlier one. The buffers are pooled (a cycle passes
// hundreds of nodes at 5,000), and taken at the first score put: a cycle
// that places nothing takes none.
type filterScores struct {
	// size is the slots a cycle may fill: PreFilter's node count, twice,
	// and two (see slotsFor).
	size int
	buf  atomic.Pointer[scoreBuffers]
	n    atomic.Int64
	// dropped counts the scores put beyond size, left for Score to
	// evaluate (none should be).
	dropped atomic.Int64
}

type scoreBuffers struct {
	slots  []scoredNode
	byNode map[*corev1.Node]int64
}

type scoredNode struct {
	node  *corev1.Node
	score int64
}

var scoreBufferPool = sync.Pool{New: func() any { return &scoreBuffers{byNode: make(map[*corev1.Node]int64, 64)} }}

// slotsFor is the slots a cycle over nodes nodes may fill. The framework
// may filter a node twice in one cycle: a node with pods nominated to it,
// when none of them adds devices there, passes Filter with them and then
// without; and the pod's nominated node is filtered first, then again with
// all nodes should it not do. (A batch hint would filter one more node
// first; GPU pods get none, see SignPod.)
func slotsFor(nodes int) int { return 2*nodes + 2 }

// reset readies f for a cycle over nodes nodes (PreFilter).
func (f *filterScores) reset(nodes int) { f.size = slotsFor(nodes) }

// put remembers node's score; Filter calls it.
func (f *filterScores) put(node *corev1.Node, score int64) {
	i := f.n.Add(1) - 1
	if i >= int64(f.size) {
		f.dropped.Add(1)
		return
	}
	b := f.buf.Load()
	if b == nil {
		b = scoreBufferPool.Get().(*scoreBuffers)
		if cap(b.slots) < f.size {
			b.slots = make([]scoredNode, f.size)
		}
		b.slots = b.slots[:f.size]
		if !f.buf.CompareAndSwap(nil, b) {
			if len(b.slots) <= maxPooledScores {
				scoreBufferPool.Put(b)
			}
			b = f.buf.Load()
		}
	}
	b.slots[i] = scoredNode{node, score}
}

// index makes the scores Filter put readable by node (PreScore, once every
// Filter call of the cycle has returned). Of two scores of one node, the
// later one counts: the framework filters a node a second time without
// the pods nominated to it, and that pass is Score's.
func (f *filterScores) index() {
	b := f.buf.Load()
	if b == nil || f.dropped.Load() > 0 {
		// With a score dropped, a node's earlier score (its pass with
		// the pods nominated to it) could stand for its later one: Score
		// evaluates every node instead.
		return
	}
	n := min(f.n.Load(), int64(len(b.slots)))
	for _, e := range b.slots[:n] {
		if e.node != nil {
			b.byNode[e.node] = e.score
		}
	}
}

// get returns node's score as Filter found it; Score calls it, after
// PreScore indexed them.
func (f *filterScores) get(node *corev1.Node) (int64, bool) {
	b := f.buf.Load()
	if b == nil {
		return 0, false
	}
	score, ok := b.byNode[node]
	return score, ok
}

// release gives the buffers back to the pool once Score is done (Reserve),
// and says how many scores did not fit in the slots.
func (f *filterScores) release() (dropped int64) {
	b := f.buf.Swap(nil)
	if b != nil && len(b.slots) <= maxPooledScores {
		clear(b.byNode)
		clear(b.slots) // no Node kept alive by the pool
		scoreBufferPool.Put(b)
	}
	return f.dropped.Swap(0)
}

// maxPooledScores bounds the buffers kept in the pool: those of a cycle
// over a very large cluster are left to the garbage collector.
const maxPooledScores = 1 << 15

// getState returns the cycle's state, or nil for a pod without devices.
func getState(cs fwk.CycleState) *cycleState { return readState[*cycleState](cs, stateKey) }

// readState returns the cycle's data under key, or nil when there is none.
func readState[T fwk.StateData](cs fwk.CycleState, key fwk.StateKey) T {
	var zero T
	d, err := cs.Read(key)
	if err != nil {
		return zero
	}
	s, _ := d.(T)
	return s
}

// hostOnlyKey keys the cycle data of a pod that asks for no devices, when
// the plugin scores such pods: Score reads it, and Reserve to learn the pod.
const hostOnlyKey fwk.StateKey = Name + "/host-only"

// hostOnlyState is what Score evaluates for a pod without devices: its
// CPU and memory.
type hostOnlyState struct {
	eval devicecache.Input
}

// Clone shares the state: it is not written after PreFilter.
func (s *hostOnlyState) Clone() fwk.StateData { return s }

// getHostOnly returns the cycle's state for a pod without devices, or nil.
func getHostOnly(cs fwk.CycleState) *hostOnlyState {
	return readState[*hostOnlyState](cs, hostOnlyKey)
}
