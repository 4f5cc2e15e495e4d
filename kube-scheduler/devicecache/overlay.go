package devicecache

import (
	"errors"
	"math"

	corev1 "k8s.io/api/core/v1"
	ktypes "k8s.io/apimachinery/pkg/types"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/types"
)

// Overlay is what one evaluation counts differently from the cache: pods
// removed from the node (preemption's dry run) and pods added to it (pods
// nominated to it, placed first). The plugin keeps one per node in its
// cycle state; it never changes one that another cycle state shares.
type Overlay struct {
	Removed map[ktypes.UID]struct{}
	Added   []Added
	// DryRun is set once preemption asked what evictions would free.
	// Pods the scheduler is already evicting, below the preemptor's
	// priority, then count as gone, as they soon are: a preemptor whose
	// victims are still leaving needs no more victims.
	DryRun bool
}

// Empty reports whether o changes nothing.
func (o *Overlay) Empty() bool {
	return o == nil || (!o.DryRun && len(o.Removed) == 0 && len(o.Added) == 0)
}

// Added is a pod nominated to the node, to be placed before the pod
// being scheduled.
type Added struct {
	UID     ktypes.UID
	Request *devicescheduler.Request
}

// HoldsOn reports whether the cache counts devices of pod uid on node.
func (c *Cache) HoldsOn(uid ktypes.UID, node string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	ps, ok := c.pods[uid]
	return ok && ps.node == node && ps.applied
}

// EvaluateWith checks in's request against node name with overlay o applied
// to a copy of its devices: o's removed pods gone, then its added pods
// placed, in order, where they fit. Nothing is remembered.
//
// prio is the priority of the pod being scheduled: in a dry run, pods the
// scheduler is evicting already (and so soon gone) count as gone if their
// priority is below it.
func (c *Cache) EvaluateWith(node *corev1.Node, o *Overlay, in *Input, prio int32, capacity, free devicescheduler.Host, p *devicescheduler.Placement) (int64, error) {
	if s := ServedByDRA(node, in); s != nil {
		return 0, s
	}
	c.mu.RLock()
	ns, ok := c.lookup(node)
	if !ok {
		c.mu.RUnlock()
		return 0, ErrNoInventory
	}
	if err := c.usableAt(ns, in.now); err != nil {
		c.mu.RUnlock()
		return 0, err
	}
	n, idle := ns.devices.Clone(), ns.idle
	evicting, gone := c.preemptedOn(ns, math.MaxInt32), c.preemptedOn(ns, prio)
	var claims []ktypes.UID
	if o.DryRun {
		// ResourceClaims all of whose pods are gone are released (the
		// claim controller deallocates them once their pods are deleted).
		claims = c.claimsGoneLocked(ns, o.Removed, gone)
	}
	c.mu.RUnlock()
	if o.DryRun {
		for _, uid := range gone {
			n.Release(string(uid))
		}
	}
	for uid := range o.Removed {
		n.Release(string(uid))
	}
	for _, uid := range claims {
		n.Release(string(uid))
	}
	h := holder{c: c, n: n, evicting: evicting}
	for _, a := range o.Added {
		// Host resources are the framework's to count (NodeResourcesFit
		// has the nominated pods added too).
		h.place(a, capacity, free, p)
	}
	if err := c.engine.EvaluateHost(n, in.request, capacity, free, p); err != nil {
		var nf *devicescheduler.NotFitError
		if errors.As(err, &nf) && idle != nil && c.engine.EvaluateHost(idle, in.request, capacity, capacity, p) != nil {
			err = errors.Join(errNeverFits, err)
		}
		return 0, err
	}
	return p.Score(), nil
}

// preemptedOn lists the pods on ns that the scheduler is evicting for a
// preemptor (being deleted, with the DisruptionTarget condition the
// scheduler sets) whose priority is below prio; must hold c.mu. Pods
// deleted otherwise may stay for as long as their grace period (or a
// node) pleases: they count as held.
func (c *Cache) preemptedOn(ns *nodeState, prio int32) []ktypes.UID {
	var out []ktypes.UID
	for uid := range ns.pods {
		if ps := c.pods[uid]; ps != nil && ps.preempted && ps.priority < prio {
			out = append(out, uid)
		}
	}
	return out
}

// holder places nominated pods on a copy of a node's devices before the
// pod being scheduled gets its own, so that devices freed for a preemptor
// are not given to another pod meanwhile.
type holder struct {
	c *Cache
	n *devicescheduler.Node
	// evicting are the pods the scheduler is evicting from the node.
	evicting []ktypes.UID
	// gone is n with the evicted pods gone, made when first needed.
	gone *devicescheduler.Node
}

// place places nominated pod a on h.n. If it does not fit only because
// pods are still being evicted (a preemptor's victims), the free devices it
// will get once they are gone are held for it now.
func (h *holder) place(a Added, capacity, free devicescheduler.Host, p *devicescheduler.Placement) {
	e := h.c.engine
	if err := e.EvaluateHost(h.n, a.Request, capacity, free, p); err == nil {
		alloc := p.Allocation()
		_ = h.n.AssumePlacement(string(a.UID), p, devicescheduler.Host{})
		if h.gone != nil {
			_ = h.gone.Assume(string(a.UID), alloc, devicescheduler.Host{})
		}
		return
	}
	if len(h.evicting) == 0 {
		return
	}
	if h.gone == nil {
		h.gone = h.n.Clone()
		for _, uid := range h.evicting {
			h.gone.Release(string(uid))
		}
	}
	if err := e.EvaluateHost(h.gone, a.Request, capacity, free, p); err != nil {
		return
	}
	alloc := p.Allocation()
	_ = h.gone.AssumePlacement(string(a.UID), p, devicescheduler.Host{})
	// Each device on its own: those still held by evicted pods are
	// not free to anyone anyway.
	for _, list := range [][]types.ContainerAllocation{alloc.InitContainers, alloc.Containers} {
		for _, ctr := range list {
			for _, d := range ctr.Devices {
				one := types.PodAllocation{Containers: []types.ContainerAllocation{{Name: ctr.Name, Devices: []types.DeviceShare{d}}}}
				_ = h.n.Assume(string(a.UID)+"/"+ctr.Name+"/"+d.ID, one, devicescheduler.Host{})
			}
		}
	}
}
