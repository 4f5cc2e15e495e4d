package plugin

import (
	"context"
	"errors"
	"maps"
	"math"
	"slices"

	corev1 "k8s.io/api/core/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// PreFilterExtensions lets the framework ask what fits on a node with some
// pods gone (preemption's dry run) or others added (pods nominated to the
// node, whose devices are held for them).
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return p }

// overlayKey keys a cycle's view of nodes with pods removed or added.
const overlayKey fwk.StateKey = Name + "/overlay"

// overlayState is, per node, the pods a cycle asks Filter to count as gone
// and the nominated pods to count as placed. The framework clones it for
// every node it tries victims on, and changes clones only: Clone copies.
type overlayState struct {
	nodes map[string]*nodeOverlay
}

// nodeOverlay is one node's pods removed and added. It is never changed
// once another cycle state may share it: changes make a copy.
type nodeOverlay struct {
	removed map[ktypes.UID]struct{}
	added   []addedPod
	// dryRun is set once RemovePod was called: preemption is asking what
	// evictions would free. Pods the scheduler is already evicting, below
	// the preemptor's priority, then count as gone, as they soon are: a
	// preemptor whose victims are still leaving needs no more victims.
	dryRun bool
}

// addedPod is a pod nominated to the node, to be placed before the pod
// being scheduled.
type addedPod struct {
	uid     ktypes.UID
	request *devicescheduler.Request
}

func (s *overlayState) Clone() fwk.StateData {
	return &overlayState{nodes: maps.Clone(s.nodes)}
}

func (o *nodeOverlay) empty() bool {
	return o == nil || (!o.dryRun && len(o.removed) == 0 && len(o.added) == 0)
}

// edit returns a copy of node's overlay in cs to change, and stores it.
func editOverlay(cs fwk.CycleState, node string) *nodeOverlay {
	s := readState[*overlayState](cs, overlayKey)
	if s == nil {
		s = &overlayState{nodes: map[string]*nodeOverlay{}}
		cs.Write(overlayKey, s)
	}
	o := &nodeOverlay{removed: map[ktypes.UID]struct{}{}}
	if old := s.nodes[node]; old != nil {
		o.removed = maps.Clone(old.removed)
		o.added = slices.Clone(old.added)
		o.dryRun = old.dryRun
	}
	s.nodes[node] = o
	return o
}

// overlayOf is node's overlay in cs, or nil.
func overlayOf(cs fwk.CycleState, node string) *nodeOverlay {
	if s := readState[*overlayState](cs, overlayKey); s != nil {
		return s.nodes[node]
	}
	return nil
}

// AddPod counts podInfoToAdd on the node: a pod removed earlier in this
// evaluation is counted again (preemption's reprieve); a pod nominated to
// the node that asks for devices has them placed before the pod being
// scheduled, so that devices freed for a preemptor are not given to another
// pod meanwhile.
func (p *Plugin) AddPod(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, podInfoToAdd fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	if getState(cs) == nil {
		return nil
	}
	pod, node := podInfoToAdd.GetPod(), nodeInfo.Node().Name
	if o := overlayOf(cs, node); o != nil {
		if _, ok := o.removed[pod.UID]; ok {
			delete(editOverlay(cs, node).removed, pod.UID)
			return nil
		}
	}
	if p.cache.holdsOn(pod.UID, node) || !objects.WantsDevices(pod) {
		return nil // counted already, or nothing to count
	}
	// Its devices only: the framework counts its CPU and memory (the
	// NodeInfo has it added already). An invalid request gets no devices.
	r, ok := p.deviceRequest(pod, devicescheduler.Host{})
	if !ok {
		return nil
	}
	o := editOverlay(cs, node)
	o.added = append(o.added, addedPod{uid: pod.UID, request: r})
	return nil
}

