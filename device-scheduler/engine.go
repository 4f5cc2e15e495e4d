package devicescheduler

import (
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"strings"
	"sync/atomic"
	"weak"

	"github.com/kubegpu/kubegpu/types"
)

// ErrDoesNotFit is wrapped by Evaluate's error when the pod does not fit on
// the node. The error's text is the reason, for the user.
var ErrDoesNotFit = errors.New("does not fit")

// Names of the built-in policies.
const (
	// PolicyKubegpu is the default: fragmentation-aware placement that
	// minimises the GPU capacity left stranded for the workload mix.
	PolicyKubegpu = "kubegpu"
	// PolicyBinpack prefers busy nodes and, within a node, busy devices.
	PolicyBinpack = "binpack"
	// PolicySpread prefers idle nodes and, within a node, idle devices.
	PolicySpread = "spread"
)

// Policy ranks the nodes a pod fits on and the devices of a node that could
// serve a slice. Implementations must be safe for concurrent use and should
// not allocate.
type Policy interface {
	// ScoreDevices rates, for every device d in cand, giving d to one slice
	// of container c, into scores[d]; s is node n's free capacity. Higher
	// is better.
	ScoreDevices(n *Node, s *State, c *Container, cand uint64, scores *[MaxDevices]int64)
	// ScoreNode rates node n for pod r: before is the node's state, after
	// is the state once the pod's chosen devices are taken. Higher is
	// better. Scores must lie within ±MaxPolicyScore: the engine appends a
	// stable per-node tie-break below them.
	ScoreNode(n *Node, before, after *State, r *Request) int64
}

// MaxPolicyScore bounds the scores a Policy's ScoreNode returns.
const MaxPolicyScore = 1 << 38

// tieBreakBits is the width of the per-node tie-break the engine appends to
// every policy score.
const tieBreakBits = 24

// policies maps each built-in policy's name to its constructor.
var policies = map[string]func(e *Engine) Policy{
	PolicyKubegpu: func(e *Engine) Policy { return &fragPolicy{engine: e} },
	PolicyBinpack: func(*Engine) Policy { return binpack{} },
	PolicySpread:  func(*Engine) Policy { return spread{} },
}

// Policies lists the built-in policies' names.
func Policies() []string { return slices.Sorted(maps.Keys(policies)) }

// Config configures an Engine.
type Config struct {
	// Plugins are the scheduler sides of the device modules; each rates the
	// devices of its vendor. Devices of a vendor without a plugin are never
	// allocated.
	Plugins []types.SchedulerPlugin
	// Policy names a built-in policy (default PolicyKubegpu).
	Policy string
	// DevicePolicy names the built-in policy that chooses among a node's
	// devices for slices (GPU-level binpack or spread); empty means the
	// same as Policy. A pod's placement annotation overrides both.
	DevicePolicy string
	// CustomPolicy replaces the named policy when set (used by the
	// placement simulator for its baselines).
	CustomPolicy Policy
	// DefaultTopology applies to requests that set none (default
	// types.TopologyPreferred).
	DefaultTopology types.TopologyPolicy
	// Workload is the workload mix the kubegpu policy minimises
	// fragmentation for. Nil: the engine learns it from the requests passed
	// to Observe.
	Workload *Workload
	// TieBreakSeed seeds the stable order in which nodes with equal policy
	// scores are preferred. Nodes are then filled first-fit in that order,
	// which leaves the others whole for large pods; a caller that broke ties
	// at random on every decision would spread pods instead.
	TieBreakSeed uint64
	// Learn bounds and ages the mix learned when Workload is nil.
	Learn LearnConfig
}

// Engine evaluates requests against nodes. It is immutable after New except
// for its learned workload, which is swapped atomically.
type Engine struct {
	vendors         map[string]types.SchedulerPlugin
	policy          Policy
	binpack, spread Policy
	defaultTopology types.TopologyPolicy
	tieBreakSeed    uint64
	workload        atomic.Pointer[Workload]
	// workloads counts the workloads the engine has used: it numbers them
	// (Workload.ID).
	workloads atomic.Uint64
	learner   *workloadLearner
}

