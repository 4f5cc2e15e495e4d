package devicescheduler

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/kubegpu/kubegpu/types"
)

// MaxDevices is the most schedulable devices one node may have.
const MaxDevices = 64

// WholeMilli is a whole device's compute share.
const WholeMilli = 1000

// Host is a node's host resources (CPU and memory), or a pod's request of
// them. Zero capacity means "not tracked": host resources then never limit
// fit (in Kubernetes the stock NodeResourcesFit plugin checks them).
type Host struct {
	CPUMilli  int64
	MemoryMiB int64
}

// Node is one node's devices compiled for fast evaluation, with the state of
// what its pods hold. Build it with Engine.NewNode.
type Node struct {
	name string
	inv  types.Inventory

	n        int
	ids      []string
	uuids    []string // lower-case
	models   []string // lower-case
	memCap   [MaxDevices]int64
	vendor   [MaxDevices]types.SchedulerPlugin
	healthy  uint64 // mask of healthy, allocatable devices
	parents  uint64 // mask of GPUs in MIG mode: allocated only through their slices
	enforced uint64 // mask of devices with a SliceEnforcer
	// served is the mask of the devices served as each device resource
	// (Device.ServedAs); one entry on most nodes.
	served   []servedMask
	parentOf [MaxDevices]int8
	// weight[i*n+j] is the link weight between devices i and j.
	weight []uint8
	// fastAdj[i] is the mask of devices joined to i by a GPU fabric:
	// NVLink, NVSwitch, or XGMI within a hive.
	fastAdj [MaxDevices]uint64
	host    Host
	// tieBreak is the node's stable preference among equal scores.
	tieBreak uint32

	state State
	pods  map[string]podUsage

	compat atomic.Pointer[compatCache]
	mu     sync.Mutex // guards compat computation and fragCache
	// version counts changes of state, keying fragCache.
	version uint64
	// fragCache is the node's fragmentation in its current state, with the
	// host resources it tracks or those an EvaluateHost caller gave.
	fragCache struct {
		workload               weak.Pointer[Workload] // held weakly: a node keeps no old mix alive
		version                uint64
		host                   Host
		cpuTracked, memTracked bool
		value                  float64
	}
}

// servedMask is the mask of a node's devices served as one resource.
type servedMask struct {
	resource string
	mask     uint64
}

// ServedAs is the mask of the node's devices served as the device
// resource r (types.DeviceResources); every device for r empty.
func (n *Node) ServedAs(r string) uint64 {
	if r == "" {
		return 1<<n.n - 1
	}
	for _, s := range n.served {
		if s.resource == r {
			return s.mask
		}
	}
	return 0
}

// State is what is free on a node. Policies read it; only the engine writes it.
type State struct {
	// MilliFree and MemFree are each device's free compute share and memory.
	MilliFree [MaxDevices]int32
	MemFree   [MaxDevices]int64
	// Exclusive is the mask of devices taken whole.
	Exclusive uint64
	// Used is the mask of devices with any share taken.
	Used uint64
	// Host is the free host resources (when tracked).
	Host Host
	// cpuTracked and memTracked say whether Host's CPU and memory are
	// tracked: by the node (NewNode's host) or for one evaluation
	// (EvaluateHost).
	cpuTracked, memTracked bool
	// hostView marks the node's current state with the host resources an
	// EvaluateHost caller gave, so that policies may cache what they derive
	// from it.
	hostView bool
}

type podUsage struct {
	shares []share
	host   Host
}

type share struct {
	dev       int
	milli     int32
	mem       int64
	exclusive bool
}

// NewNode compiles a node's inventory. host is the node's allocatable CPU
// and memory, or zero to leave them to the caller.
func (e *Engine) NewNode(name string, inv types.Inventory, host Host) (*Node, error) {
	if err := inv.Validate(); err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	if len(inv.Devices) > MaxDevices {
		return nil, fmt.Errorf("node %s: %d devices, at most %d are supported", name, len(inv.Devices), MaxDevices)
	}
	n := len(inv.Devices)
	nd := &Node{
		name: name, inv: inv, n: n, host: host,
		ids: make([]string, n), uuids: make([]string, n), models: make([]string, n),
		weight: make([]uint8, n*n),
		pods:   map[string]podUsage{},
	}
	nd.tieBreak = tieBreak(name, e.tieBreakSeed)
	pos := make(map[string]int, n)
	for i, d := range inv.Devices {
		pos[d.ID] = i
		nd.ids[i], nd.uuids[i], nd.models[i] = d.ID, strings.ToLower(d.UUID), strings.ToLower(d.Model)
		nd.memCap[i] = d.MemoryMiB
		nd.addServed(d.ServedAs(), i)
		nd.parentOf[i] = -1
		nd.vendor[i] = e.vendors[d.Vendor]
		if d.Health == types.Healthy && nd.vendor[i] != nil {
			nd.healthy |= 1 << i
		}
		if d.SliceEnforcer != "" {
			nd.enforced |= 1 << i
		}
		nd.state.MilliFree[i] = WholeMilli
		nd.state.MemFree[i] = d.MemoryMiB
	}
	for i, d := range inv.Devices {
		if d.Parent != "" {
			p := pos[d.Parent]
			nd.parentOf[i] = int8(p)
			nd.parents |= 1 << p
		}
	}
	nd.state.Host = host
	nd.state.cpuTracked, nd.state.memTracked = host.CPUMilli > 0, host.MemoryMiB > 0
	m := inv.LinkMatrix()
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			if i == j || nd.vendor[i] == nil {
				continue
			}
			w := nd.vendor[i].LinkWeight(m[i][j])
			nd.weight[i*n+j] = uint8(max(0, min(w, types.MaxLinkWeight)))
			if k := m[i][j].Kind; k == types.LinkNVLink || k == types.LinkNVSwitch || k == types.LinkXGMI {
				nd.fastAdj[i] |= 1 << j
			}
		}
	}
	return nd, nil
}

