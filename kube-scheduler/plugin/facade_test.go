package plugin

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/kubeinterface/dra"
)

// claimMap is a claims.Getter over a map by name.
type claimMap map[string]*resourceapi.ResourceClaim

func (m claimMap) Get(_, name string) (*resourceapi.ResourceClaim, error) {
	if c, ok := m[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("resourceclaims"), name)
}

func classClaim(name string, classes ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
	for i, class := range classes {
		c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, resourceapi.DeviceRequest{Name: string(rune('a' + i)),
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}})
	}
	return c
}

// TestFacadeHidesKubegpuClaims: the stock plugin sees a pod's claims of
// other classes, a claim not yet created and a mixed one (which it waits
// for or fails on), never kubegpu's; a pod without kubegpu claims is
// passed as it is.
func TestFacadeHidesKubegpuClaims(t *testing.T) {
	f := &Facade{claims: claimMap{
		"gpus":  classClaim("gpus", dra.ClassName),
		"nic":   classClaim("nic", "nic.example.com"),
		"mixed": classClaim("mixed", dra.ClassName, "nic.example.com"),
		"tmpl":  classClaim("tmpl", dra.ClassName),
	}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{
		{Name: "gpu", ResourceClaimName: ptr.To("gpus")},
		{Name: "nic", ResourceClaimName: ptr.To("nic")},
		{Name: "mixed", ResourceClaimName: ptr.To("mixed")},
		{Name: "missing", ResourceClaimName: ptr.To("missing")},
		{Name: "fromtemplate", ResourceClaimTemplateName: ptr.To("t")},
		{Name: "pending", ResourceClaimTemplateName: ptr.To("t")},
	}}, Status: corev1.PodStatus{ResourceClaimStatuses: []corev1.PodResourceClaimStatus{
		{Name: "fromtemplate", ResourceClaimName: ptr.To("tmpl")},
	}}}
	hidden := f.hide(pod)
	var names []string
	for _, pc := range hidden.Spec.ResourceClaims {
		names = append(names, pc.Name)
	}
	if want := []string{"nic", "mixed", "missing", "pending"}; !slices.Equal(names, want) {
		t.Errorf("the stock plugin sees claims %v, want %v", names, want)
	}
	if len(hidden.Status.ResourceClaimStatuses) != 0 {
		t.Errorf("the stock plugin sees the statuses %v of kubegpu's claims", hidden.Status.ResourceClaimStatuses)
	}
	if len(pod.Spec.ResourceClaims) != 6 || len(pod.Status.ResourceClaimStatuses) != 1 {
		t.Errorf("the pod itself was changed")
	}
	other := &corev1.Pod{Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "nic", ResourceClaimName: ptr.To("nic")}}}}
	if f.hide(other) != other {
		t.Errorf("a pod without kubegpu claims was copied")
	}
}

// TestFacadeArgs: the facade's args are DynamicResourcesArgs, defaulted;
// a misspelt field is an error.
func TestFacadeArgs(t *testing.T) {
	if _, err := facadeArgs(nil); err != nil {
		t.Errorf("no args: %v", err)
	}
	args, err := facadeArgs(&runtime.Unknown{Raw: []byte(`{"filterTimeout":"3s"}`)})
	if err != nil || args.FilterTimeout == nil || args.FilterTimeout.Duration != 3*time.Second {
		t.Errorf("filterTimeout 3s: %+v, %v", args, err)
	}
	if _, err := facadeArgs(&runtime.Unknown{Raw: []byte(`{"filterTimout":"3s"}`)}); err == nil {
		t.Error("a misspelt field was accepted")
	}
}
