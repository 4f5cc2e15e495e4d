package plugin

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
)

// PostFilter frees a kubegpu ResourceClaim that keeps the pod off every
// node, as the stock DynamicResources plugin frees its own: when nodes
// were refused because the pod's claims are allocated on another node
// (gone, full, cordoned, or one whose scheduler stopped between reserving
// the claim and binding the pod), a claim reserved for no other pod is
// deallocated, so that the next attempt allocates it wherever it fits.
// While another pod uses any of the pod's claims, none is: the pod waits
// for that node.
func (p *Plugin) PostFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, _ fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	s := getState(cs)
	if s == nil || s.claims == nil || !s.claimsElsewhere.Load() {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	var free *resourceapi.ResourceClaim
	for _, pc := range s.claims.claims {
		if !pc.Allocated() {
			continue
		}
		if r := pc.Claim.Status.ReservedFor; len(r) > 1 || len(r) == 1 && r[0].UID != pod.UID {
			return nil, fwk.NewStatus(fwk.Unschedulable)
		}
		if free == nil {
			free = pc.Claim
		}
	}
	if free == nil {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	c := free.DeepCopy()
	c.Status.ReservedFor, c.Status.Allocation, c.Status.Devices = nil, nil, nil
	// The claim as the tracker had it: a claim reserved or changed
	// since is a conflict, and stays.
	_, err := p.handle.ClientSet().ResourceV1().ResourceClaims(c.Namespace).UpdateStatus(ctx, c, metav1.UpdateOptions{})
	switch {
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		return nil, fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("GPUs: ResourceClaim %s changed while the pod was scheduled", c.Name))
	case err != nil:
		return nil, fwk.AsStatus(fmt.Errorf("GPUs: deallocate ResourceClaim %s: %w", klog.KObj(c), err))
	}
	klog.FromContext(ctx).V(2).Info("Deallocated a ResourceClaim that kept the pod off every node", "pod", klog.KObj(pod), "claim", klog.KObj(c), "node", s.claims.node)
	return nil, fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("GPUs: deallocated ResourceClaim %s, allocated on node %s, which does not take the pod", c.Name, s.claims.node))
}
