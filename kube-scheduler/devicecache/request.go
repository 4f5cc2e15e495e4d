package devicecache

import (
	corev1 "k8s.io/api/core/v1"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// CompileRequest is pod's device request as engine e places it, from
// what the pod asks for (req, objects.PodRequest), host (what of its CPU
// and memory to count) and policy, its namespace's enforcement policy
// (objects.EnforcementPolicy). PreFilter compiles the pod being scheduled
// with it, AddPod the pods nominated to a node, and `kubegpu explain`
// both. extra are requests beside the pod's own: those of its
// ResourceClaims. An error says what of the pod's request to fix.
func CompileRequest(e *devicescheduler.Engine, pod *corev1.Pod, host devicescheduler.Host, policy types.EnforcementPolicy, extra ...types.ContainerRequest) (*devicescheduler.Request, types.PodRequest, error) {
	req, err := objects.PodRequest(pod)
	if err != nil {
		return nil, req, err
	}
	req.Containers = append(req.Containers, extra...)
	r, err := e.NewRequest(req, host)
	if err != nil {
		return nil, req, err
	}
	if err := r.SetEnforcement(policy); err != nil {
		return nil, req, err
	}
	return r, req, nil
}

// CompileVariants is CompileRequest for each variant of the requests of
// the pod's ResourceClaims (claims.Compile; none: the pod's own request
// alone): r and req with the first, others with the rest, in order.
// PreFilter and `kubegpu explain` compile with it.
func CompileVariants(e *devicescheduler.Engine, pod *corev1.Pod, host devicescheduler.Host, policy types.EnforcementPolicy, variants [][]types.ContainerRequest) (r *devicescheduler.Request, req types.PodRequest, others []*devicescheduler.Request, err error) {
	var first []types.ContainerRequest
	if len(variants) > 0 {
		first = variants[0]
	}
	if r, req, err = CompileRequest(e, pod, host, policy, first...); err != nil {
		return nil, req, nil, err
	}
	for i := 1; i < len(variants); i++ {
		o, _, err := CompileRequest(e, pod, host, policy, variants[i]...)
		if err != nil {
			return nil, req, nil, err
		}
		others = append(others, o)
	}
	return r, req, others, nil
}

// Nominee is what of pod np, nominated to node by preemption, the
// scheduler places there before the pod it schedules: its devices, compiled
// by compile (CompileRequest with its namespace's policy and no host
// resources: the framework counts its CPU and memory); false when np asks
// for none, when the cache counts its devices there already (it is assumed
// there), when it is bound (a pod preemption's dry run adds back that the
// cache does not count holds no devices), or when compile cannot compile
// its request. AddPod, Reserve and `kubegpu explain` all decide with it.
func (c *Cache) Nominee(np *corev1.Pod, node string, compile func(*corev1.Pod) (*devicescheduler.Request, bool)) (Added, bool) {
	if np.Spec.NodeName != "" || !objects.WantsDevices(np) || c.HoldsOn(np.UID, node) {
		return Added{}, false
	}
	r, ok := compile(np)
	if !ok {
		return Added{}, false
	}
	return Added{UID: np.UID, Request: r}, true
}
