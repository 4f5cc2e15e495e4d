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
	// waitsForDevices is set once a node refused the pod for want of
	// devices, and the cache remembers the pod to wake it.
	waitsForDevices atomic.Bool
	// pending counts the nodes' refusals by reason, for the metrics.
	pending *metrics.PendingPod
	// scores are the scores of the nodes Filter passed, for Score.
	scores filterScores

	// Set by Reserve.
	alloc types.PodAllocation
	// written is set once the allocation is on the pod (Bind or PreBind);
	// value is the annotation value written.
	written bool
	value   string
}

// Clone shares the state: after PreFilter it is written only by Reserve
// and Bind, once per cycle.
func (s *cycleState) Clone() fwk.StateData { return s }

// filterScores are the engine's scores of the nodes Filter passed in a
// cycle, so that Score need not look each node up and evaluate it again:
// the framework runs Filter on every node before it runs Score on any, so
// Score reads them without the lock. The map is pooled: a cycle passes
// hundreds of nodes at 5,000.
type filterScores struct {
	mu sync.Mutex
	m  map[*corev1.Node]int64
}

var scoreMaps = sync.Pool{New: func() any { return make(map[*corev1.Node]int64, 64) }}

// put remembers node's score; Filter calls it.
func (f *filterScores) put(node *corev1.Node, score int64) {
	f.mu.Lock()
	if f.m == nil {
		f.m = scoreMaps.Get().(map[*corev1.Node]int64)
	}
	f.m[node] = score
	f.mu.Unlock()
}

// get returns node's score as Filter found it; Score calls it, after every
// Filter call of the cycle.
func (f *filterScores) get(node *corev1.Node) (int64, bool) {
	score, ok := f.m[node]
	return score, ok
}

// release gives the map back to the pool once Score is done (Reserve).
func (f *filterScores) release() {
	f.mu.Lock()
	m := f.m
	f.m = nil
	f.mu.Unlock()
	if m != nil && len(m) <= maxPooledScores {
		clear(m)
		scoreMaps.Put(m)
	}
}

// maxPooledScores bounds the maps kept in the pool: one that grew past it
// (a cycle over a very large cluster) is left to the garbage collector.
const maxPooledScores = 1 << 14

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