// New checks cfg and builds an Engine.
func New(cfg Config) (*Engine, error) {
	e := &Engine{vendors: map[string]types.SchedulerPlugin{}, binpack: binpack{}, spread: spread{}, tieBreakSeed: cfg.TieBreakSeed}
	for _, p := range cfg.Plugins {
		if other, dup := e.vendors[p.Vendor()]; dup {
			return nil, fmt.Errorf("two scheduler plugins (%T and %T) rate vendor %q", other, p, p.Vendor())
		}
		e.vendors[p.Vendor()] = p
	}
	name := cfg.Policy
	if name == "" {
		name = PolicyKubegpu
	}
	newPolicy, ok := policies[name]
	if !ok {
		return nil, fmt.Errorf("unknown policy %q (known: %s)", name, strings.Join(Policies(), ", "))
	}
	e.policy = newPolicy(e)
	if cfg.DevicePolicy != "" && cfg.DevicePolicy != name {
		newDevicePolicy, ok := policies[cfg.DevicePolicy]
		if !ok {
			return nil, fmt.Errorf("unknown device policy %q (known: %s)", cfg.DevicePolicy, strings.Join(Policies(), ", "))
		}
		e.policy = splitPolicy{node: e.policy, devices: newDevicePolicy(e)}
	}
	if cfg.CustomPolicy != nil {
		e.policy = cfg.CustomPolicy
	}
	switch cfg.DefaultTopology {
	case "":
		e.defaultTopology = types.TopologyPreferred
	case types.TopologyRequired, types.TopologyPreferred, types.TopologyNone:
		e.defaultTopology = cfg.DefaultTopology
	default:
		return nil, fmt.Errorf("unknown default topology policy %q", cfg.DefaultTopology)
	}
	if cfg.Workload != nil {
		e.useWorkload(cfg.Workload)
	} else {
		l, err := newWorkloadLearner(cfg.Learn)
		if err != nil {
			return nil, err
		}
		e.learner = l
		e.useWorkload(l.snapshot())
	}
	return e, nil
}

// useWorkload makes the kubegpu policy work for w's mix. The engine keeps a
// copy numbered among its own workloads, so that w stays as it was and may
// serve other engines too.
func (e *Engine) useWorkload(w *Workload) {
	c := *w
	c.id = e.workloads.Add(1)
	c.self = weak.Make(&c)
	e.workload.Store(&c)
}

// Placement is the result of Evaluate: the devices chosen for each container
// and the node's score. It is a reusable buffer; its zero value is ready.
type Placement struct {
	node          *Node
	ok            bool // the last Evaluate succeeded
	req           *Request
	score         int64
	numContainers int
	numShares     int
	containers    [MaxContainers]struct{ first, count int }
	shares        [MaxDevices]share
	before, after State             // before: only when the caller gives the host
	scores        [MaxDevices]int64 // scratch for device scores
}

// Node is the node the placement is for.
func (p *Placement) Node() *Node { return p.node }

// Score is the node's score for the pod; higher is better. Scores of one
// pod on different nodes compare; absolute values mean nothing. Two nodes
// never score the same unless their names hash alike: the policy's score
// comes first, then a stable per-node preference (see Config.TieBreakSeed).
func (p *Placement) Score() int64 { return p.score }

// After is the node's state with the placement applied.
func (p *Placement) After() *State { return &p.after }

// Devices appends the indexes of the devices container i got to dst.
func (p *Placement) Devices(i int, dst []int) []int {
	c := p.containers[i]
	for _, s := range p.shares[c.first : c.first+c.count] {
		dst = append(dst, s.dev)
	}
	return dst
}

// Allocation converts the placement into the API's form.
func (p *Placement) Allocation() types.PodAllocation {
	a := types.PodAllocation{Node: p.node.name, Enforcement: p.req.Enforcement}
	for i := 0; i < p.numContainers; i++ {
		rc := &p.req.Containers[i]
		c := p.containers[i]
		ca := types.ContainerAllocation{Name: rc.Name, Devices: make([]types.DeviceShare, 0, c.count)}
		for _, s := range p.shares[c.first : c.first+c.count] {
			ca.Devices = append(ca.Devices, types.DeviceShare{
				ID: p.node.ids[s.dev], UUID: p.node.inv.Devices[s.dev].UUID, Exclusive: s.exclusive,
				MemoryMiB: s.mem, ComputePercent: int(s.milli / 10),
			})
		}
		if rc.Init {
			a.InitContainers = append(a.InitContainers, ca)
		} else {
			a.Containers = append(a.Containers, ca)
		}
	}
	return a
}

