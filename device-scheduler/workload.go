package devicescheduler

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/fnv"
	"hash/maphash"
	"io"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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

// ID identifies the workload among those of this process.
func (w *Workload) ID() uint64 { return w.id }

// Types returns the workload's task types with normalised weights.
func (w *Workload) Types() []TaskType { return slices.Clone(w.types) }

// compatCache holds, for one workload, the devices of a node each task type
// may use by its selector.
type compatCache struct {
	// workload is the ID of the workload the masks are for: not the
	// workload itself, which a node would otherwise keep alive.
	workload uint64
	masks    []uint64
}

// compatFor returns node n's selector masks for workload w, computing them
// once per workload.
func (n *Node) compatFor(w *Workload) []uint64 {
	if c := n.compat.Load(); c != nil && c.workload == w.id {
		return c.masks
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if c := n.compat.Load(); c != nil && c.workload == w.id {
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
	n.compat.Store(&compatCache{workload: w.id, masks: masks})
	return masks
}

// Observe adds a request to the mix the engine learns, as a pod that never
// goes and never ages (the placement simulator's pods). It does nothing
// when the engine was given a fixed Workload.
func (e *Engine) Observe(r *Request) {
	if e.learner != nil {
		e.learner.observe("", r, time.Time{}, &e.workload)
	}
}

// ObservePod adds pod id's request to the learned mix, weighed by its age
// at (its creation): see LearnConfig. A pod already observed is not counted
// again, so that every way a scheduler learns of a pod may call it.
func (e *Engine) ObservePod(id string, r *Request, at time.Time) {
	if e.learner != nil && id != "" {
		e.learner.observe(id, r, at, &e.workload)
	}
}

// ForgetPod removes what ObservePod added for pod id, if anything.
func (e *Engine) ForgetPod(id string) {
	if e.learner != nil {
		e.learner.forget(id, &e.workload)
	}
}

// HasPod reports whether the learned mix holds pod id.
func (e *Engine) HasPod(id string) bool {
	if e.learner == nil {
		return false
	}
	e.learner.mu.Lock()
	defer e.learner.mu.Unlock()
	_, ok := e.learner.pods[id]
	return ok
}

// LearnedPods is the number of pods the learned mix holds.
func (e *Engine) LearnedPods() int {
	if e.learner == nil {
		return 0
	}
	e.learner.mu.Lock()
	defer e.learner.mu.Unlock()
	return len(e.learner.pods)
}

// Workload returns the mix the kubegpu policy currently works for.
func (e *Engine) Workload() *Workload { return e.workload.Load() }

// LearnConfig bounds and ages the workload mix an engine learns.
type LearnConfig struct {
	// HalfLife is the age at which a pod weighs half as much as a pod
	// created now (default DefaultHalfLife; negative: pods never age).
	// Pods weigh by when they were created, so that a mix learned over
	// time and one rebuilt at once from the same pods agree.
	HalfLife time.Duration
	// MaxTypes bounds the task types tracked (default DefaultMaxTypes).
	// Beyond it the least weighty type's weight moves to an "other"
	// bucket, which counts in the mix's total but is no type.
	MaxTypes int
}

// Defaults and bounds of LearnConfig.
const (
	DefaultHalfLife = 24 * time.Hour
	MaxHalfLife     = 365 * 24 * time.Hour
	DefaultMaxTypes = 512
	MaxMaxTypes     = 4096
)

func (c LearnConfig) withDefaults() (LearnConfig, error) {
	if c.HalfLife == 0 {
		c.HalfLife = DefaultHalfLife
	}
	if c.HalfLife > MaxHalfLife {
		return c, fmt.Errorf("learned mix: halfLife must be at most %s, got %s", MaxHalfLife, c.HalfLife)
	}
	switch {
	case c.MaxTypes == 0:
		c.MaxTypes = DefaultMaxTypes
	case c.MaxTypes < maxLearnedTypes || c.MaxTypes > MaxMaxTypes:
		return c, fmt.Errorf("learned mix: maxTypes must be %d..%d, got %d", maxLearnedTypes, MaxMaxTypes, c.MaxTypes)
	}
	return c, nil
}

// workloadLearner weighs the task types of the pods observed and publishes
// a new Workload when the mix, quantised, has changed.
//
// Its memory is bounded: at most MaxTypes types, each keyed by a fixed-size
// hash and holding one copy of its selector, plus a few words per pod
// observed, released by forget. Weights are kept scaled by 2^((t0-now)/H),
// the same factor for every type, so that ageing costs nothing: a pod
// created at t adds 2^((t-t0)/H).
type workloadLearner struct {
	mu    sync.Mutex
	cfg   LearnConfig
	seeds [2]maphash.Seed
	// t0 is the reference time of the scaled weights; set by the first
	// observation.
	t0    time.Time
	types map[shapeKey]*learnedType
	// other is the weight of the types not tracked.
	other float64
	pods  map[string][]contribution
	// published is what the current Workload was built from.
	published []publishedType
}

// shapeKey identifies a task type: a hash of its count, share, host
// request and selector.
type shapeKey [2]uint64

// learnedType is a task type seen, its Weight the scaled weight of the
// pods counted, and the host CPU and memory they asked for, weighed alike.
type learnedType struct {
	TaskType
	cpuMilli, memoryMiB float64
	// pods counts the contributions the type holds: it goes when they do.
	pods int
	// order breaks ties between types of equal weight, the same in every
	// process: an unseeded hash of the type.
	order uint64
}

// contribution is what one container of a pod added: to type lt, or to the
// other bucket if lt is nil or no longer tracked.
type contribution struct {
	key           shapeKey
	lt            *learnedType
	weight        float64
	cpuMilli, mib float64
}

// publishedType is one type of a published mix, quantised.
type publishedType struct {
	key    shapeKey
	weight int64
	host   Host
}

// maxLearnedTypes bounds the published mix to its most weighty types, so
// that scoring stays cheap; learnedCoverage is the share of the weight that
// the published types must cover; weightQuantum is the resolution of the
// published weights (a share of the total), so that the mix is republished
// only when it has changed by that much, and so that two learners holding
// the same pods publish the same mix whatever order they saw them in.
const (
	maxLearnedTypes = 64
	learnedCoverage = 0.95
	weightQuantum   = 1.0 / 1024
	// rescaleAfter is how many half-lives t0 may trail an observation
	// before every weight is scaled down (2^64 is far from overflow).
	rescaleAfter = 64
)

func newWorkloadLearner(cfg LearnConfig) (*workloadLearner, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &workloadLearner{
		cfg: cfg, seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		types: map[shapeKey]*learnedType{}, pods: map[string][]contribution{},
	}, nil
}

// scale is the scaled weight of a pod created at t.
func (l *workloadLearner) scale(t time.Time) float64 {
	if l.cfg.HalfLife < 0 || t.IsZero() || l.t0.IsZero() {
		return 1
	}
	return math.Exp2(float64(t.Sub(l.t0)) / float64(l.cfg.HalfLife))
}

// rescale moves t0 to t when t0 trails it by rescaleAfter half-lives.
func (l *workloadLearner) rescale(t time.Time) {
	if l.cfg.HalfLife < 0 || t.IsZero() {
		return
	}
	if l.t0.IsZero() {
		l.t0 = t
		return
	}
	if t.Sub(l.t0) < rescaleAfter*l.cfg.HalfLife {
		return
	}
	f := 1 / l.scale(t)
	for _, c := range l.types {
		c.Weight *= f
		c.cpuMilli *= f
		c.memoryMiB *= f
	}
	l.other *= f
	for _, cs := range l.pods {
		for i := range cs {
			cs[i].weight *= f
			cs[i].cpuMilli *= f
			cs[i].mib *= f
		}
	}
	l.t0 = t
}

// key hashes a task type. The hash is seeded per learner: nobody can make
// two types collide on purpose.
func (l *workloadLearner) key(t *TaskType) shapeKey {
	var out shapeKey
	for i := range out {
		var h maphash.Hash
		h.SetSeed(l.seeds[i])
		hashType(&h, t)
		out[i] = h.Sum64()
	}
	return out
}

// hashType writes what identifies a task type to h, each field's length
// first so that no two types write the same bytes.
func hashType(h hash.Hash64, t *TaskType) {
	var b [8]byte
	num := func(n int64) {
		binary.LittleEndian.PutUint64(b[:], uint64(n))
		h.Write(b[:])
	}
	for _, n := range []int64{int64(t.Count), int64(t.Milli), t.MemoryMiB, t.Host.CPUMilli} {
		num(n)
	}
	if t.Exclusive {
		num(1)
	} else {
		num(0)
	}
	for _, list := range [][]string{t.Selector.IncludeModels, t.Selector.ExcludeModels, t.Selector.IncludeUUIDs, t.Selector.ExcludeUUIDs} {
		num(int64(len(list)))
		for _, s := range list {
			num(int64(len(s)))
			_, _ = io.WriteString(h, s) // a hash never fails to write
		}
	}
}

// observe counts r for pod id ("": anonymous, never forgotten) and
// publishes the mix to dst if it changed, while still holding the lock, so
// that publications never go out of order.
func (l *workloadLearner) observe(id string, r *Request, at time.Time, dst *atomic.Pointer[Workload]) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if id != "" {
		if _, ok := l.pods[id]; ok {
			return
		}
	}
	l.rescale(at)
	w := l.scale(at)
	// Device types are keyed, as FGD's typical pods are, by CPU, device
	// count, share and selector; a pod with several device containers
	// shares its host request among them. Pods without devices are one
	// type: every idle device share is unusable to them whatever they ask,
	// so only their mean CPU and memory matter (to the host term).
	var cs []contribution
	add := func(key shapeKey, t TaskType, host Host) {
		c := contribution{key: key, weight: w, cpuMilli: w * float64(host.CPUMilli), mib: w * float64(host.MemoryMiB)}
		c.lt = l.add(c, t)
		cs = append(cs, c)
	}
	if len(r.Containers) == 0 {
		add(shapeKey{}, TaskType{}, r.Host)
	}
	k := int64(len(r.Containers))
	for i := range r.Containers {
		c := &r.Containers[i]
		host := Host{CPUMilli: r.Host.CPUMilli / k, MemoryMiB: r.Host.MemoryMiB / k}
		t := TaskType{Count: c.Count, Exclusive: c.Exclusive, Milli: c.Milli, MemoryMiB: c.MemoryMiB, Selector: c.Selector(), Host: Host{CPUMilli: host.CPUMilli}}
		add(l.key(&t), t, host)
	}
	if id != "" {
		l.pods[id] = cs
	}
	l.publishLocked(dst)
}

// add counts c in its type, making room for it if the table is full, and
// returns the type; nil if c went to the other bucket.
func (l *workloadLearner) add(c contribution, t TaskType) *learnedType {
	lt, ok := l.types[c.key]
	if !ok {
		if len(l.types) >= l.cfg.MaxTypes {
			// Full: the lightest type makes room if it weighs less than
			// c, otherwise c goes to the other bucket. Either way the
			// weight stays in the total; the contributions of a type
			// that left are taken from the other bucket when their pods
			// go (see forget).
			var minKey shapeKey
			minWeight := math.Inf(1)
			for k, x := range l.types {
				if k != (shapeKey{}) && x.Weight < minWeight {
					minKey, minWeight = k, x.Weight
				}
			}
			if minWeight >= c.weight {
				l.other += c.weight
				return nil
			}
			l.other += minWeight
			delete(l.types, minKey)
		}
		t.Weight = 0
		h := fnv.New64a()
		hashType(h, &t)
		lt = &learnedType{TaskType: t, order: h.Sum64()}
		l.types[c.key] = lt
	}
	lt.Weight += c.weight
	lt.cpuMilli += c.cpuMilli
	lt.memoryMiB += c.mib
	lt.pods++
	return lt
}

// forget removes what pod id added, and publishes the mix to dst if it
// changed.
func (l *workloadLearner) forget(id string, dst *atomic.Pointer[Workload]) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cs, ok := l.pods[id]
	if !ok {
		return
	}
	delete(l.pods, id)
	for _, c := range cs {
		lt := l.types[c.key]
		if c.lt == nil || lt != c.lt {
			// Counted in the other bucket, or in a type that has left
			// the table since.
			l.other = max(0, l.other-c.weight)
			continue
		}
		lt.pods--
		if lt.pods == 0 {
			delete(l.types, c.key)
			continue
		}
		lt.Weight = max(0, lt.Weight-c.weight)
		lt.cpuMilli = max(0, lt.cpuMilli-c.cpuMilli)
		lt.memoryMiB = max(0, lt.memoryMiB-c.mib)
	}
	if len(l.pods) == 0 && len(l.types) == 0 {
		// Nothing left: start afresh, without the other bucket's rounding
		// crumbs, from the next pod's time.
		l.other, l.t0 = 0, time.Time{}
	}
	l.publishLocked(dst)
}

