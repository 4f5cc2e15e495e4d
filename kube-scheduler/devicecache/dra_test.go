package devicecache

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"

	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache/cachetest"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// foreignSlice is a ResourceSlice of driver on node whose one device
// carries attrs.
func foreignSliceOf(name, driver, node string, attrs map[resourceapi.QualifiedName]string) *resourceapi.ResourceSlice {
	a := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	for k, v := range attrs {
		a[k] = resourceapi.DeviceAttribute{StringValue: &v}
	}
	return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.ResourceSliceSpec{
		Driver: driver, NodeName: &node, Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
		Devices: []resourceapi.Device{{Name: "gpu-0", Attributes: a}}}}
}

// TestDRADriverConflict: a node whose GPU another DRA driver publishes
// (by UUID, or by PCI bus ID however its domain is written) gets no GPU
// pods, unresolvably, the refusal naming the driver; the node is usable
// again once the slice is gone or no longer overlaps, and the pods refused
// meanwhile are activated. kubegpu's own slices and slices of other nodes
// or of no node change nothing.
func TestDRADriverConflict(t *testing.T) {
	var activated []string
	c := New(Config{Engine: cachetest.Engine(t), Staleness: 40 * time.Second, Now: func() time.Time { return testNow },
		Activate: func(pods map[string]*corev1.Pod) {
			for k := range pods {
				activated = append(activated, k)
			}
		}})
	logger := klog.Background()
	node := cachetest.Node(t, "n1", "t4x4")
	c.UpdateNode(logger, node)
	c.UpdateLease(cachetest.Lease("n1", testNow), false)
	inv, err := objects.NodeInventory(node)
	if err != nil {
		t.Fatal(err)
	}
	gpu := inv.Devices[2]
	in := c.InputOnce(wholeRequest(t, c, 1))
	evaluate := func() error {
		var p devicescheduler.Placement
		_, err := c.Evaluate(node, &in, noHost, noHost, &p)
		return err
	}
	if err := evaluate(); err != nil {
		t.Fatalf("before any slice: %v", err)
	}
	for _, s := range []*resourceapi.ResourceSlice{
		foreignSliceOf("own", dra.DriverName, "n1", map[resourceapi.QualifiedName]string{"uuid": gpu.UUID}),
		foreignSliceOf("elsewhere", "gpu.example.com", "n2", map[resourceapi.QualifiedName]string{"uuid": gpu.UUID}),
		foreignSliceOf("other-gpu", "gpu.example.com", "n1", map[resourceapi.QualifiedName]string{"uuid": "GPU-not-here"}),
	} {
		c.UpdateResourceSlice(logger, s)
		if err := evaluate(); err != nil {
			t.Fatalf("slice %s: %v", s.Name, err)
		}
	}
	for _, tc := range []struct {
		name  string
		attrs map[resourceapi.QualifiedName]string
	}{
		{"uuid", map[resourceapi.QualifiedName]string{"uuid": strings.ToLower(gpu.UUID)}},
		{"qualified uuid", map[resourceapi.QualifiedName]string{"gpu.example.com/uuid": gpu.UUID}},
		{"pci bus id", map[resourceapi.QualifiedName]string{dra.AttributePCIBusID: "0000" + strings.ToUpper(gpu.PCIBusID)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			activated = nil
			c.UpdateResourceSlice(logger, foreignSliceOf("theirs", "gpu.example.com", "n1", tc.attrs))
			err := evaluate()
			r := Classify(err)
			if !errors.Is(err, ErrDRA) || !r.Unresolvable || r.Reason != ReasonDRA || !strings.Contains(r.Message, "gpu.example.com") {
				t.Fatalf("refusal = %+v (%v), want an unresolvable DRA refusal naming the driver", r, err)
			}
			if d := r.Detail(); !strings.Contains(d, gpu.ID) || !strings.Contains(d, "ResourceSlice theirs") {
				t.Errorf("Detail() = %q, want the GPU and the slice named", d)
			}
			if got := (*DriverConflict)(nil); !errors.As(err, &got) || got.Driver != "gpu.example.com" {
				t.Errorf("conflict = %+v", got)
			}
			c.WaitForDRA(cachetest.Pod("waiting"))
			c.DeleteResourceSlice(logger, "theirs")
			if err := evaluate(); err != nil {
				t.Fatalf("after the slice is gone: %v", err)
			}
			if len(activated) != 1 || activated[0] != "ns/waiting" {
				t.Errorf("activated %v, want the waiting pod", activated)
			}
		})
	}
	// A conflict survives the node's inventory being rebuilt, and ends
	// when the slice stops publishing the GPU.
	c.UpdateResourceSlice(logger, foreignSliceOf("theirs", "gpu.example.com", "n1", map[resourceapi.QualifiedName]string{"uuid": gpu.UUID}))
	rebuilt := node.DeepCopy()
	rebuilt.Annotations[kubeinterface.AnnotationInventory] += " "
	c.UpdateNode(logger, rebuilt)
	if err := evaluate(); !errors.Is(err, ErrDRA) {
		t.Fatalf("after a rebuild: %v, want the conflict kept", err)
	}
	c.UpdateResourceSlice(logger, foreignSliceOf("theirs", "gpu.example.com", "n1", map[resourceapi.QualifiedName]string{"uuid": "GPU-other"}))
	if err := evaluate(); err != nil {
		t.Fatalf("after the slice stopped publishing the GPU: %v", err)
	}
}

