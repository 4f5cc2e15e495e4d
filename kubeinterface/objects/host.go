package objects

import (
	corev1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/kubegpu/kubegpu/kubeinterface"
)

// HostRequest is the pod's CPU (millicores) and memory (MiB) request as
// kube-scheduler counts it: init containers, sidecars, pod-level resources
// and overhead included. Memory is rounded down to MiB, as NodeHost's free
// memory is, so that a pod that fits by bytes fits by MiB too.
func HostRequest(pod *corev1.Pod) (cpuMilli, memoryMiB int64) {
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	return reqs.Cpu().MilliValue(), reqs.Memory().Value() >> 20
}

// HostRequestBytes is the CPU (millicores) and memory (bytes) the pod
// asks for, as the scheduler counts them on its node.
func HostRequestBytes(pod *corev1.Pod) (cpuMilli, memory int64) {
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	return reqs.Cpu().MilliValue(), reqs.Memory().Value()
}

// NodeHost is the node's allocatable CPU (millicores) and memory (MiB).
func NodeHost(node *corev1.Node) (cpuMilli, memoryMiB int64) {
	a := node.Status.Allocatable
	return a.Cpu().MilliValue(), a.Memory().Value() >> 20
}

// PodShare is what quota counts of the pod in
// requests.kubegpu.io/gpu-share, as ResourceQuota counts requests: the
// share the admission policy kubegpu-gpu-share wrote on its containers.
func PodShare(pod *corev1.Pod) int64 {
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{SkipPodLevelResources: true, ExcludeOverhead: true})
	share := reqs[corev1.ResourceName(kubeinterface.ResourceGPUShare)]
	return share.Value()
}
