package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// fault is one kind of fault: inject does it and returns once the system
// is whole again (the component restarted, the toxic removed).
type fault struct {
	kind   string
	inject func(f *faults, ctx context.Context) error
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
	failed   map[string]int
	// busy serialises faults that touch the same part.
	busy map[string]*sync.Mutex
}

func newFaults(s *soak, chk *checker) *faults {
	return &faults{s: s, chk: chk, rng: rand.New(rand.NewPCG(uint64(s.o.seed), 3)),
		injected: map[string]int{}, failed: map[string]int{}, busy: map[string]*sync.Mutex{}}
}

// warmUp is how long the cluster runs before the first fault.
const warmUp = 30 * time.Second

// run injects the faults, each in its own goroutine so that they overlap,
// at times spread over the schedule's span (until ctx's deadline); each
// runs until it is over or injectCtx ends. It waits for the last to
// finish.
func (f *faults) run(ctx, injectCtx context.Context) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		return errors.New("faults: the run has no end")
	}
	run := time.Until(deadline)
	var schedule []fault
	for range max(1, min(faultRounds, int(run/(15*time.Minute)))) {
		round := append([]fault(nil), f.s.o.faults...)
		f.rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		schedule = append(schedule, round...)
	}
	// The last fault starts a quarter of the run (at most 3 minutes)
	// before the end, so that it can finish and its effects be checked.
	span := run - warmUp - min(3*time.Minute, run/4)
	gap := max(10*time.Second, span/time.Duration(len(schedule)))
	var wg sync.WaitGroup
	timer := time.NewTimer(warmUp)
	defer timer.Stop()
	for _, ft := range schedule {
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
		if ctx.Err() != nil {
			break
		}
		// A jitter of up to a third of the gap, from the seed.
		timer.Reset(gap - gap/6 + time.Duration(f.rng.Int64N(int64(gap/3)+1)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.inject(ctx, injectCtx, ft)
		}()
	}
	wg.Wait()
	return nil
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
func (f *faults) inject(scheduleCtx, ctx context.Context, ft fault) {
	f.mu.Lock()
	part := faultPart[ft.kind]
	lock := f.busy[part]
	if lock == nil {
		lock = &sync.Mutex{}
		f.busy[part] = lock
	}
	f.mu.Unlock()
	lock.Lock()
	defer lock.Unlock()
	if scheduleCtx.Err() != nil {
		return
	}
	start := time.Now()
	logf("fault %s: begins", ft.kind)
	f.chk.faultStarted(ft.kind)
	err := ft.inject(f, ctx)
	f.chk.faultEnded(ft.kind)
	f.mu.Lock()
	f.injected[ft.kind]++
	e := faultEvent{Kind: ft.kind, Start: start, End: time.Now()}
	if err != nil {
		f.failed[ft.kind]++
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

func (f *faults) counts() (injected, failed map[string]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	injected, failed = map[string]int{}, map[string]int{}
	for k, v := range f.injected {
		injected[k] = v
	}
	for k, v := range f.failed {
		failed[k] = v
	}
	return injected, failed
}

func (f *faults) apiserverRestart(ctx context.Context) error {
	c := f.s.cluster
	if f.rng.IntN(2) == 0 {
		_ = c.KillAPIServer()
	} else if err := c.StopAPIServer(); err != nil {
		// A graceful stop that outlasts its 30 s ends in SIGKILL: down
		// either way, which is the fault.
		logf("fault: %v", err)
	}
	sleep(ctx, time.Duration(2+f.rng.IntN(10))*time.Second)
	return c.StartAPIServer(ctx)
}

func (f *faults) etcdRestart(ctx context.Context) error {
	return f.s.cluster.RestartEtcd(ctx)
}

// leaderMetric is kube-scheduler's sample that says it leads.
const leaderMetric = `leader_election_master_status{name="kube-scheduler"}`

// leader waits up to two minutes for a replica to say it holds the lease
// (its leader_election_master_status metric): after another fault there
// may be none for a while, and reading the metric needs the API server
// (the scrape is authorized through it).
func (f *faults) leader(ctx context.Context) *replica {
	var leader *replica
	_ = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, r := range f.s.replicas {
			if m, err := r.scrape(ctx, leaderMetric); err == nil && m[leaderMetric] == 1 {
				leader = r
				return true, nil
			}
		}
		return false, nil
	})
	return leader
}

// leaderPartition black-holes the leader's connections to the API server
// (its process keeps running) for longer than its lease: the other
// replica takes over while the old leader may still be binding.
func (f *faults) leaderPartition(ctx context.Context) error {
	return f.withLeaderToxic(ctx, "timeout", map[string]int{"timeout": 0}, leaseDuration+renewDeadline+5*time.Second)
}

// leaderLatency delays the leader's traffic by 1–3 s each way for a minute.
func (f *faults) leaderLatency(ctx context.Context) error {
	return f.withLeaderToxic(ctx, "latency", map[string]int{"latency": 1000 + f.rng.IntN(2000), "jitter": 500}, time.Minute)
}

// leaderReset resets the leader's connections for 5 s.
func (f *faults) leaderReset(ctx context.Context) error {
	return f.withLeaderToxic(ctx, "reset_peer", map[string]int{"timeout": 0}, 5*time.Second)
}

func (f *faults) withLeaderToxic(ctx context.Context, typ string, attrs map[string]int, d time.Duration) error {
	r := f.leader(ctx)
	if r == nil {
		return errors.New("no replica said it leads for two minutes")
	}
	for _, stream := range []string{"upstream", "downstream"} {
		if err := toxic(r.proxy, typ+"-"+stream, typ, stream, attrs); err != nil {
			return fmt.Errorf("toxic %s on replica %s: %w", typ, r.name, err)
		}
	}
	logf("fault: replica %s's connections get %s %v for %s", r.name, typ, attrs, d)
	sleep(ctx, d)
	for _, stream := range []string{"upstream", "downstream"} {
		if err := r.proxy.Toxics.RemoveToxic(ctx, typ+"-"+stream); err != nil {
			return fmt.Errorf("remove toxic %s from replica %s: %w", typ, r.name, err)
		}
	}
	return nil
}

func (f *faults) shimRestart(ctx context.Context) error { return f.s.real.RestartShim(ctx, "") }

func (f *faults) containerdRestart(ctx context.Context) error { return f.s.real.RestartContainerd(ctx) }

func (f *faults) kubeletRestart(ctx context.Context) error { return f.s.real.RestartKubelet(ctx) }

// randomSimNode is a simulated node drawn from the seed.
func (f *faults) randomSimNode() (string, *simNode) {
	name := f.s.simNames[f.rng.IntN(len(f.s.simNames))]
	return name, f.s.simNode(name)
}

// leasePause stops a node's Lease renewals for longer than the plugin's
// heartbeatStaleness and kube-controller-manager's grace period, then
// restarts its kubelet stand-in (which reports the node Ready again).
func (f *faults) leasePause(ctx context.Context) error {
	name, n := f.randomSimNode()
	logf("fault: node %s stops renewing its Lease", name)
	n.kubelet.Pause()
	sleep(ctx, 90*time.Second)
	return n.kubelet.Restart(ctx)
}

// clockSkew sets three nodes' clocks off by ±2–10 minutes for three
// minutes: their renewals carry times far from the scheduler's.
func (f *faults) clockSkew(ctx context.Context) error {
	var skewed []*simNode
	for range 3 {
		name, n := f.randomSimNode()
		off := time.Duration(2+f.rng.IntN(9)) * time.Minute
		if f.rng.IntN(2) == 0 {
			off = -off
		}
		logf("fault: node %s's clock off by %s", name, off)
		n.clock.set(off)
		skewed = append(skewed, n)
	}
	sleep(ctx, 3*time.Minute)
	for _, n := range skewed {
		n.clock.set(0)
	}
	return nil
}

// keyRotation rotates the allocation signing key as the docs say: nodes
// trust the new key beside the old one; the replicas, one after the
// other, sign with the new key and still count the old key's allocations;
// once no pod carries the old key, nodes drop it.
func (f *faults) keyRotation(ctx context.Context) error {
	k := f.s.keys
	old := k.newest()
	next, err := k.add()
	if err != nil {
		return err
	}
	both, err := k.trust(old, next)
	if err != nil {
		return err
	}
	k.setTrusted(both)
	if err := f.s.real.RestartShim(ctx, both); err != nil {
		return err
	}
	for _, r := range f.s.replicas {
		if err := r.restart(ctx, k.gen(next).private, k.gen(old).public); err != nil {
			return err
		}
	}
	logf("fault: the replicas sign with key %s; waiting until no pod carries key %s", k.gen(next).id, k.gen(old).id)
	if err := f.chk.waitKeyRetired(ctx, k.gen(old).id, 10*time.Minute); err != nil {
		return err
	}
	only, err := k.trust(next)
	if err != nil {
		return err
	}
	k.setTrusted(only)
	return f.s.real.RestartShim(ctx, only)
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// forceDelete is an operator's force delete of a GPU pod on a node whose
// kubelet is down (`kubectl delete --force --grace-period=0`, as for a node
// that does not answer): the pod is gone from the API while its container
// runs, and the scheduler gives its GPU to another pod. Once kubelet is
// back, the node must not run both containers on the GPU at once (the
// shim's ledger refuses the new one until kubelet has stopped the old):
// the node's containers are checked every half second for a minute.
func (f *faults) forceDelete(ctx context.Context) error {
	if err := f.s.real.StopKubelet(); err != nil {
		return err
	}
	var victim *corev1.Pod
	for _, p := range f.chk.podsNow() {
		if p.Spec.NodeName == realNode && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			victim = p
			break
		}
	}
	if victim != nil {
		logf("fault: kubelet of %s down; force-deleting pod %s, whose container keeps running", realNode, victim.Name)
		err := f.s.cluster.Client.CoreV1().Pods(victim.Namespace).Delete(ctx, victim.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &victim.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			_ = f.s.real.StartKubelet(ctx)
			return fmt.Errorf("force-delete pod %s: %w", victim.Name, err)
		}
	}
	// Time for the scheduler to give the GPU to a waiting pod.
	sleep(ctx, 30*time.Second)
	if err := f.s.real.StartKubelet(ctx); err != nil {
		return err
	}
	f.chk.watchNode(ctx, time.Minute, 500*time.Millisecond)
	return nil
}
