package objects

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

func TestNodeInventoryRoundTrip(t *testing.T) {
	inv := types.Inventory{Devices: []types.Device{{ID: "gpu0", UUID: "GPU-0", Vendor: types.VendorNVIDIA, Model: "T4", MemoryMiB: 15360, Health: types.Healthy}}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	if err := SetNodeInventory(node, inv); err != nil {
		t.Fatalf("SetNodeInventory() error = %v", err)
	}
	got, err := NodeInventory(node)
	if err != nil || len(got.Devices) != 1 || got.Devices[0].UUID != "GPU-0" {
		t.Fatalf("NodeInventory() = %+v, %v", got, err)
	}
}

func TestNodeInventoryMissing(t *testing.T) {
	_, err := NodeInventory(&corev1.Node{})
	if !errors.Is(err, kubeinterface.ErrNoInventory) || errors.Is(err, kubeinterface.ErrInvalid) {
		t.Errorf("NodeInventory() error = %v, want kubeinterface.ErrNoInventory only", err)
	}
}

func TestPodAllocationMissing(t *testing.T) {
	if _, err := PodAllocation(&corev1.Pod{}); !errors.Is(err, kubeinterface.ErrNoAllocation) {
		t.Errorf("PodAllocation() error = %v, want ErrNoAllocation", err)
	}
}

func FuzzPodRequest(f *testing.F) {
	f.Add("1", "4096", "30", "T4,V100", "GPU-1", "required", "spread", uint8(0), "", "")
	f.Add("2", "", "150", ",", "", "strict", "pack", uint8(1), "", "")
	f.Add("0", "4Gi", "", "A,a", "GPU-1", "", "", uint8(2), "1000", "8Gi")
	f.Add("1e3", "1500m", "-5", "", "", "none", "binpack", uint8(3), "64001", "3")
	f.Add("3", "", "", "", "", "", "", uint8(2), "1", "1")
	f.Fuzz(func(t *testing.T, count, mem, cores, models, uuids, topology, placement string, kind uint8, milli, memMax string) {
		limits := corev1.ResourceList{}
		device := corev1.ResourceName(types.DeviceResources()[int(kind)%len(types.DeviceResources())])
		for name, v := range map[corev1.ResourceName]string{device: count, kubeinterface.ResourceGPUMemory: mem, kubeinterface.ResourceGPUCores: cores,
			kubeinterface.ResourceIntelMillicores: milli, kubeinterface.ResourceIntelMemoryMax: memMax} {
			if q, err := resource.ParseQuantity(v); err == nil {
				limits[name] = q
			}
		}
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Annotations: map[string]string{
				kubeinterface.AnnotationModelInclude: models, kubeinterface.AnnotationUUIDExclude: uuids,
				kubeinterface.AnnotationTopology: topology, kubeinterface.AnnotationPlacement: placement,
			}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: limits}}}},
		}
		req, err := PodRequest(p)
		if err != nil {
			if !errors.Is(err, kubeinterface.ErrInvalid) {
				t.Fatalf("PodRequest() error %v does not wrap kubeinterface.ErrInvalid", err)
			}
			return
		}
		for _, c := range req.Containers {
			if c.Count < 1 || c.Count > MaxDevicesPerContainer || c.ComputePercent < 0 || c.ComputePercent > 100 ||
				c.MemoryMiB < 0 || c.MemoryMiB > MaxSliceMemoryMiB {
				t.Fatalf("PodRequest() accepted out-of-range request %+v", c)
			}
		}
	})
}

func TestHostRequestAndNodeHost(t *testing.T) {
	res := func(cpu, mem string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}}
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "init", Resources: res("6", "1Gi")}},
		Containers:     []corev1.Container{{Name: "a", Resources: res("2", "1536Ki")}, {Name: "b", Resources: res("1500m", "2Mi")}},
		Overhead:       corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")},
	}}
	// The init container's 6 CPUs outweigh the app containers' 3.5, plus
	// the overhead; memory rounds down to MiB.
	if cpu, mem := HostRequest(pod); cpu != 6250 || mem != 1024 {
		t.Errorf("HostRequest = %d m, %d MiB; want 6250 m, 1024 MiB", cpu, mem)
	}
	node := &corev1.Node{Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("31500m"), corev1.ResourceMemory: resource.MustParse("64Gi")}}}
	if cpu, mem := NodeHost(node); cpu != 31500 || mem != 64<<10 {
		t.Errorf("NodeHost = %d m, %d MiB; want 31500 m, 65536 MiB", cpu, mem)
	}
	if cpu, mem := NodeHost(&corev1.Node{}); cpu != 0 || mem != 0 {
		t.Errorf("NodeHost of a node without allocatable = %d m, %d MiB; want zero", cpu, mem)
	}
}
