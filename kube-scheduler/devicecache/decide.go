package devicecache

import (
	"errors"
	"strings"

	corev1 "k8s.io/api/core/v1"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
)

// errNeverFits is joined to the reason a pod does not fit on a node when it
// would not fit there even with every pod gone: preemption cannot help.
var errNeverFits = errors.New("does not fit even on the idle node")

// Evaluate checks in's request against node under the read lock and
// returns the node's score. A *DRAServes error is no refusal: DRA serves
// the request there (see ServedByDRA). p is scratch space. Results are remembered per
// node version and request shape (see filterMemo).
func (c *Cache) Evaluate(node *corev1.Node, in *Input, capacity, free devicescheduler.Host, p *devicescheduler.Placement) (int64, error) {
	if s := ServedByDRA(node, in); s != nil {
		return 0, s
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	ns, ok := c.lookup(node)
	if !ok {
		return 0, ErrNoInventory
	}
	if err := c.usableAt(ns, in.now); err != nil {
		return 0, err
	}
	return c.evaluateLocked(ns, in, capacity, free, p)
}

// EvaluateHostOnly scores node name for a pod without devices, r holding
// only the pod's CPU and memory. The node's liveness does not matter: the
// pod takes no devices, and its score only weighs the idle devices beside
// it. ErrNoInventory means the node publishes no devices.
func (c *Cache) EvaluateHostOnly(node *corev1.Node, in *Input, capacity, free devicescheduler.Host, p *devicescheduler.Placement) (int64, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	ns, ok := c.lookup(node)
	switch {
	case !ok || (ns.devices == nil && !ns.hasInventory):
		return 0, ErrNoInventory
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

// evaluateLocked evaluates on ns through its memo; must hold c.mu for reading.
func (c *Cache) evaluateLocked(ns *nodeState, in *Input, capacity, free devicescheduler.Host, p *devicescheduler.Placement) (int64, error) {
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
func (c *Cache) evaluateNode(ns *nodeState, in *Input, capacity, free devicescheduler.Host, p *devicescheduler.Placement) memoResult {
	res := memoResult{shape: in.shape}
	var nf *devicescheduler.NotFitError
	if res.err = c.engine.EvaluateHost(ns.devices, in.request, capacity, free, p); res.err == nil {
		res.score = p.Score()
	} else if errors.As(res.err, &nf) && ns.idle != nil && c.engine.EvaluateHost(ns.idle, in.request, capacity, capacity, p) != nil {
		res.err = errors.Join(errNeverFits, res.err)
	}
	if res.err != nil {
		res.err = Classify(res.err)
	}
	return res
}

// Refusal is why a node does not take a pod, classified once: Filter's
// status, its preemption dry runs and `kubegpu explain` all read it. The
// memo keeps engine refusals classified (a node refuses every pod of a
// shape alike until it changes, and once a cluster fills, each cycle's
// Filter passes over hundreds of such nodes). It wraps the error.
type Refusal struct {
	error
	// Reason is the pending reason.
	Reason Reason
	// Unresolvable is set when no pod leaving the node would let the pod
	// fit: preemption passes the node over.
	Unresolvable bool
	// Message is Filter's status message: constant per reason, so that
	// the scheduler's FailedScheduling message counts nodes by reason.
	Message string
	// Waits is set when freed devices could let the pod fit.
	Waits bool
}

func (r *Refusal) Unwrap() error { return r.error }

// Detail is the refusal in full, for people (`kubegpu explain`): the
// engine's details where Message has its constant reason.
func (r *Refusal) Detail() string {
	var nf *devicescheduler.NotFitError
	var d interface{ Detail() string }
	switch {
	case errors.As(r.error, &nf) && errors.Is(r.error, errNeverFits):
		return nf.Detail() + neverFitsSuffix
	case errors.As(r.error, &nf):
		return nf.Detail()
	case errors.As(r.error, &d): // a DRA refusal
		return d.Detail()
	}
	return strings.TrimPrefix(r.Message, "GPUs: ")
}

// neverFitsSuffix ends the message of a node that could not hold the pod
// even with all its GPUs free: the pod will not fit there by waiting.
const neverFitsSuffix = ", even with every GPU of the node free"

// Classify classifies an error of Evaluate or EvaluateWith.
func Classify(err error) *Refusal {
	if r, ok := err.(*Refusal); ok { //nolint:errorlint // the memo returns refusals unwrapped; errors.As per refused node is the cost avoided
		return r
	}
	r := &Refusal{error: err, Reason: ReasonOf(err)}
	var nf *devicescheduler.NotFitError
	switch {
	case errors.Is(err, ErrNoInventory), errors.Is(err, ErrKeyRefused), errors.Is(err, ErrDRA):
		r.Unresolvable, r.Message = true, "GPUs: "+err.Error()
	case errors.Is(err, ErrStale):
		r.Message = "GPUs: " + notLiveReason(err)
	case errors.As(err, &nf) && errors.Is(err, errNeverFits):
		// Evicting pods would not help: preemption skips the node. Said
		// so, or "not enough free GPUs" reads as a wait.
		r.Unresolvable, r.Message = true, "GPUs: "+nf.Reason+neverFitsSuffix
	case errors.As(err, &nf):
		// The constant reason; Detail formats the engine's details, only
		// when asked. Freed devices may let the pod fit.
		r.Message, r.Waits = "GPUs: "+nf.Reason, true
	default:
		r.Message = "GPUs: " + err.Error()
	}
	return r
}

// MostHopeful picks, of the refusals of one node for each way a pod could
// be placed (the variants of its claims' alternatives), the one to answer
// with: the first that frees devices could end (Waits), else the first
// that is not Unresolvable, else the first. A way that could fit after
// evictions or departures must not be hidden behind one that never fits,
// or preemption passes the node over and the pod is not woken.
func MostHopeful(refusals []error) int {
	resolvable := -1
	for i, err := range refusals {
		r := Classify(err)
		if r.Waits {
			return i
		}
		if !r.Unresolvable && resolvable < 0 {
			resolvable = i
		}
	}
	return max(resolvable, 0)
}

// notLiveReason strips the sentinel from a node-not-live error.
func notLiveReason(err error) string {
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, ErrStale.Error()+": "); ok {
		return rest
	}
	return msg
}
