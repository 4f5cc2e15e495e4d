package mix

import (
	"cmp"
	"slices"

	corev1 "k8s.io/api/core/v1"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// Request is what pod adds to the mix: its device request if it holds
// devices (holdsDevices: the scheduler counts a verified allocation of it),
// or, for a pod without devices on a node with devices, its CPU and memory
// (it takes what idle devices beside it need). ok is false for a pod that
// adds nothing: one not bound, finished, asking for devices it does not
// hold, or whose request is invalid.
func Request(e *devicescheduler.Engine, pod *corev1.Pod, nodeHasDevices, holdsDevices bool) (r *devicescheduler.Request, ok bool) {
	if pod.Spec.NodeName == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil, false
	}
	cpu, mem := objects.HostRequest(pod)
	host := devicescheduler.Host{CPUMilli: cpu, MemoryMiB: mem}
	req := types.PodRequest{}
	if objects.WantsDevices(pod) {
		if !holdsDevices {
			return nil, false
		}
		var err error
		if req, err = objects.PodRequest(pod); err != nil {
			return nil, false
		}
	} else if !nodeHasDevices {
		return nil, false
	}
	r, err := e.NewRequest(req, host)
	return r, err == nil
}

// Observe adds pod to e's mix, weighed by its creation time, unless the
// mix already holds it. It reports whether the mix holds it.
func Observe(e *devicescheduler.Engine, pod *corev1.Pod, nodeHasDevices, holdsDevices bool) bool {
	id := string(pod.UID)
	if e.HasPod(id) {
		return true
	}
	r, ok := Request(e, pod, nodeHasDevices, holdsDevices)
	if ok {
		e.ObservePod(id, r, pod.CreationTimestamp.Time)
	}
	return ok
}

// Learn adds pods to e's mix, oldest first; hasDevices reports whether a
// node publishes devices, holds whether a pod holds devices. It returns how
// many pods the mix holds.
func Learn(e *devicescheduler.Engine, pods []*corev1.Pod, hasDevices func(node string) bool, holds func(*corev1.Pod) bool) int {
	pods = slices.Clone(pods)
	slices.SortFunc(pods, func(a, b *corev1.Pod) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.UID, b.UID)
	})
	for _, p := range pods {
		Observe(e, p, p.Spec.NodeName != "" && hasDevices(p.Spec.NodeName), holds(p))
	}
	return e.LearnedPods()
}