// Evaluate decides whether pod r fits on node n and, if it does, fills p with
// the devices chosen for each container and the node's score. It returns an
// error wrapping ErrDoesNotFit, with the reason, when it does not fit.
func (e *Engine) Evaluate(n *Node, r *Request, p *Placement) error {
	return e.evaluate(n, r, nil, p)
}

// EvaluateHost is Evaluate for a node whose host resources the caller
// tracks rather than the engine (kube-scheduler's NodeInfo, for one):
// capacity is the node's allocatable CPU and memory, zero to leave one
// untracked as NewNode does, and free is what is free of them before the
// pod, as the caller counts it. The pod's host request must fit in free, and
// the kubegpu policy counts the idle devices that free cannot feed. The
// node's own host tracking is ignored, and assuming the placement does not
// change it.
func (e *Engine) EvaluateHost(n *Node, r *Request, capacity, free Host, p *Placement) error {
	return e.evaluate(n, r, &hostView{capacity, free}, p)
}

// hostView is a node's host resources as the caller of EvaluateHost gives them.
type hostView struct{ capacity, free Host }

func (e *Engine) evaluate(n *Node, r *Request, host *hostView, p *Placement) error {
	p.node, p.req, p.score, p.numContainers, p.numShares, p.ok = n, r, 0, 0, 0, false
	before := &n.state
	if host != nil {
		p.before = n.state
		p.before.Host = host.free
		p.before.cpuTracked, p.before.memTracked = host.capacity.CPUMilli > 0, host.capacity.MemoryMiB > 0
		p.before.hostView = true
		before = &p.before
	}
	p.after = *before
	s := &p.after
	s.hostView = false
	if s.cpuTracked && r.Host.CPUMilli > s.Host.CPUMilli {
		return notFit(ReasonHostResources, "insufficient CPU: %d m free, %d m asked", s.Host.CPUMilli, r.Host.CPUMilli)
	}
	if s.memTracked && r.Host.MemoryMiB > s.Host.MemoryMiB {
		return notFit(ReasonHostResources, "insufficient memory: %d MiB free, %d MiB asked", s.Host.MemoryMiB, r.Host.MemoryMiB)
	}
	pol := e.policyFor(r)
	for ci := range r.Containers {
		c := &r.Containers[ci]
		cand := candidates(n, s, c)
		if popcount(cand) < c.Count {
			return e.explain(n, s, c, cand)
		}
		var chosen uint64
		if c.Exclusive {
			chosen = chooseWhole(n, s, c, cand)
		} else {
			chosen = chooseSlices(n, s, c, cand, pol, &p.scores)
		}
		if chosen == 0 {
			return notFit(ReasonTopology, "container %q: no %d devices are all joined by NVLink or NVSwitch (topology required)", c.Name, c.Count)
		}
		if p.numShares+c.Count > MaxDevices {
			return notFit(ReasonTooManyShares, "the pod asks for more than %d device shares", MaxDevices)
		}
		p.containers[ci] = struct{ first, count int }{p.numShares, c.Count}
		for m := chosen; m != 0; m &= m - 1 {
			d := trailing(m)
			sh := share{dev: d, milli: c.Milli, mem: c.MemoryMiB, exclusive: c.Exclusive}
			if c.Exclusive {
				sh.milli, sh.mem = WholeMilli, n.memCap[d]
				s.Exclusive |= 1 << d
			}
			s.MilliFree[d] -= sh.milli
			s.MemFree[d] -= sh.mem
			s.Used |= 1 << d
			p.shares[p.numShares] = sh
			p.numShares++
		}
		p.numContainers++
	}
	if s.cpuTracked {
		s.Host.CPUMilli -= r.Host.CPUMilli
	}
	if s.memTracked {
		s.Host.MemoryMiB -= r.Host.MemoryMiB
	}
	sc := max(-MaxPolicyScore, min(pol.ScoreNode(n, before, s, r), MaxPolicyScore))
	p.score = sc<<tieBreakBits | int64(n.tieBreak)
	p.ok = true
	return nil
}

func (e *Engine) policyFor(r *Request) Policy {
	switch r.Placement {
	case types.PlacementBinpack:
		return e.binpack
	case types.PlacementSpread:
		return e.spread
	}
	return e.policy
}

