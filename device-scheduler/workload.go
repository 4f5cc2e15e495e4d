package devicescheduler

import (
	"fmt"
	"math"
	"slices"
	"weak"

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
	// id numbers the workload among those its engine has used; 0 until
	// an engine uses it (see Engine.useWorkload).
	id uint64
	// self identifies the workload in the nodes' caches without keeping
	// it alive there.
	self  weak.Pointer[Workload]
	types []TaskType
	ctrs  []Container // each type as a container, for selector checks
	// cpuPerMilli and memPerMilli are the mix's host CPU (milli) and memory
	// (MiB) per thousandth of a device it asks for: what an idle device
	// share needs beside it to be used. Pods without devices count too, as
	// they take host resources on device nodes.
	cpuPerMilli, memPerMilli float64
}

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
	w := &Workload{}
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
	w.self = weak.Make(w)
	return w, nil
}

// ID numbers the workload among those its engine has used (Engine.Workload),
// from 1, so that a caller may key what it derives from the mix without
// keeping the mix alive. It is 0 for a workload no engine has used.
func (w *Workload) ID() uint64 { return w.id }

// Types returns the workload's task types with normalised weights.
func (w *Workload) Types() []TaskType { return slices.Clone(w.types) }

// compatCache holds, for one workload, the devices of a node each task type
// may use by its selector.
type compatCache struct {
	// workload is the workload the masks are for, held weakly: a node
	// keeps no old mix alive.
	workload weak.Pointer[Workload]
	masks    []uint64
}

// compatFor returns node n's selector masks for workload w, computing them
// once per workload.
func (n *Node) compatFor(w *Workload) []uint64 {
	if c := n.compat.Load(); c != nil && c.workload == w.self {
		return c.masks
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if c := n.compat.Load(); c != nil && c.workload == w.self {
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
	n.compat.Store(&compatCache{workload: w.self, masks: masks})
	return masks
}
