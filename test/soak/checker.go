package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// The checker's bounds.
const (
	// checkEvery is how often the API's state is checked.
	checkEvery = 3 * time.Second
	// stuckAfter is how long a pod may stay pending while a live node has
	// room for it (whole idle GPUs of a model it accepts, and the host's
	// CPU and memory) and no fault is under way, before it counts as a
	// violation: kube-scheduler retries unschedulable pods on cluster
	// events and at the latest after 5 minutes, so a pod that waits out
	// the 5 minutes missed the event that freed its room.
	stuckAfter = 2 * time.Minute
	// faultCalm is how long after a fault ended the system counts as
	// still recovering: bindings are attributed to the fault, and after a
	// disruptive one no stuck pod is judged.
	faultCalm = time.Minute
	// leakAfter is how long a container, limits directory or mount may
	// outlive its pod before it counts as leaked.
	leakAfter = 2 * time.Minute
	// maxViolationsKept bounds the violations the report lists (all are
	// counted).
	maxViolationsKept = 200
)

// violation is one broken guarantee.
type violation struct {
	At     time.Time `json:"at"`
	Kind   string    `json:"kind"`
	Object string    `json:"object,omitempty"`
	What   string    `json:"what"`
}

// checker watches the cluster and counts violations. It shares no code
// with the scheduler beyond kubeinterface's wire format and signature
// check: its accounting of devices and its notion of a node with room are
// its own.
type checker struct {
	s     *soak
	start time.Time

	podInf, nodeInf, leaseInf toolscache.SharedIndexInformer

	mu         sync.Mutex
	violations []violation
	byKind     map[string]int
	// seen dedups violations by kind and object.
	seen map[string]bool
	// created is when each pod (by UID) was first seen, bound when first
	// seen bound; latencies are the scheduling latencies, tagged with the
	// faults under way.
	created   map[string]time.Time
	scheduled int
	latencies []latency
	// renewed is when each node's Lease was last seen to change (the
	// checker's clock), and its last renewTime.
	renewed map[string]time.Time
	renewal map[string]time.Time
	// fitting is since when each pending pod has had room.
	fitting map[string]time.Time
	// gone is when each pod UID was last seen, for leaks.
	gone map[string]time.Time
	// faults under way (by kind, a count) and when the last ended.
	active         map[string]int
	lastFault      time.Time
	lastDisruption time.Time
	rounds         int
	pending        int
	samples        *samples
	// calmFor is the time pending pods were judged (no disruptive fault);
	// realRounds and realFailures count the real node's checks and the
	// ones that could not list its containers; suspects are containers
	// seen once with the wrong devices (a second sighting is a violation).
	calmFor      time.Duration
	realRounds   int
	realFailures int
	suspects     map[string]bool
}

// latency is a pod's time from creation to binding, seen by the checker.
type latency struct {
	d      time.Duration
	faults []string
}

func newChecker(s *soak, client kubernetes.Interface) *checker {
	c := &checker{s: s, start: time.Now(), byKind: map[string]int{}, seen: map[string]bool{}, created: map[string]time.Time{},
		renewed: map[string]time.Time{}, renewal: map[string]time.Time{}, fitting: map[string]time.Time{},
		gone: map[string]time.Time{}, active: map[string]int{}, samples: newSamples(), suspects: map[string]bool{}}
	f := informers.NewSharedInformerFactory(client, 0)
	c.podInf = f.Core().V1().Pods().Informer()
	c.nodeInf = f.Core().V1().Nodes().Informer()
	c.leaseInf = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(corev1.NamespaceNodeLease)).Coordination().V1().Leases().Informer()
	_, _ = c.podInf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.observePod(o) },
		UpdateFunc: func(_, o any) { c.observePod(o) },
	})
	_, _ = c.leaseInf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.observeLease(o) },
		UpdateFunc: func(_, o any) { c.observeLease(o) },
	})
	return c
}

func (c *checker) run(ctx context.Context) {
	for _, inf := range []toolscache.SharedIndexInformer{c.podInf, c.nodeInf, c.leaseInf} {
		go inf.Run(ctx.Done())
	}
	toolscache.WaitForCacheSync(ctx.Done(), c.podInf.HasSynced, c.nodeInf.HasSynced, c.leaseInf.HasSynced)
	go c.s.simKubelets.run(ctx)
	go c.samples.run(ctx, c)
	go every(ctx, 10*time.Second, func() { c.checkRealNode(ctx, time.Now()) })
	every(ctx, checkEvery, func() {
		now := time.Now()
		if c.calm(now) {
			c.mu.Lock()
			c.calmFor += checkEvery
			c.mu.Unlock()
		}
		c.checkAPI(now)
	})
}

