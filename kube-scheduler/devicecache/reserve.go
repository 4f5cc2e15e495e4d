package devicecache

import (
	"math"

	corev1 "k8s.io/api/core/v1"
	ktypes "k8s.io/apimachinery/pkg/types"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/types"
)

// Reserve chooses pod uid's devices on node name afresh and assumes them, in
// one step under the write lock, so that concurrent cycles never hand out the
// same device twice.
//
// capacity and free are the node's host resources as Filter and Score saw
// them, so that the devices chosen are those the node was scored for.
func (c *Cache) Reserve(pod *corev1.Pod, name string, r *devicescheduler.Request, capacity, free devicescheduler.Host, nominated []Added) (types.PodAllocation, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ns, ok := c.nodes[name]
	if !ok {
		return types.PodAllocation{}, ErrNoInventory
	}
	if err := c.usable(ns); err != nil {
		return types.PodAllocation{}, err
	}
	var p devicescheduler.Placement
	var alloc types.PodAllocation
	if len(nominated) == 0 {
		if err := c.engine.EvaluateHost(ns.devices, r, capacity, free, &p); err != nil {
			return types.PodAllocation{}, err
		}
		c.forgetLocked(pod.UID)
		err := ns.devices.AssumePlacement(string(pod.UID), &p, devicescheduler.Host{})
		ns.devicesChanged()
		if err != nil {
			return types.PodAllocation{}, err
		}
		alloc = p.Allocation()
	} else {
		// The nominated pods' devices first, on a copy; the pod's from
		// what they leave, then on the node.
		n := ns.devices.Clone()
		h := holder{c: c, n: n, evicting: c.preemptedOn(ns, math.MaxInt32)}
		for _, a := range nominated {
			h.place(a, capacity, free, &p)
		}
		if err := c.engine.EvaluateHost(n, r, capacity, free, &p); err != nil {
			return types.PodAllocation{}, err
		}
		alloc = p.Allocation()
		c.forgetLocked(pod.UID)
		err := ns.devices.Assume(string(pod.UID), alloc, devicescheduler.Host{})
		ns.devicesChanged()
		if err != nil {
			return types.PodAllocation{}, err
		}
	}
	alloc.Node = name
	c.pods[pod.UID] = &podState{pod: ktypes.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, node: name, alloc: alloc, assumed: true, applied: true}
	ns.pods[pod.UID] = struct{}{}
	c.NotWaiting(pod.UID)
	return alloc, nil
}

// Written remembers the allocation annotation this scheduler signed and
// bound an assumed pod with, so that the pod's informer events need no
// verification. It takes the cache's read lock only: a bind runs beside the
// next pod's Filter calls, and a writer waiting for the lock would stop
// them all (the largest wait in the scheduler's mutex profile at 5,000
// nodes).
func (c *Cache) Written(uid ktypes.UID, value string) {
	c.mu.RLock()
	if ps, ok := c.pods[uid]; ok {
		ps.written.Store(&value)
	}
	c.mu.RUnlock()
}

// Unreserve forgets an assumed pod; a pod already seen bound is kept.
func (c *Cache) Unreserve(uid ktypes.UID) {
	c.mu.Lock()
	freed := false
	if ps, ok := c.pods[uid]; ok && ps.assumed {
		freed = c.forgetLocked(uid)
	}
	c.mu.Unlock()
	if freed {
		c.wake(c.deviceWaiters)
	}
}
