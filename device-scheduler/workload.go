package devicescheduler

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kubegpu/kubegpu/types"
)

// TaskType is one kind of request in a workload mix: a container asking for
// Count devices, each whole or a slice of Milli compute and MemoryMiB memory,
// with host resources and a selector. A type with Count 0 uses no devices
// (a CPU-only pod): every idle device share is unusable to it.
type TaskType struct {
	Count     int
	Exclusive bool
	Milli     int32
	MemoryMiB int64
	Host      Host
	Selector  types.Selector
	// Weight is the type's share of the mix; weights are normalised by
	// NewWorkload.
	Weight float64
}

// Workload is a workload mix: the task types the kubegpu policy keeps
// capacity usable for, with their popularity. It is immutable.
type Workload struct {
	id    uint64
	types []TaskType
	ctrs  []Container // each type as a container, for selector checks
	// cpuPerMilli and memPerMilli are the mix's host CPU (milli) and memory
	// (MiB) per thousandth of a device it asks for: what an idle device
	// share needs beside it to be used. Pods without devices count too, as
	// they take host resources on device nodes.
	cpuPerMilli, memPerMilli float64
}

var workloadIDs atomic.Uint64

// NewWorkload normalises the types' weights and builds a Workload. Types
// with zero weight are dropped.
func NewWorkload(tts []TaskType) (*Workload, error) {
	if len(tts) > maxAggTypes {
		return nil, fmt.Errorf("a workload has at most %d task types, got %d", maxAggTypes, len(tts))
	}
	var sum float64
	for _, t := range tts {
		if t.Weight < 0 || math.IsNaN(t.Weight) || math.IsInf(t.Weight, 0) {
			return nil, fmt.Errorf("task type weight must be a finite number >= 0, got %v", t.Weight)
		}
		if t.MemoryMiB < 0 {
			return nil, fmt.Errorf("task type memory must not be negative, got %d", t.MemoryMiB)
		}
		if t.Host.CPUMilli < 0 || t.Host.MemoryMiB < 0 {
			return nil, fmt.Errorf("task type host resources must not be negative, got %d m CPU and %d MiB", t.Host.CPUMilli, t.Host.MemoryMiB)
		}
		if t.Count < 0 || t.Count > MaxDevices {
			return nil, fmt.Errorf("task type count must be 0..%d, got %d", MaxDevices, t.Count)
		}
		if !t.Exclusive && (t.Milli < 0 || t.Milli > WholeMilli) {
			return nil, fmt.Errorf("task type share must be 0..%d‰, got %d", WholeMilli, t.Milli)
		}
		sum += t.Weight
	}
	w := &Workload{id: workloadIDs.Add(1)}
	for _, t := range tts {
		if t.Weight == 0 {
			continue
		}
		t.Weight /= sum
		if t.Exclusive {
			t.Milli = WholeMilli
		}
		if t.Count == 0 {
			t.Milli = WholeMilli + 1 // no device serves it
		}
		c := Container{Count: t.Count, Exclusive: t.Exclusive, Milli: t.Milli, MemoryMiB: t.MemoryMiB}
		c.SetSelector(t.Selector)
		w.types = append(w.types, t)
		w.ctrs = append(w.ctrs, c)
	}
	var cpu, mem, milli float64
	for _, t := range w.types {
		// A pod without a CPU request counts 100m, as kube-scheduler's
		// scores count it.
		cpu += t.Weight * float64(max(t.Host.CPUMilli, 100))
		mem += t.Weight * float64(t.Host.MemoryMiB)
		if t.Count > 0 {
			milli += t.Weight * float64(t.Count) * float64(min(t.Milli, WholeMilli))
		}
	}
	if milli > 0 {
		w.cpuPerMilli = cpu / milli
		w.memPerMilli = mem / milli
	}
	return w, nil
}

// Types returns the workload's task types with normalised weights.
func (w *Workload) Types() []TaskType { return slices.Clone(w.types) }

// compatCache holds, for one workload, the devices of a node each task type
// may use by its selector.
type compatCache struct {
	workload *Workload
	masks    []uint64
}

