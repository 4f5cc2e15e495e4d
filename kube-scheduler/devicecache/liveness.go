package devicecache

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/kubeinterface"
)

// A node gets new GPU pods only while it is live: its kubelet renews the
// node's Lease in kube-node-lease and reports the node Ready. kubegpu-crishim
// is the kubelet's container runtime, so a node whose shim is down is one
// whose kubelet reports "container runtime is down" (NotReady); nodes write
// nothing else periodically, and NodeRestriction lets a node write no Lease
// but its own.
//
// Staleness is judged on the scheduler's own clock: by when the scheduler
// saw the Lease's renewTime change, never by the renewTime itself, which is
// the node's clock. A node whose clock is off is neither stale while it
// renews nor live once it stops. A scheduler that starts (not one that takes
// over from a leader: standbys keep watching) waits for each node's next
// renewal, one renew interval (10 s with kubelet's defaults), before it
// counts the node live.

var (
	// ErrStale is wrapped by every reason a node is not live; they end
	// when the node's kubelet is back, and the pods refused for them are
	// activated then.
	ErrStale      = errors.New("node is not live")
	errNoLease    = fmt.Errorf("%w: node has no Lease in %s (is its kubelet running?)", ErrStale, kubeinterface.LeaseNamespace)
	errUnobserved = fmt.Errorf("%w: waiting to see the node's Lease renewed since the scheduler started", ErrStale)
)

// liveness is what the scheduler has seen of a node's kubelet.
type liveness struct {
	// ready reports the node's Ready condition; notReady says why not.
	ready bool
	// leased is true while the node's Lease exists; renew is its last
	// renewTime (the node's clock). renew, observed and hasObserved are
	// atomic (renew nil for none) so that a renewal of a live node's
	// Lease, the most frequent event the cache sees (every node's every
	// 10 s), is taken in under the read lock: Filter calls go on
	// meanwhile.
	leased bool
	// hasObserved is false until renew was seen to change since the
	// scheduler started; observed is when it last was, on the scheduler's
	// clock (its monotonic reading, so that steps of the wall clock do not
	// count), as the time since the cache started (see Cache.since).
	// A number rather than a *time.Time: Filter reads it for every node,
	// and a pointer to follow per node was the largest cost of Filter at
	// 5,000 nodes.
	hasObserved atomic.Bool
	observed    atomic.Int64
	renew       atomic.Pointer[time.Time]
	notReady    string
}

// ErrWarmingUp is why GPU pods wait while the cache warms up.
var ErrWarmingUp = errors.New("waiting to see the nodes' Leases renewed since the scheduler started")

// warm reports whether the scheduler has seen renewed, since it started,
// the Lease of every node it may place GPU pods on, or has waited long
// enough for that: a quarter of heartbeatStaleness (kubelet renews its Lease
// every quarter of its duration) and two seconds more. Nodes that are not
// Ready, and nodes whose last renewal is older than heartbeatStaleness by
// the scheduler's clock (dead, or with a clock far behind: either way they
// count live only once seen renewing), are not waited for.
func (c *Cache) warm() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	now := c.now()
	if now.Sub(c.started) >= c.staleness/4+2*time.Second {
		return true
	}
	for _, ns := range c.nodes {
		if ns.devices != nil && ns.live.ready && ns.live.leased && !ns.live.hasObserved.Load() && now.Sub(timeOf(ns.live.renew.Load())) <= c.staleness {
			return false
		}
	}
	return true
}

// WarmUp marks the cache warm once it has synced and warm says so, and
// sends the GPU pods that waited meanwhile back to the scheduling queue.
func (c *Cache) WarmUp(ctx context.Context, synced func() bool) {
	if !toolscache.WaitForCacheSync(ctx.Done(), synced) {
		return
	}
	c.LearnPods(klog.FromContext(ctx))
	if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
		return c.warm(), nil
	}); err != nil {
		return
	}
	c.warmed.Store(true)
	c.activateWaiting()
}