// candidates is the mask of devices that could serve one device of c now.
func candidates(n *Node, s *State, c *Container) uint64 {
	m := n.Allocatable() &^ s.Exclusive & n.ServedAs(c.resource)
	if c.Exclusive {
		m &^= s.Used
	}
	if c.Enforced {
		m &= n.enforced
	}
	selective := len(c.includeModels)+len(c.excludeModels)+len(c.includeUUIDs)+len(c.excludeUUIDs) > 0
	for rest := m; rest != 0; rest &= rest - 1 {
		d := trailing(rest)
		if !c.Exclusive && (s.MilliFree[d] < c.Milli || s.MemFree[d] < c.MemoryMiB) {
			m &^= 1 << d
			continue
		}
		if selective && !c.admits(n, d) {
			m &^= 1 << d
		}
	}
	return m
}

// explain says why fewer than c.Count devices could serve c.
func (e *Engine) explain(n *Node, s *State, c *Container, cand uint64) error {
	if n.ServedAs(c.resource) == 0 {
		return notFit(ReasonResource, "container %q: asks for %s, and the node has none (its GPUs: %s)", c.Name, c.resource, nodeResources{n})
	}
	healthy := n.Allocatable() & n.ServedAs(c.resource)
	var selected int
	for m := healthy; m != 0; m &= m - 1 {
		if c.admits(n, trailing(m)) {
			selected++
		}
	}
	switch {
	case healthy == 0:
		return notFit(ReasonUnhealthy, "container %q: no healthy devices", c.Name)
	case popcount(healthy) < c.Count:
		return notFit(ReasonUnhealthy, "container %q: %d healthy devices, %d needed", c.Name, popcount(healthy), c.Count)
	case selected < c.Count:
		return notFit(ReasonSelectors, "container %q: %d of %d healthy devices match the pod's model/UUID selectors, %d needed (the node's models: %s)",
			c.Name, selected, popcount(healthy), c.Count, nodeModels{n})
	case c.Enforced && popcount(healthy&n.enforced) < c.Count:
		return notFit(ReasonUnenforced, "container %q: %d of %d healthy devices can enforce a slice's memory and compute limits, %d needed (enforcement %s)",
			c.Name, popcount(healthy&n.enforced), popcount(healthy), c.Count, types.EnforcementRequired)
	default:
		if c.Exclusive {
			return notFit(ReasonNotEnoughFree, "container %q: %d whole devices free, %d needed", c.Name, popcount(cand), c.Count)
		}
		return notFit(ReasonNotEnoughFree, "container %q: %d devices with %s compute and %d MiB free, %d needed", c.Name, popcount(cand), percentArg(c.Milli), c.MemoryMiB, c.Count)
	}
}

// Reasons a pod does not fit on a node, short and constant so that a
// scheduler can count nodes by reason ("3 node(s): not enough free GPUs").
const (
	ReasonHostResources = "not enough host CPU or memory"
	ReasonTopology      = "no set of free GPUs joined by NVLink or NVSwitch (topology required)"
	ReasonTooManyShares = "too many device shares for one pod"
	ReasonUnhealthy     = "node has too few healthy GPUs"
	ReasonSelectors     = "not enough GPUs match the pod's model/UUID selectors"
	ReasonNotEnoughFree = "not enough free GPUs"
	ReasonUnenforced    = "node cannot enforce GPU slices (enforcement Required)"
	ReasonResource      = "node has no GPUs of the resource asked for"
)

// NotFitError says why a pod does not fit on a node: Reason is one of the
// Reason constants, and Error adds the details (which container, how many
// devices are free). It wraps ErrDoesNotFit. The details are formatted only
// when Error is called, so that rejecting many nodes stays cheap.
type NotFitError struct {
	Reason string
	format string
	args   []any
}

// Error returns "does not fit: " and the details.
func (e *NotFitError) Error() string {
	return ErrDoesNotFit.Error() + ": " + fmt.Sprintf(e.format, e.args...)
}

// Detail is the error's text without the "does not fit" prefix.
func (e *NotFitError) Detail() string { return fmt.Sprintf(e.format, e.args...) }

// Unwrap returns ErrDoesNotFit.
func (e *NotFitError) Unwrap() error { return ErrDoesNotFit }

func notFit(reason, format string, args ...any) error {
	return &NotFitError{Reason: reason, format: format, args: args}
}

// trailing is the index of the lowest set bit.
func trailing(m uint64) int { return bits.TrailingZeros64(m) }