func (n *Node) addServed(r string, d int) {
	for i := range n.served {
		if n.served[i].resource == r {
			n.served[i].mask |= 1 << d
			return
		}
	}
	n.served = append(n.served, servedMask{resource: r, mask: 1 << d})
}

// Name is the node's name.
func (n *Node) Name() string { return n.name }

// SetPreference overrides the node's place in the order that breaks ties
// between equal policy scores (higher is preferred; only the low 24 bits
// count). By default the order is a seeded hash of the node names.
func (n *Node) SetPreference(p uint32) { n.tieBreak = p & (1<<tieBreakBits - 1) }

// Inventory is the inventory the node was built from.
func (n *Node) Inventory() types.Inventory { return n.inv }

// State returns a copy of what is free on the node.
func (n *Node) State() State { return n.state }

// NumDevices is the number of devices on the node.
func (n *Node) NumDevices() int { return n.n }

// MemoryMiB is device d's memory.
func (n *Node) MemoryMiB(d int) int64 { return n.memCap[d] }

// HostCapacity is the node's host resources as given to NewNode.
func (n *Node) HostCapacity() Host { return n.host }

// Weight is the link weight between devices i and j.
func (n *Node) Weight(i, j int) int { return int(n.weight[i*n.n+j]) }

// Allocatable is the mask of devices that can be given out at all: healthy,
// rated by a loaded plugin, and not a GPU in MIG mode.
func (n *Node) Allocatable() uint64 { return n.healthy &^ n.parents }

// Version changes whenever the node's state changes (an Assume or a
// Release), so that a caller may reuse an Evaluate result for the same
// request, version and Workload.
func (n *Node) Version() uint64 { return n.version }

// Pods is the number of pods assumed on the node.
func (n *Node) Pods() int { return len(n.pods) }

// ErrConflict is wrapped by Assume errors for allocations that do not fit the
// node's current state (a device given twice, or a device the node lacks).
var ErrConflict = errors.New("allocation conflicts with the node's state")

// Assume records that pod key holds alloc (and host resources) on this node.
// Assuming the same key again replaces its previous allocation. An
// allocation that names unknown devices or over-commits one is refused
// whole, leaving the state unchanged.
func (n *Node) Assume(key string, alloc types.PodAllocation, host Host) error {
	var shares []share
	for _, list := range [][]types.ContainerAllocation{alloc.InitContainers, alloc.Containers} {
		for _, c := range list {
			for _, d := range c.Devices {
				i := n.index(d.ID)
				if i < 0 || !strings.EqualFold(n.uuids[i], d.UUID) {
					return fmt.Errorf("%w: pod %s: device %s (%s) is not on node %s", ErrConflict, key, d.ID, d.UUID, n.name)
				}
				if n.parents&(1<<i) != 0 {
					return fmt.Errorf("%w: pod %s: device %s is in MIG mode and is allocated only through its slices", ErrConflict, key, d.ID)
				}
				if !d.Exclusive && (d.ComputePercent < 0 || d.ComputePercent > types.MaxComputePercent || d.MemoryMiB < 0 ||
					(d.ComputePercent == 0 && d.MemoryMiB == 0)) {
					return fmt.Errorf("%w: pod %s: device %s has an invalid share (%d%%, %d MiB)", ErrConflict, key, d.ID, d.ComputePercent, d.MemoryMiB)
				}
				s := share{dev: i, milli: int32(d.ComputePercent) * 10, mem: d.MemoryMiB, exclusive: d.Exclusive}
				if d.Exclusive {
					s.milli, s.mem = WholeMilli, n.memCap[i]
				}
				shares = append(shares, s)
			}
		}
	}
	return n.assume(key, podUsage{shares: shares, host: host})
}

// AssumePlacement is Assume for a Placement this engine chose, without the
// round trip through types.PodAllocation.
func (n *Node) AssumePlacement(key string, p *Placement, host Host) error {
	if p.node != n || !p.ok {
		return fmt.Errorf("pod %s: no successful evaluation on node %s to assume", key, n.name)
	}
	u := podUsage{host: host, shares: append([]share(nil), p.shares[:p.numShares]...)}
	return n.assume(key, u)
}

