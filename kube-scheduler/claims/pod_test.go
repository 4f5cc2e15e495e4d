package claims

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
)

// getter holds claims by name.
type getter map[string]*resourceapi.ResourceClaim

func (g getter) Get(_, name string) (*resourceapi.ResourceClaim, error) {
	if c, ok := g[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("resourceclaims"), name)
}

// TestForPodSliceServesOnePod: a claim holding a GPU slice serves one pod
// at a time (each pod's slice limits are its own); a claim of whole GPUs
// is shared.
func TestForPodSliceServesOnePod(t *testing.T) {
	key, err := kubeinterface.NewHMACKey([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	allocated := func(name string, share types.DeviceShare, reservedFor ...ktypes.UID) *resourceapi.ResourceClaim {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: ktypes.UID("uid-" + name)},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
				Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.ClassName}}}}}}
		cfg, err := dra.SignedConfigFor(key.Sign, kubeinterface.PodRef{Namespace: "ns", Name: name, UID: c.UID},
			types.PodAllocation{Node: "n1", Containers: []types.ContainerAllocation{{Name: dra.ClaimEntry("gpu", "gpu"), Devices: []types.DeviceShare{share}}}})
		if err != nil {
			t.Fatal(err)
		}
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Config: []resourceapi.DeviceAllocationConfiguration{cfg}}}
		for _, uid := range reservedFor {
			c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "pod-" + string(uid), UID: uid})
		}
		return c
	}
	slice := types.DeviceShare{ID: "gpu0", UUID: "GPU-0", MemoryMiB: 4096, ComputePercent: 60}
	whole := types.DeviceShare{ID: "gpu1", UUID: "GPU-1", Exclusive: true, MemoryMiB: 16000, ComputePercent: 100}
	claims := getter{
		"slice-used": allocated("slice-used", slice, "a"),
		"slice-mine": allocated("slice-mine", slice, "b"),
		"slice-free": allocated("slice-free", slice),
		"whole-used": allocated("whole-used", whole, "a"),
	}
	pod := func(claim string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b", UID: "b"},
			Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}}}}
	}
	if _, err := ForPod(pod("slice-used"), claims, nil); !errors.Is(err, ErrWaiting) || !strings.Contains(err.Error(), "serves one pod at a time") || !strings.Contains(err.Error(), "pods pod-a") {
		t.Errorf("a slice claim another pod uses: %v, want ErrWaiting naming the pod", err)
	}
	for _, name := range []string{"slice-mine", "slice-free", "whole-used"} {
		if pcs, err := ForPod(pod(name), claims, nil); err != nil || len(pcs) != 1 {
			t.Errorf("claim %s: %v, %v; want it", name, pcs, err)
		}
	}
}

// TestForPodSliceTwoContainers: containers that run at the same time may
// not name one slice claim (each container's slice limits are its own);
// a plain init container before them, different requests, and a claim of
// whole GPUs may.
func TestForPodSliceTwoContainers(t *testing.T) {
	claim := func(name string, capacity bool) *resourceapi.ResourceClaim {
		r := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.ClassName}}
		if capacity {
			r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{dra.CapacityCores: resource.MustParse("30")}}
		}
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{r, {Name: "other", Exactly: r.Exactly.DeepCopy()}}}}}
	}
	claims := getter{"slice": claim("slice", true), "whole": claim("whole", false)}
	ctr := func(name string, requests ...string) corev1.Container {
		c := corev1.Container{Name: name}
		for _, r := range requests {
			c.Resources.Claims = append(c.Resources.Claims, corev1.ResourceClaim{Name: "gpu", Request: r})
		}
		return c
	}
	sidecar := ctr("sidecar", "")
	sidecar.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
	for _, c := range []struct {
		claim      string
		init, main []corev1.Container
		refused    string
	}{
		{"slice", nil, []corev1.Container{ctr("a", ""), ctr("b", "")}, "containers a and b"},
		{"slice", nil, []corev1.Container{ctr("a", "gpu"), ctr("b", "gpu")}, "containers a and b"},
		{"slice", []corev1.Container{sidecar}, []corev1.Container{ctr("a", "gpu")}, "containers sidecar and a"},
		{"slice", []corev1.Container{sidecar, ctr("init", "")}, []corev1.Container{ctr("a")}, "containers sidecar and init"},
		{"slice", []corev1.Container{ctr("init", "")}, []corev1.Container{ctr("a", "")}, ""},
		{"slice", nil, []corev1.Container{ctr("a", "gpu"), ctr("b", "other")}, ""},
		{"whole", nil, []corev1.Container{ctr("a", ""), ctr("b", "")}, ""},
	} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "p"}, Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(c.claim)}}, InitContainers: c.init, Containers: c.main}}
		_, err := ForPod(pod, claims, nil)
		switch {
		case c.refused == "" && err != nil:
			t.Errorf("%+v: %v, want none", c, err)
		case c.refused != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.refused)):
			t.Errorf("%+v: %v, want ErrInvalid naming %s", c, err, c.refused)
		}
	}
}
