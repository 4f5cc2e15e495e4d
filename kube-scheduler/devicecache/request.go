package devicecache

import (
	"cmp"
	"slices"

	corev1 "k8s.io/api/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// CompileRequest is pod's device request as engine e places it, from
// what the pod asks for (req, objects.PodRequest), host (what of its CPU
// and memory to count) and policy, its namespace's enforcement policy
// (objects.EnforcementPolicy). PreFilter compiles the pod being scheduled
// with it, AddPod the pods nominated to a node, and `kubegpu explain`
// both. An error says what of the pod's request to fix.
func CompileRequest(e *devicescheduler.Engine, pod *corev1.Pod, host devicescheduler.Host, policy types.EnforcementPolicy) (*devicescheduler.Request, types.PodRequest, error) {
	req, err := objects.PodRequest(pod)
	if err != nil {
		return nil, req, err
	}
	r, err := e.NewRequest(req, host)
	if err != nil {
		return nil, req, err
	}
	if err := r.SetEnforcement(policy); err != nil {
		return nil, req, err
	}
	return r, req, nil
}

// NominatedBefore lists by node, of pods, those the scheduler counts on
// their nominated node before it places pod there: pods that preemption
// nominated to a node and that are not bound yet, of pod's scheduler,
// other than pod, of at least its priority (the framework adds them to
// the node for a first pass of the filters, see Overlay). A scheduler
// adds a node's nominated pods in the order it nominated them, which the
// API does not show: here they are in the order of their creation, then
// of their names.
func NominatedBefore(pod *corev1.Pod, pods []*corev1.Pod) map[string][]*corev1.Pod {
	prio := corev1helpers.PodPriority(pod)
	out := map[string][]*corev1.Pod{}
	for _, p := range pods {
		node := p.Status.NominatedNodeName
		if node == "" || p.Spec.NodeName != "" || p.UID == pod.UID || p.Spec.SchedulerName != pod.Spec.SchedulerName || corev1helpers.PodPriority(p) < prio {
			continue
		}
		out[node] = append(out[node], p)
	}
	for _, list := range out {
		slices.SortFunc(list, func(a, b *corev1.Pod) int {
			if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
				return c
			}
			return cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
		})
	}
	return out
}