// compatFor returns node n's selector masks for workload w, computing them
// once per workload.
func (n *Node) compatFor(w *Workload) []uint64 {
	if c := n.compat.Load(); c != nil && c.workload == w {
		return c.masks
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if c := n.compat.Load(); c != nil && c.workload == w {
		return c.masks
	}
	masks := make([]uint64, len(w.types))
	for t := range w.types {
		for m := n.Allocatable(); m != 0; m &= m - 1 {
			if d := trailing(m); w.ctrs[t].admits(n, d) {
				masks[t] |= 1 << d
			}
		}
	}
	n.compat.Store(&compatCache{workload: w, masks: masks})
	return masks
}

// Observe adds a pod's request to the mix the engine learns. It does nothing
// when the engine was given a fixed Workload.
func (e *Engine) Observe(r *Request) {
	if e.learner == nil {
		return
	}
	e.learner.observe(r, &e.workload)
}

// Workload returns the mix the kubegpu policy currently works for.
func (e *Engine) Workload() *Workload { return e.workload.Load() }

// workloadLearner counts the task types seen and publishes a new Workload
// when the mix has changed enough to matter.
type workloadLearner struct {
	mu       sync.Mutex
	counts   map[string]*learnedType
	seen     int
	lastSeen int
}

// maxLearnedTypes bounds the learned mix to its most popular types, so that
// scoring stays cheap; learnedCoverage is the share of the pods seen that
// the published types must cover.
const (
	maxLearnedTypes = 64
	learnedCoverage = 0.95
)

func newWorkloadLearner() *workloadLearner {
	return &workloadLearner{counts: map[string]*learnedType{}}
}

// learnedType is a task type seen, its Weight the pods counted, and the
// host CPU and memory they asked for in all.
type learnedType struct {
	TaskType
	cpuMilli, memoryMiB float64
}

// noDevicesKey keys the one learned type of the pods without devices.
const noDevicesKey = "none"

// observe counts r and, when the mix has changed enough, publishes a new
// Workload to dst while still holding the lock, so that publications never
// go out of order.
func (l *workloadLearner) observe(r *Request, dst *atomic.Pointer[Workload]) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Device types are keyed, as FGD's typical pods are, by CPU, device
	// count, share and selector; a pod with several device containers
	// shares its host request among them. Pods without devices are one
	// type: every idle device share is unusable to them whatever they ask,
	// so only their mean CPU and memory matter (to the host term).
	add := func(key string, t TaskType, host Host) {
		c, ok := l.counts[key]
		if !ok {
			c = &learnedType{TaskType: t}
			l.counts[key] = c
		}
		c.Weight++
		c.cpuMilli += float64(host.CPUMilli)
		c.memoryMiB += float64(host.MemoryMiB)
	}
	if len(r.Containers) == 0 {
		add(noDevicesKey, TaskType{}, r.Host)
	}
	k := int64(len(r.Containers))
	for i := range r.Containers {
		c := &r.Containers[i]
		host := Host{CPUMilli: r.Host.CPUMilli / k, MemoryMiB: r.Host.MemoryMiB / k}
		t := TaskType{Count: c.Count, Exclusive: c.Exclusive, Milli: c.Milli, MemoryMiB: c.MemoryMiB, Selector: c.Selector()}
		add(fmt.Sprintf("%d/%t/%d/%d/%d/%s", t.Count, t.Exclusive, t.Milli, t.MemoryMiB, host.CPUMilli, selectorKey(t.Selector)), t, host)
	}
	l.seen++
	// Publish often at first, then every 10% more observations.
	if l.seen-l.lastSeen < max(1, l.lastSeen/10) {
		return
	}
	l.lastSeen = l.seen
	dst.Store(l.snapshotLocked())
}

func (l *workloadLearner) snapshot() *Workload {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.snapshotLocked()
}

// snapshotLocked publishes the most popular device types that together make
// up learnedCoverage of the device containers seen (FGD's "typical pods"),
// at most maxLearnedTypes of them, and the type of the pods without devices.
// Cutting device types apart keeps them in the mix however many pods without
// devices there are.
func (l *workloadLearner) snapshotLocked() *Workload {
	var (
		devices []TaskType
		total   float64
		out     []TaskType
	)
	for key, c := range l.counts {
		t := c.TaskType
		t.Host = Host{CPUMilli: int64(c.cpuMilli / c.Weight), MemoryMiB: int64(c.memoryMiB / c.Weight)}
		if key == noDevicesKey {
			out = append(out, t)
			continue
		}
		devices = append(devices, t)
		total += t.Weight
	}
	byWeight := func(a, b TaskType) int {
		if a.Weight != b.Weight {
			if a.Weight > b.Weight {
				return -1
			}
			return 1
		}
		return strings.Compare(fmt.Sprint(a), fmt.Sprint(b))
	}
	slices.SortFunc(devices, byWeight)
	var covered float64
	for i, t := range devices {
		covered += t.Weight
		if covered >= learnedCoverage*total || i+1 == maxLearnedTypes {
			devices = devices[:i+1]
			break
		}
	}
	out = append(out, devices...)
	slices.SortFunc(out, byWeight)
	w, err := NewWorkload(out)
	if err != nil {
		panic(fmt.Sprintf("learned workload is invalid: %v", err)) // counts are positive: a bug
	}
	return w
}

func selectorKey(s types.Selector) string {
	return strings.Join(s.IncludeModels, "|") + ";" + strings.Join(s.ExcludeModels, "|") + ";" +
		strings.Join(s.IncludeUUIDs, "|") + ";" + strings.Join(s.ExcludeUUIDs, "|")
}
