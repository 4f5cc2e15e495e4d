package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"
)

// fault is one kind of fault: inject does it and returns once the system
// is whole again (the component restarted, the toxic removed).
type fault struct {
	kind   string
	inject func(f *faults, ctx context.Context, rng *rand.Rand) error
}

// faultKinds are every fault the schedule draws from.
var faultKinds = []fault{
	{"apiserver-restart", (*faults).apiserverRestart},
	{"etcd-restart", (*faults).etcdRestart},
	{"leader-partition", (*faults).leaderPartition},
	{"leader-latency", (*faults).leaderLatency},
	{"leader-reset", (*faults).leaderReset},
	{"shim-restart", (*faults).shimRestart},
	{"containerd-restart", (*faults).containerdRestart},
	{"kubelet-restart", (*faults).kubeletRestart},
	{"lease-pause", (*faults).leasePause},
	{"clock-skew", (*faults).clockSkew},
	{"key-rotation", (*faults).keyRotation},
	{"force-delete", (*faults).forceDelete},
	{"helm-upgrade", (*faults).helmUpgrade},
}

// faultNames lists the fault kinds.
func faultNames() string {
	var names []string
	for _, ft := range faultKinds {
		names = append(names, ft.kind)
	}
	return strings.Join(names, ", ")
}

// faultsNamed returns the fault kinds of a comma-separated list, every
// kind for "".
func faultsNamed(list string) ([]fault, error) {
	if list == "" {
		return faultKinds, nil
	}
	var out []fault
	for _, name := range strings.Split(list, ",") {
		i := slices.IndexFunc(faultKinds, func(ft fault) bool { return ft.kind == strings.TrimSpace(name) })
		if i < 0 {
			return nil, fmt.Errorf("--faults: unknown fault kind %q (known: %s)", name, faultNames())
		}
		out = append(out, faultKinds[i])
	}
	return out, nil
}

// faultRounds is how many times each kind is drawn over a run of 45
// minutes or more (one round per 15 minutes, at least one): the schedule
// is that many shuffled rounds of every kind, spread evenly.
const faultRounds = 3

// faults injects the schedule drawn from the seed.
type faults struct {
	s   *soak
	chk *checker
	rng *rand.Rand

	mu       sync.Mutex
	events   []faultEvent
	injected map[string]int
	// skipped counts the faults of the schedule that did not run: the
	// schedule ended while they waited for their part, or there was
	// nothing to act on.
	skipped map[string]int
	// busy serialises faults that touch the same part.
	busy map[string]*sync.Mutex
}

func newFaults(s *soak, chk *checker) *faults {
	return &faults{s: s, chk: chk, rng: rand.New(rand.NewPCG(uint64(s.o.seed), 3)),
		injected: map[string]int{}, skipped: map[string]int{}, busy: map[string]*sync.Mutex{}}
}

// warmUp is how long the cluster runs before the first fault.
const warmUp = 30 * time.Second

// run injects the faults, each in its own goroutine so that they overlap,
// at times spread over the schedule's span (until ctx's deadline); each
// runs until it is over or injectCtx ends. It waits for the last to
// finish.
func (f *faults) run(ctx, injectCtx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		return errors.New("faults: the run has no end")
	}
	schedule := plan(f.rng, f.s.o.faults, f.s.o.duration)
	start := time.Now()
	var wg sync.WaitGroup
	for _, sc := range schedule {
		sleep(ctx, time.Until(start.Add(sc.at)))
		if ctx.Err() != nil {
			f.skip(sc.kind)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.inject(ctx, injectCtx, sc)
		}()
	}
	wg.Wait()
	return nil
}