// UpdateLease takes in a Lease of kube-node-lease: the Lease of the node of
// the same name. initial is true for the informer's initial list, whose
// renewTimes say nothing about when they were written.
func (c *Cache) UpdateLease(lease *coordinationv1.Lease, initial bool) {
	if lease.Namespace != kubeinterface.LeaseNamespace {
		return
	}
	var renew time.Time
	switch {
	case lease.Spec.RenewTime != nil:
		renew = lease.Spec.RenewTime.Time
	case lease.Spec.AcquireTime != nil:
		renew = lease.Spec.AcquireTime.Time
	}
	// Read before the lock: observed can only come out earlier by the
	// wait for it, which errs on the side of stale.
	now := c.now()
	if !initial {
		// A live node's renewal: it stays live, and only the two atomics
		// change.
		c.mu.RLock()
		ns, ok := c.nodes[lease.Name]
		fast := ok && ns.live.leased && c.liveAt(ns, now) == nil
		if fast {
			ns.live.takeRenewal(renew, c.since(now), true)
		}
		c.mu.RUnlock()
		if fast {
			return
		}
	}
	c.mu.Lock()
	ns := c.node(lease.Name)
	wasLive := c.liveAt(ns, now) == nil
	// A node without a Lease has no renewTime either: its new Lease is a
	// change.
	ns.live.takeRenewal(renew, c.since(now), !initial)
	ns.live.leased = true
	resumed := !wasLive && c.liveAt(ns, now) == nil
	c.mu.Unlock()
	if resumed {
		c.activateWaiting()
	}
}

// DeleteLease forgets a node's Lease.
func (c *Cache) DeleteLease(lease *coordinationv1.Lease) {
	if lease.Namespace != kubeinterface.LeaseNamespace {
		return
	}
	c.mu.Lock()
	if ns, ok := c.nodes[lease.Name]; ok {
		ns.live.leased = false
		ns.live.renew.Store(nil)
		ns.live.hasObserved.Store(false)
		c.dropIfGoneLocked(lease.Name)
	}
	c.mu.Unlock()
}

// setReady records node's Ready condition; must hold c.mu. It reports
// whether the node became Ready.
func setReady(ns *nodeState, node *corev1.Node) bool {
	was := ns.live.ready
	ns.live.ready, ns.live.notReady = false, "the node reports no Ready condition"
	for _, cond := range node.Status.Conditions {
		if cond.Type != corev1.NodeReady {
			continue
		}
		ns.live.ready = cond.Status == corev1.ConditionTrue
		ns.live.notReady = fmt.Sprintf("the node is not Ready (%s: %s)", cond.Reason, kubeinterface.Quote(cond.Message))
	}
	return ns.live.ready && !was
}

// usable says why a node gets no new GPU pods, or nil; must hold c.mu.
func (c *Cache) usable(ns *nodeState) error { return c.usableAt(ns, c.now()) }

func (c *Cache) usableAt(ns *nodeState, now time.Time) error {
	if ns.devices == nil {
		return ns.err
	}
	if ns.refuses != nil {
		return ns.refuses
	}
	if ns.draConflict != nil {
		return ns.draConflict
	}
	return c.liveAt(ns, now)
}

// liveAt says why the node is not live at now, or nil; must hold c.mu.
func (c *Cache) liveAt(ns *nodeState, now time.Time) error {
	switch {
	case !ns.live.ready:
		return fmt.Errorf("%w: %s", ErrStale, ns.live.notReady)
	case !ns.live.leased:
		return errNoLease
	}
	if !ns.live.hasObserved.Load() {
		return errUnobserved
	}
	if age := c.since(now) - time.Duration(ns.live.observed.Load()); age > c.staleness {
		return fmt.Errorf("%w: node's Lease was last seen renewed %s ago (limit %s)", ErrStale, age.Round(time.Second), c.staleness)
	}
	return nil
}

// takeRenewal records the Lease's renewTime and, if observe and it
// changed, at (see Cache.since) as when it was seen to change.
func (l *liveness) takeRenewal(renew time.Time, at time.Duration, observe bool) {
	if prev := l.renew.Swap(&renew); observe && (prev == nil || !prev.Equal(renew)) {
		l.observed.Store(int64(at))
		l.hasObserved.Store(true)
	}
}

// since is t on the cache's clock: the time since the cache started, by
// the monotonic clock when t has its reading (every time c.now gives but
// tests' fixed ones).
func (c *Cache) since(t time.Time) time.Duration { return t.Sub(c.started) }

// timeOf is *t, the zero time for nil.
func timeOf(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
