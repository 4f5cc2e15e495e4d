package tracepods

import (
	"math"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubegpu/kubegpu/device-scheduler/sim"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

// Host is the pod of a trace's pod without its GPUs: one container named
// main (image busybox) requesting the pod's CPU and memory.
func Host(p *sim.PodSpec, name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "main", Image: "busybox",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU:    *resource.NewMilliQuantity(p.CPUMilli, resource.DecimalSI),
					corev1.ResourceMemory: *resource.NewQuantity(p.MemoryMiB<<20, resource.BinarySI),
				}}}},
		},
	}
}

// AskGPUs gives pod's first container the trace pod's GPUs as kubegpu's
// resources: nvidia.com/gpu, with kubegpu.io/gpu-cores for a share of a
// GPU, and the trace's models as kubegpu.io/gpu-model-include. A pod of no
// GPUs is left as it is.
func AskGPUs(pod *corev1.Pod, p *sim.PodSpec) {
	if p.NumGPU == 0 {
		return
	}
	limits := corev1.ResourceList{kubeinterface.ResourceGPU: *resource.NewQuantity(int64(p.NumGPU), resource.DecimalSI)}
	if p.GPUMilli < 1000 {
		limits[kubeinterface.ResourceGPUCores] = *resource.NewQuantity(Cores(p), resource.DecimalSI)
	}
	pod.Spec.Containers[0].Resources.Limits = limits
	if len(p.GPUSpec) > 0 {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[kubeinterface.AnnotationModelInclude] = strings.Join(p.GPUSpec, ",")
	}
}

// Cores is a share of a GPU's compute in per cent, as kubegpu.io/gpu-cores
// and the claims' capacity request "cores" take it.
func Cores(p *sim.PodSpec) int64 { return int64(max(1, int(math.Round(float64(p.GPUMilli)/10)))) }
