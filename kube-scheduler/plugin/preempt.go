package plugin

import (
	"context"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
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
	nodes map[string]*devicecache.Overlay
}

func (s *overlayState) Clone() fwk.StateData {
	return &overlayState{nodes: maps.Clone(s.nodes)}
}

// editOverlay returns a copy of node's overlay in cs to change, and stores it.
func editOverlay(cs fwk.CycleState, node string) *devicecache.Overlay {
	s := readState[*overlayState](cs, overlayKey)
	if s == nil {
		s = &overlayState{nodes: map[string]*devicecache.Overlay{}}
		cs.Write(overlayKey, s)
	}
	o := &devicecache.Overlay{Removed: map[ktypes.UID]struct{}{}}
	if old := s.nodes[node]; old != nil {
		o.Removed = maps.Clone(old.Removed)
		o.Added = slices.Clone(old.Added)
		o.DryRun = old.DryRun
	}
	s.nodes[node] = o
	return o
}

// overlayOf is node's overlay in cs, or nil.
func overlayOf(cs fwk.CycleState, node string) *devicecache.Overlay {
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
		if _, ok := o.Removed[pod.UID]; ok {
			delete(editOverlay(cs, node).Removed, pod.UID)
			return nil
		}
	}
	// Its devices only: the framework counts its CPU and memory (the
	// NodeInfo has it added already). One counted already, or with an
	// invalid request, gets none.
	a, ok := p.cache.Nominee(pod, node, p.compileNominee)
	if !ok {
		return nil
	}
	o := editOverlay(cs, node)
	o.Added = append(o.Added, a)
	return nil
}

// RemovePod counts the devices podInfoToRemove holds on the node as free.
func (p *Plugin) RemovePod(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, podInfoToRemove fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	if getState(cs) == nil {
		return nil
	}
	pod, node := podInfoToRemove.GetPod(), nodeInfo.Node().Name
	if o := overlayOf(cs, node); o != nil {
		if i := slices.IndexFunc(o.Added, func(a devicecache.Added) bool { return a.UID == pod.UID }); i >= 0 {
			e := editOverlay(cs, node)
			e.Added = slices.Delete(e.Added, i, i+1)
			return nil
		}
	}
	o := editOverlay(cs, node)
	o.DryRun = true
	// Also a pod that holds no devices of its own: the claims it alone
	// is reserved for are freed with it.
	o.Removed[pod.UID] = struct{}{}
	return nil
}