// TestDRAServes: a pod asking for a resource that a DeviceClass maps to
// DRA is DRA's on a node that advertises none of it (also one the cache
// knows nothing of: a DRA node), and kubegpu's where the node advertises
// it; pods that do not ask for the resource are not affected.
func TestDRAServes(t *testing.T) {
	c := New(Config{Engine: cachetest.Engine(t), Staleness: 40 * time.Second, Now: func() time.Time { return testNow }})
	logger := klog.Background()
	without := cachetest.Node(t, "without", "t4x4")
	with := cachetest.Node(t, "with", "t4x4")
	with.Status.Allocatable = corev1.ResourceList{kubeinterface.ResourceGPU: resource.MustParse("400")}
	for _, n := range []*corev1.Node{without, with} {
		c.UpdateNode(logger, n)
		c.UpdateLease(cachetest.Lease(n.Name, testNow), false)
	}
	name := kubeinterface.ResourceGPU
	c.UpdateDeviceClass(&resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "other"}})
	c.UpdateDeviceClass(&resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpus"}, Spec: resourceapi.DeviceClassSpec{ExtendedResourceName: &name}})
	evaluate := func(pod *corev1.Pod, node *corev1.Node) error {
		in := c.InputOnce(wholeRequest(t, c, 1))
		c.ForPod(&in, pod)
		var p devicescheduler.Placement
		_, err := c.Evaluate(node, &in, noHost, noHost, &p)
		return err
	}
	pod := cachetest.GPUPod("p", 1, 0, testNow)
	for _, node := range []*corev1.Node{without, cachetest.Named("unknown")} {
		var s *DRAServes
		if err := evaluate(pod, node); !errors.As(err, &s) || s.Class != "gpus" || s.Resource != corev1.ResourceName(name) {
			t.Errorf("on node %s, advertising no %s: %v, want DRA's through DeviceClass gpus", node.Name, name, err)
		}
	}
	if err := evaluate(pod, with); err != nil {
		t.Errorf("on a node advertising %s: %v", name, err)
	}
	if err := evaluate(cachetest.Pod("annotations-only"), without); err != nil {
		t.Errorf("pod not asking for %s: %v", name, err)
	}
	c.DeleteDeviceClass("gpus")
	if err := evaluate(pod, without); err != nil {
		t.Errorf("after the class is gone: %v", err)
	}
}