// plan draws the schedule of a run of the given length from rng: the
// kinds in shuffled rounds (one per 15 minutes, at least one, at most
// faultRounds), each fault's start (spread evenly after the warm-up, the
// last a quarter of the run, at most 3 minutes, before the end, with a
// jitter of up to a third of the gap) and a source of its own for its
// choices (which node, how long, kill or stop). Everything is drawn here,
// before any fault runs, so that the same seed gives the same schedule
// whatever the timing.
func plan(rng *rand.Rand, faults []fault, run time.Duration) []scheduled {
	var kinds []fault
	for range max(1, min(faultRounds, int(run/(15*time.Minute)))) {
		round := append([]fault(nil), faults...)
		rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		kinds = append(kinds, round...)
	}
	span := run - warmUp - min(3*time.Minute, run/4)
	gap := max(10*time.Second, span/time.Duration(len(kinds)))
	schedule := make([]scheduled, len(kinds))
	at := warmUp
	for i, ft := range kinds {
		schedule[i] = scheduled{fault: ft, at: at, rng: rand.New(rand.NewPCG(rng.Uint64(), uint64(i)))}
		at += gap - gap/6 + time.Duration(rng.Int64N(int64(gap/3)+1))
	}
	return schedule
}

// scheduled is a fault of the schedule: when it starts after the churn's
// start, and its own source of choices.
type scheduled struct {
	fault
	at  time.Duration
	rng *rand.Rand
}

// skip counts a fault of the schedule that did not run.
func (f *faults) skip(kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.skipped[kind]++
}

// part is the lock of the part a fault kind acts on: faults on the same
// part wait for each other (two restarts of one API server cannot
// overlap); faults on different parts overlap.
var faultPart = map[string]string{
	"apiserver-restart": "apiserver", "etcd-restart": "etcd",
	"leader-partition": "replicas", "leader-latency": "replicas", "leader-reset": "replicas", "key-rotation": "replicas",
	"shim-restart": "real-node", "containerd-restart": "real-node", "kubelet-restart": "real-node", "force-delete": "real-node",
	"lease-pause": "sim-nodes", "clock-skew": "sim-nodes", "helm-upgrade": "chart",
}

// inject injects one fault once its part is free, unless the schedule
// (scheduleCtx) ended meanwhile.
func (f *faults) inject(scheduleCtx, ctx context.Context, ft scheduled) {
	_ = f.withPart(faultPart[ft.kind], func() error {
		f.injectNow(scheduleCtx, ctx, ft)
		return nil
	})
}

// injectNow injects a fault, its part's lock held.
func (f *faults) injectNow(scheduleCtx, ctx context.Context, ft scheduled) {
	if scheduleCtx.Err() != nil {
		f.skip(ft.kind)
		return
	}
	start := time.Now()
	logf("fault %s: begins", ft.kind)
	f.chk.faultStarted(ft.kind)
	err := ft.inject(f, ctx, ft.rng)
	if errors.Is(err, errNothingToDo) {
		f.chk.faultEnded(ft.kind)
		f.skip(ft.kind)
		logf("fault %s: skipped (%v)", ft.kind, err)
		return
	}
	f.chk.faultEnded(ft.kind)
	f.mu.Lock()
	f.injected[ft.kind]++
	e := faultEvent{Kind: ft.kind, Start: start, End: time.Now()}
	if err != nil {
		e.Error = err.Error()
	}
	f.events = append(f.events, e)
	f.mu.Unlock()
	if err != nil && ctx.Err() == nil {
		// The system must come back whatever the fault: a fault that
		// could not be undone is a finding.
		f.chk.violate("fault-recovery", ft.kind, "%v", err)
		return
	}
	logf("fault %s: over after %s", ft.kind, time.Since(start).Round(time.Second))
}

// faultEvent is one injected fault.
type faultEvent struct {
	Kind  string    `json:"kind"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	Error string    `json:"error,omitempty"`
}

func (f *faults) eventList() []faultEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]faultEvent(nil), f.events...)
}

func (f *faults) counts() (injected, skipped map[string]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.injected), maps.Clone(f.skipped)
}

// errNothingToDo is returned by a fault that found nothing to act on (no
// pod to force-delete): it is counted as skipped, not injected.
var errNothingToDo = errors.New("nothing to act on")

// withPart runs fn holding the lock of a part: a fault holds its own
// part's, and takes another's when it acts on that part too.
func (f *faults) withPart(part string, fn func() error) error {
	f.mu.Lock()
	lock := f.busy[part]
	if lock == nil {
		lock = &sync.Mutex{}
		f.busy[part] = lock
	}
	f.mu.Unlock()
	lock.Lock()
	defer lock.Unlock()
	return fn()
}
