package devicescheduler

import (
	"fmt"
	"hash/fnv"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"time"
)

// Observe adds a request to the mix the engine learns, as a pod that never
// goes and never ages (the placement simulator's pods). It does nothing
// when the engine was given a fixed Workload.
func (e *Engine) Observe(r *Request) {
	if e.learner != nil {
		e.learner.observe("", r, time.Time{}, e)
	}
}

// ObservePod adds pod id's request to the learned mix, weighed by its age
// at (its creation): see LearnConfig. A pod already observed is not counted
// again, so that every way a scheduler learns of a pod may call it.
func (e *Engine) ObservePod(id string, r *Request, at time.Time) {
	if e.learner != nil && id != "" {
		e.learner.observe(id, r, at, e)
	}
}

// ForgetPod removes what ObservePod added for pod id, if anything.
func (e *Engine) ForgetPod(id string) {
	if e.learner != nil {
		e.learner.forget(id, e)
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

// Validate says what is wrong with c, or nil: what New would refuse.
func (c LearnConfig) Validate() error {
	_, err := c.withDefaults()
	return err
}

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

// observe counts r for pod id ("": anonymous, never forgotten) and
// publishes the mix to e if it changed, while still holding the lock, so
// that publications never go out of order.
func (l *workloadLearner) observe(id string, r *Request, at time.Time, e *Engine) {
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
	l.publishLocked(e)
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

// forget removes what pod id added, and publishes the mix to e if it
// changed.
func (l *workloadLearner) forget(id string, e *Engine) {
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
	l.publishLocked(e)
}

func (l *workloadLearner) snapshot() *Workload {
	l.mu.Lock()
	defer l.mu.Unlock()
	tts, _ := l.mix()
	return newLearnedWorkload(tts)
}

// publishLocked gives e a new Workload if the quantised mix differs from
// the one published last.
func (l *workloadLearner) publishLocked(e *Engine) {
	tts, pub := l.mix()
	if e.workload.Load() != nil && slices.Equal(pub, l.published) {
		return
	}
	l.published = pub
	e.useWorkload(newLearnedWorkload(tts))
}

func newLearnedWorkload(tts []TaskType) *Workload {
	w, err := NewWorkload(tts)
	if err != nil {
		panic(fmt.Sprintf("learned workload is invalid: %v", err)) // weights are positive: a bug
	}
	return w
}
