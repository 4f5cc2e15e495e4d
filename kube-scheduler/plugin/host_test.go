package plugin

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/types"
)

func resources(cpu, memory string) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Requests: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory),
	}}
}

// TestHostResources checks how the plugin reads a pod's and a node's CPU
// and memory: as the scheduler counts them.
func TestHostResources(t *testing.T) {
	pod := testPod("p")
	pod.Spec.InitContainers = []corev1.Container{{Name: "init", Resources: resources("6", "1Gi")}}
	pod.Spec.Containers = []corev1.Container{
		{Name: "a", Resources: resources("2", "1536Ki")},
		{Name: "b", Resources: resources("1500m", "2Mi")},
	}
	// The init container's 6 CPUs outweigh the app containers' 3.5; memory
	// rounds down to MiB (1.5 MiB + 2 MiB).
	if got, want := podHost(pod), (devicescheduler.Host{CPUMilli: 6000, MemoryMiB: 1024}); got != want {
		t.Errorf("podHost = %+v, want %+v", got, want)
	}

	node := testNode(t, "n1", "t4x4")
	node.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("32"), corev1.ResourceMemory: resource.MustParse("64Gi")}
	running := testPod("running")
	running.Spec.Containers = []corev1.Container{{Name: "c", Resources: resources("30", "63Gi")}}
	ni := framework.NewNodeInfo(running)
	ni.SetNode(node)
	capacity, free := nodeHost(ni)
	if want := (devicescheduler.Host{CPUMilli: 32000, MemoryMiB: 64 << 10}); capacity != want {
		t.Errorf("nodeHost capacity = %+v, want %+v", capacity, want)
	}
	if want := (devicescheduler.Host{CPUMilli: 2000, MemoryMiB: 1 << 10}); free != want {
		t.Errorf("nodeHost free = %+v, want %+v", free, want)
	}
}

// TestCacheEvaluatesWithHost: Filter results are remembered per host state,
// and a pod whose CPU does not fit beside the node's pods is refused.
func TestCacheEvaluatesWithHost(t *testing.T) {
	c, _ := testCache(t)
	c.updateNode(klog.Background(), testNode(t, "n1", "t4x4"))
	c.updateLease(testLease("n1", testNow))
	r, err := c.engine.NewRequest(types.PodRequest{Containers: []types.ContainerRequest{{Name: "main", Count: 1}}}, devicescheduler.Host{CPUMilli: 4000, MemoryMiB: 1024})
	if err != nil {
		t.Fatal(err)
	}
	in := c.evalInput("host", r)
	capacity := devicescheduler.Host{CPUMilli: 32000, MemoryMiB: 64 << 10}
	var p devicescheduler.Placement
	if _, err := c.evaluate("n1", &in, capacity, capacity, &p); err != nil {
		t.Fatalf("on an idle node: %v", err)
	}
	busy := devicescheduler.Host{CPUMilli: 3000, MemoryMiB: 64 << 10}
	var nf *devicescheduler.NotFitError
	if _, err := c.evaluate("n1", &in, capacity, busy, &p); !errors.As(err, &nf) || nf.Reason != devicescheduler.ReasonHostResources {
		t.Fatalf("with 3 CPUs free: %v, want %s (a stale memo?)", err, devicescheduler.ReasonHostResources)
	}
	if _, err := c.evaluate("n1", &in, capacity, capacity, &p); err != nil {
		t.Fatalf("idle again: %v", err)
	}
}