// RemovePod counts the devices podInfoToRemove holds on the node as free.
func (p *Plugin) RemovePod(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, podInfoToRemove fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	if getState(cs) == nil {
		return nil
	}
	pod, node := podInfoToRemove.GetPod(), nodeInfo.Node().Name
	if o := overlayOf(cs, node); o != nil {
		if i := slices.IndexFunc(o.added, func(a addedPod) bool { return a.uid == pod.UID }); i >= 0 {
			e := editOverlay(cs, node)
			e.added = slices.Delete(e.added, i, i+1)
			return nil
		}
	}
	o := editOverlay(cs, node)
	o.dryRun = true
	if p.cache.holdsOn(pod.UID, node) {
		o.removed[pod.UID] = struct{}{}
	}
	return nil
}

// holdsOn reports whether the cache counts devices of pod uid on node.
func (c *deviceCache) holdsOn(uid ktypes.UID, node string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	ps, ok := c.pods[uid]
	return ok && ps.node == node && ps.applied
}

// evaluateWith checks in's request against node name with overlay o applied
// to a copy of its devices: o's removed pods gone, then its added pods
// placed, in order, where they fit. Nothing is remembered.
//
// prio is the priority of the pod being scheduled: in a dry run, pods the
// scheduler is evicting already (and so soon gone) count as gone if their
// priority is below it.
func (c *deviceCache) evaluateWith(node *corev1.Node, o *nodeOverlay, in *evalInput, prio int32, capacity, free devicescheduler.Host, p *devicescheduler.Placement) (int64, error) {
	c.mu.RLock()
	ns, ok := c.lookup(node)
	if !ok {
		c.mu.RUnlock()
		return 0, errNoInventory
	}
	if err := c.usableAt(ns, in.now); err != nil {
		c.mu.RUnlock()
		return 0, err
	}
	n, idle := ns.devices.Clone(), ns.idle
	evicting, gone := c.preemptedOn(ns, math.MaxInt32), c.preemptedOn(ns, prio)
	c.mu.RUnlock()
	if o.dryRun {
		for _, uid := range gone {
			n.Release(string(uid))
		}
	}
	for uid := range o.removed {
		n.Release(string(uid))
	}
	h := holder{c: c, n: n, evicting: evicting}
	for _, a := range o.added {
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
func (c *deviceCache) preemptedOn(ns *nodeState, prio int32) []ktypes.UID {
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
	c *deviceCache
	n *devicescheduler.Node
	// evicting are the pods the scheduler is evicting from the node.
	evicting []ktypes.UID
	// gone is n with the evicted pods gone, made when first needed.
	gone *devicescheduler.Node
}

// place places nominated pod a on h.n. If it does not fit only because
// pods are still being evicted (a preemptor's victims), the free devices it
// will get once they are gone are held for it now.
func (h *holder) place(a addedPod, capacity, free devicescheduler.Host, p *devicescheduler.Placement) {
	e := h.c.engine
	if err := e.EvaluateHost(h.n, a.request, capacity, free, p); err == nil {
		alloc := p.Allocation()
		_ = h.n.AssumePlacement(string(a.uid), p, devicescheduler.Host{})
		if h.gone != nil {
			_ = h.gone.Assume(string(a.uid), alloc, devicescheduler.Host{})
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
	if err := e.EvaluateHost(h.gone, a.request, capacity, free, p); err != nil {
		return
	}
	alloc := p.Allocation()
	_ = h.gone.AssumePlacement(string(a.uid), p, devicescheduler.Host{})
	// Each device on its own: those still held by evicted pods are
	// not free to anyone anyway.
	for _, list := range [][]types.ContainerAllocation{alloc.InitContainers, alloc.Containers} {
		for _, ctr := range list {
			for _, d := range ctr.Devices {
				one := types.PodAllocation{Containers: []types.ContainerAllocation{{Name: ctr.Name, Devices: []types.DeviceShare{d}}}}
				_ = h.n.Assume(string(a.uid)+"/"+ctr.Name+"/"+d.ID, one, devicescheduler.Host{})
			}
		}
	}
}