func (n *Node) assume(key string, u podUsage) error {
	old, had := n.pods[key]
	if had {
		n.apply(old, -1)
	}
	next := n.state
	if err := applyTo(&next, n, u, 1); err != nil {
		if had {
			n.apply(old, 1)
		}
		return fmt.Errorf("pod %s on node %s: %w", key, n.name, err)
	}
	n.state = next
	n.pods[key] = u
	n.version++
	return nil
}

// Release forgets pod key's allocation; releasing an unknown key does nothing.
func (n *Node) Release(key string) {
	if u, ok := n.pods[key]; ok {
		n.apply(u, -1)
		delete(n.pods, key)
		n.version++
	}
}

// Clone returns a copy of the node whose state changes apart from n's: to
// ask what fits if some pods went (preemption) or others came (pods
// nominated to the node). The devices are shared; the caller must not
// change n while cloning.
func (n *Node) Clone() *Node {
	c := &Node{
		name: n.name, inv: n.inv, n: n.n, ids: n.ids, uuids: n.uuids, models: n.models,
		memCap: n.memCap, vendor: n.vendor, healthy: n.healthy, parents: n.parents, enforced: n.enforced, served: n.served, parentOf: n.parentOf,
		weight: n.weight, fastAdj: n.fastAdj, host: n.host, tieBreak: n.tieBreak,
		state: n.state, pods: make(map[string]podUsage, len(n.pods)), version: n.version,
	}
	for k, u := range n.pods {
		c.pods[k] = u // a podUsage's shares are never changed in place
	}
	c.compat.Store(n.compat.Load())
	return c
}

// Holds reports whether pod key is assumed on the node.
func (n *Node) Holds(key string) bool {
	_, ok := n.pods[key]
	return ok
}

func (n *Node) apply(u podUsage, sign int) {
	if err := applyTo(&n.state, n, u, sign); err != nil {
		panic(fmt.Sprintf("reverting a recorded allocation failed: %v", err)) // state corrupted: a bug
	}
}

// applyTo adds (sign 1) or removes (sign -1) a pod's usage to s, checking
// capacity when adding.
func applyTo(s *State, n *Node, u podUsage, sign int) error {
	for _, sh := range u.shares {
		d := sh.dev
		if sign > 0 {
			switch {
			case sh.exclusive && (s.Used&(1<<d) != 0):
				return fmt.Errorf("%w: device %s is in use and cannot be taken whole", ErrConflict, n.ids[d])
			case s.Exclusive&(1<<d) != 0:
				return fmt.Errorf("%w: device %s is taken whole", ErrConflict, n.ids[d])
			case s.MilliFree[d] < sh.milli || s.MemFree[d] < sh.mem:
				return fmt.Errorf("%w: device %s has %s compute and %d MiB free, %s and %d MiB asked", ErrConflict,
					n.ids[d], Percent(int(s.MilliFree[d])), s.MemFree[d], Percent(int(sh.milli)), sh.mem)
			}
		}
		s.MilliFree[d] -= int32(sign) * sh.milli
		s.MemFree[d] -= int64(sign) * sh.mem
		if sh.exclusive {
			s.Exclusive ^= 1 << d
		}
		if s.MilliFree[d] < WholeMilli || s.MemFree[d] < n.memCap[d] {
			s.Used |= 1 << d
		} else {
			s.Used &^= 1 << d
		}
	}
	if n.host.CPUMilli > 0 {
		s.Host.CPUMilli -= int64(sign) * u.host.CPUMilli
	}
	if n.host.MemoryMiB > 0 {
		s.Host.MemoryMiB -= int64(sign) * u.host.MemoryMiB
	}
	if sign > 0 && (s.Host.CPUMilli < 0 || s.Host.MemoryMiB < 0) {
		return fmt.Errorf("%w: host CPU or memory over-committed", ErrConflict)
	}
	return nil
}

func (n *Node) index(id string) int {
	for i, x := range n.ids {
		if x == id {
			return i
		}
	}
	return -1
}

// tieBreak hashes a node name (FNV-1a, seeded) into tieBreakBits bits.
func tieBreak(name string, seed uint64) uint32 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	h.Write(b[:])
	h.Write([]byte(name))
	return uint32(h.Sum64() >> (64 - tieBreakBits))
}

// popcount is the number of set bits.
func popcount(m uint64) int { return bits.OnesCount64(m) }

// DevicePods counts, for each device, the pods holding a share of it.
func (n *Node) DevicePods() [MaxDevices]int {
	var out [MaxDevices]int
	for _, u := range n.pods {
		var seen uint64
		for _, sh := range u.shares {
			if seen&(1<<sh.dev) == 0 {
				seen |= 1 << sh.dev
				out[sh.dev]++
			}
		}
	}
	return out
}
