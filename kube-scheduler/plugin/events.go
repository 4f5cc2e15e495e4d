package plugin

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// EventsToRegister lists the events that may make a pod this plugin
// rejected schedulable: a node's inventory appearing or changing, and a pod
// that held devices going away. The hints only decide: the queue calls them
// holding its own lock, so they must not change the device cache or call
// into the queue. The cache, once it has applied such an event, also wakes
// the pods it refused for it (see waitSet): its handler and the queue's run
// in no set order.
func (p *Plugin) EventsToRegister(context.Context) ([]fwk.ClusterEventWithHint, error) {
	return []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add | fwk.UpdateNodeAnnotation}, QueueingHintFn: inventoryChanged},
		{Event: fwk.ClusterEvent{Resource: fwk.Pod, ActionType: fwk.Delete}, QueueingHintFn: heldDevices},
		{Event: fwk.ClusterEvent{Resource: fwk.ResourceClaim, ActionType: fwk.Add | fwk.Update | fwk.Delete}, QueueingHintFn: claimChanged},
		{Event: fwk.ClusterEvent{Resource: fwk.ResourceSlice, ActionType: fwk.Add | fwk.Update}, QueueingHintFn: hasClaims},
	}, nil
}

func inventoryChanged(_ klog.Logger, _ *corev1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	n, ok := newObj.(*corev1.Node)
	if !ok {
		return fwk.Queue, nil
	}
	if old, ok := oldObj.(*corev1.Node); ok && old.Annotations[kubeinterface.AnnotationInventory] == n.Annotations[kubeinterface.AnnotationInventory] {
		return fwk.QueueSkip, nil
	}
	if _, has := n.Annotations[kubeinterface.AnnotationInventory]; !has {
		return fwk.QueueSkip, nil
	}
	return fwk.Queue, nil
}

// hasClaims wakes the pods with ResourceClaims when devices are published:
// their selectors may pass now.
func hasClaims(_ klog.Logger, pod *corev1.Pod, _, _ any) (fwk.QueueingHint, error) {
	if len(pod.Spec.ResourceClaims) == 0 {
		return fwk.QueueSkip, nil
	}
	return fwk.Queue, nil
}

// claimChanged wakes a pod when one of its own ResourceClaims changed
// (created, written, released), or when any claim went (its devices are
// free).
func claimChanged(_ klog.Logger, pod *corev1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	if newObj == nil {
		return fwk.Queue, nil
	}
	c, ok := newObj.(*resourcev1.ResourceClaim)
	if !ok || c.Namespace != pod.Namespace {
		return fwk.QueueSkip, nil
	}
	for i := range pod.Spec.ResourceClaims {
		if name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i]); err == nil && name != nil && *name == c.Name {
			return fwk.Queue, nil
		}
	}
	if old, ok := oldObj.(*resourcev1.ResourceClaim); ok && old.Status.Allocation != nil && c.Status.Allocation == nil {
		return fwk.Queue, nil // released: its devices are free
	}
	return fwk.QueueSkip, nil
}

func heldDevices(_ klog.Logger, _ *corev1.Pod, oldObj, _ any) (fwk.QueueingHint, error) {
	if d, ok := oldObj.(toolscache.DeletedFinalStateUnknown); ok {
		oldObj = d.Obj
	}
	// An assumed pod whose binding failed comes without the allocation
	// (it travels in the Binding): a bound or assumed GPU pod is enough.
	if pod, ok := oldObj.(*corev1.Pod); ok && (pod.Spec.NodeName == "" || !objects.WantsDevices(pod)) {
		return fwk.QueueSkip, nil
	}
	return fwk.Queue, nil
}