func (l *workloadLearner) snapshot() *Workload {
	l.mu.Lock()
	defer l.mu.Unlock()
	tts, _ := l.mix()
	return newLearnedWorkload(tts)
}

// publishLocked stores a new Workload in dst if the quantised mix differs
// from the one published last.
func (l *workloadLearner) publishLocked(dst *atomic.Pointer[Workload]) {
	tts, pub := l.mix()
	if dst.Load() != nil && slices.Equal(pub, l.published) {
		return
	}
	l.published = pub
	dst.Store(newLearnedWorkload(tts))
}

func newLearnedWorkload(tts []TaskType) *Workload {
	w, err := NewWorkload(tts)
	if err != nil {
		panic(fmt.Sprintf("learned workload is invalid: %v", err)) // weights are positive: a bug
	}
	return w
}

// mix makes the mix from the types tracked: the weightiest device types
// that together cover learnedCoverage of the weight of all device types
// (FGD's "typical pods"; the other bucket counts as device types), at most
// maxLearnedTypes of them, and the type of the pods without devices.
// Weights are quantised to weightQuantum of the total and host requests to
// about 1%, so that equal pods give an equal mix.
func (l *workloadLearner) mix() ([]TaskType, []publishedType) {
	total := l.other
	for _, c := range l.types {
		total += c.Weight
	}
	if !(total > 0) {
		return nil, nil
	}
	type entry struct {
		t     TaskType
		pub   publishedType
		order uint64
	}
	var devices []entry
	var none *entry
	var deviceWeight int64
	for k, c := range l.types {
		q := int64(math.Round(c.Weight / total / weightQuantum))
		if q <= 0 || c.Weight <= 0 {
			continue
		}
		t := c.TaskType
		t.Host = Host{CPUMilli: roundHost(c.cpuMilli / c.Weight), MemoryMiB: roundHost(c.memoryMiB / c.Weight)}
		t.Weight = float64(q)
		e := entry{t: t, pub: publishedType{key: k, weight: q, host: t.Host}, order: c.order}
		if k == (shapeKey{}) {
			none = &e
			continue
		}
		devices = append(devices, e)
		deviceWeight += q
	}
	deviceWeight += int64(math.Round(l.other / total / weightQuantum))
	slices.SortFunc(devices, func(a, b entry) int {
		if a.pub.weight != b.pub.weight {
			return cmp.Compare(b.pub.weight, a.pub.weight)
		}
		if a.order != b.order {
			return cmp.Compare(a.order, b.order)
		}
		return compareTypes(&a.t, &b.t)
	})
	var covered int64
	for i, e := range devices {
		covered += e.pub.weight
		if float64(covered) >= learnedCoverage*float64(deviceWeight) || i+1 == maxLearnedTypes {
			devices = devices[:i+1]
			break
		}
	}
	if none != nil {
		devices = append(devices, *none)
	}
	tts := make([]TaskType, len(devices))
	pub := make([]publishedType, len(devices))
	for i, e := range devices {
		tts[i], pub[i] = e.t, e.pub
	}
	return tts, pub
}

