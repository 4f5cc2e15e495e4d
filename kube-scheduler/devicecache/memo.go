package devicecache

import (
	"sync"
	"time"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
)

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
	// and memory (see EvaluateHostOnly), valid for the same version,
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

// Input is what one scheduling cycle evaluates on every node.
type Input struct {
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
	// mapped are the resources the pod asks for that a DeviceClass maps
	// to DRA (see ForPod).
	mapped []dra.Mapping
}

// Input prepares a cycle's evaluations of request r, whose shape is key.
func (c *Cache) Input(key ShapeKey, r *devicescheduler.Request) Input {
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
	return Input{request: r, shape: id, epoch: epoch, workload: c.engine.Workload(), now: c.now()}
}

// clear forgets the memo's results; must hold c.mu for writing.
func (m *filterMemo) clear() { m.n, m.hostOnly.valid = 0, false }

// refresh forgets the memo's results unless they are for the node's
// version, in's workload and shape epoch, and capacity and free; must hold
// m.mu.
func (m *filterMemo) refresh(version uint64, in *Input, capacity, free devicescheduler.Host) {
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

// HostOnlyInput prepares a cycle's evaluations for a pod without devices:
// r holds only its CPU and memory, host. Not numbered as a shape: CPU and
// memory requests come in many more shapes than device requests, and would
// crowd theirs out of the memo (see EvaluateHostOnly).
func (c *Cache) HostOnlyInput(r *devicescheduler.Request, host devicescheduler.Host) Input {
	return Input{request: r, workload: c.engine.Workload(), now: c.now(), host: host}
}

// Request is the request the input evaluates.
func (in *Input) Request() *devicescheduler.Request { return in.request }

// NodeHost is a node's host resources as Evaluate takes them: its
// allocatable CPU (millicores) and memory (bytes), and what of them is
// free once requested (by the pods counted there) is taken, in MiB
// rounded down. The scheduler's Filter and `kubegpu explain` both count
// with it.
func NodeHost(allocCPUMilli, allocMemory, reqCPUMilli, reqMemory int64) (capacity, free devicescheduler.Host) {
	capacity = devicescheduler.Host{CPUMilli: allocCPUMilli, MemoryMiB: allocMemory >> 20}
	free = devicescheduler.Host{
		CPUMilli:  max(0, allocCPUMilli-reqCPUMilli),
		MemoryMiB: max(0, allocMemory-reqMemory) >> 20,
	}
	return capacity, free
}

// InputOnce prepares one evaluation of r per node, not remembered: every
// call fills the Placement (`kubegpu explain` prints the devices).
func (c *Cache) InputOnce(r *devicescheduler.Request) Input {
	return Input{request: r, workload: c.engine.Workload(), now: c.now()}
}