// violate records a violation once per kind and object.
func (c *checker) violate(kind, object, format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := kind + "\x00" + object
	if object != "" && c.seen[key] {
		return
	}
	c.seen[key] = true
	c.byKind[kind]++
	v := violation{At: time.Now(), Kind: kind, Object: object, What: fmt.Sprintf(format, args...)}
	if len(c.violations) < maxViolationsKept {
		c.violations = append(c.violations, v)
	}
	logf("VIOLATION %s %s: %s", kind, object, v.What)
}

func (c *checker) observePod(o any) {
	p, ok := o.(*corev1.Pod)
	if !ok || p.Namespace != soakNamespace {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	uid := string(p.UID)
	first, known := c.created[uid]
	if !known {
		first = now
		if p.Spec.NodeName == "" {
			c.created[uid] = now
		} else {
			c.created[uid] = time.Time{} // bound before the checker saw it
		}
	}
	if p.Spec.NodeName != "" && !first.IsZero() {
		c.created[uid] = time.Time{}
		c.scheduled++
		c.latencies = append(c.latencies, latency{d: now.Sub(first), faults: c.recentFaultsLocked(now)})
	}
}

func (c *checker) observeLease(o any) {
	l, ok := o.(*coordinationv1.Lease)
	if !ok || l.Spec.RenewTime == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev, ok := c.renewal[l.Name]; !ok || !prev.Equal(l.Spec.RenewTime.Time) {
		c.renewal[l.Name] = l.Spec.RenewTime.Time
		c.renewed[l.Name] = time.Now()
	}
}

// faultStarted and faultEnded bracket a fault.
func (c *checker) faultStarted(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.active[kind]++
}

func (c *checker) faultEnded(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.active[kind]--
	c.lastFault = time.Now()
	if disruptive[kind] {
		c.lastDisruption = c.lastFault
	}
}

// disruptive are the faults that stop scheduling everywhere for a while:
// the API server or etcd away, the leader cut off, or the replicas
// restarted (by a key rotation). While one is under way or just over, no
// pod is judged stuck. The others act on one node (whose room the checker
// judges by what the scheduler reads too: the node's Ready condition, its
// Lease seen renewed) or must not stop scheduling (a Helm upgrade, the
// wait for the old key's pods to end): pods are judged through them.
var disruptive = map[string]bool{"apiserver-restart": true, "etcd-restart": true, "leader-partition": true,
	"leader-latency": true, "leader-reset": true, "replica-restart": true}

// recentFaultsLocked are the faults under way or ended within faultCalm.
func (c *checker) recentFaultsLocked(now time.Time) []string {
	var out []string
	for k, n := range c.active {
		if n > 0 {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	if len(out) == 0 && now.Sub(c.lastFault) < faultCalm {
		out = []string{"recovering"}
	}
	return out
}

// calm reports whether no disruptive fault is under way or ended within
// faultCalm.
func (c *checker) calm(now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, n := range c.active {
		if n > 0 && disruptive[k] {
			return false
		}
	}
	return now.Sub(c.lastDisruption) >= faultCalm
}

// podsNow are the pods of the informer's cache.
func (c *checker) podsNow() []*corev1.Pod {
	var out []*corev1.Pod
	for _, o := range c.podInf.GetStore().List() {
		if p, ok := o.(*corev1.Pod); ok {
			out = append(out, p)
		}
	}
	return out
}

// podCount is the number of the soak's pods.
func (c *checker) podCount() int {
	n := 0
	for _, p := range c.podsNow() {
		if p.Namespace == soakNamespace {
			n++
		}
	}
	return n
}

// pendingPods is the number of pods waiting for a node at the last check.
func (c *checker) pendingPods() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pending
}

// pendingOn is the number of pods waiting that select the named node
// (by its hostname label).
func (c *checker) pendingOn(node string) int {
	n := 0
	for _, p := range c.podsNow() {
		if p.Namespace == soakNamespace && p.Spec.NodeName == "" && p.DeletionTimestamp == nil && p.Spec.NodeSelector[corev1.LabelHostname] == node {
			n++
		}
	}
	return n
}

// live reports whether a node's Lease was seen renewed within the plugin's
// heartbeatStaleness, on the checker's clock.
func (c *checker) live(node string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.renewed[node]
	return ok && now.Sub(at) < heartbeatStaleness-5*time.Second
}

// verifyKeys verifies allocations with every key the soak made.
func (c *checker) verifyKeys() func(kubeinterface.Allocation) error {
	return c.s.keys.verifier().Verify
}

// waitKeyRetired waits until no running pod's allocation is signed with
// the key keyID.
func (c *checker) waitKeyRetired(ctx context.Context, keyID string, timeout time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 5*time.Second, timeout, true, func(context.Context) (bool, error) {
		last = ""
		for _, p := range c.podsNow() {
			if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue
			}
			if h, err := objects.HeldAllocation(p, nil); err == nil && kubeinterface.SignatureKeyID(h.Signature) == keyID {
				last = p.Name
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("pod %s still carries key %s after %s: %w", last, keyID, timeout, err)
	}
	return nil
}