// roundHost rounds a mean host request to 7 significant bits (within 1%).
func roundHost(x float64) int64 {
	n := int64(math.Round(x))
	if n <= 0 {
		return 0
	}
	shift := max(0, bits.Len64(uint64(n))-7)
	return (n >> shift) << shift
}

// compareTypes orders task types of equal weight, so that the published
// mix does not depend on the order of a map.
func compareTypes(a, b *TaskType) int {
	if c := cmp.Compare(a.Count, b.Count); c != 0 {
		return c
	}
	if a.Exclusive != b.Exclusive {
		if a.Exclusive {
			return -1
		}
		return 1
	}
	if c := cmp.Compare(a.Milli, b.Milli); c != 0 {
		return c
	}
	if c := cmp.Compare(a.MemoryMiB, b.MemoryMiB); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Host.CPUMilli, b.Host.CPUMilli); c != 0 {
		return c
	}
	for _, pair := range [][2][]string{
		{a.Selector.IncludeModels, b.Selector.IncludeModels}, {a.Selector.ExcludeModels, b.Selector.ExcludeModels},
		{a.Selector.IncludeUUIDs, b.Selector.IncludeUUIDs}, {a.Selector.ExcludeUUIDs, b.Selector.ExcludeUUIDs},
	} {
		if c := slices.Compare(pair[0], pair[1]); c != 0 {
			return c
		}
	}
	return 0
}
