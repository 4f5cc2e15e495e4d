package dra

import (
	"errors"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

func request(name, class string) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}
}

func TestOurs(t *testing.T) {
	claim := func(reqs ...resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}}}
	}
	alternatives := resourceapi.DeviceRequest{Name: "alt", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "a", DeviceClassName: ClassName}, {Name: "b", DeviceClassName: "other"}}}
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		ours  bool
		mixed bool
	}{
		{"kubegpu's", claim(request("a", ClassName), request("b", ClassName)), true, false},
		{"another driver's", claim(request("a", "other")), false, false},
		{"none", claim(), false, false},
		{"mixed", claim(request("a", ClassName), request("b", "other")), false, true},
		{"mixed alternatives", claim(alternatives), false, true},
	} {
		ours, err := Ours(tc.claim)
		if ours != tc.ours || errors.Is(err, ErrMixedClaim) != tc.mixed {
			t.Errorf("%s: Ours = %v, %v; want %v, mixed %v", tc.name, ours, err, tc.ours, tc.mixed)
		}
	}
}

func TestSignedConfigRoundTrip(t *testing.T) {
	key, err := kubeinterface.NewHMACKey([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := key.Sign(kubeinterface.Allocation{Pod: kubeinterface.PodRef{Namespace: "ns", Name: "claim", UID: "u1"},
		PodAllocation: types.PodAllocation{Node: "n1", Containers: []types.ContainerAllocation{{Name: "claim/gpu/gpus",
			Devices: []types.DeviceShare{{ID: "gpu0", UUID: "GPU-0", Exclusive: true}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	value, err := kubeinterface.EncodeAllocation(a)
	if err != nil {
		t.Fatal(err)
	}
	c, err := SignedConfig(value)
	if err != nil {
		t.Fatal(err)
	}
	// Another driver's configuration beside it is ignored.
	other := resourceapi.DeviceAllocationConfiguration{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
		Driver: "other.example.com", Parameters: runtime.RawExtension{Raw: []byte(`{"x":1}`)}}}}
	alloc := &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Config: []resourceapi.DeviceAllocationConfiguration{other, c}}}
	got, gotValue, err := SignedValue(alloc)
	if err != nil || gotValue != value {
		t.Fatalf("SignedValue = %q, %v; want %q", gotValue, err, value)
	}
	if err := kubeinterface.NewKeySet(key).Verify(got); err != nil {
		t.Errorf("the allocation read back does not verify: %v", err)
	}
	// Two of them, none, or a forged kind are refused.
	alloc.Devices.Config = append(alloc.Devices.Config, c)
	if _, _, err := SignedValue(alloc); err == nil || !strings.Contains(err.Error(), "want one") {
		t.Errorf("two signed configurations: %v", err)
	}
	if _, _, err := SignedValue(&resourceapi.AllocationResult{}); !errors.Is(err, ErrNotSigned) {
		t.Errorf("none: %v, want ErrNotSigned", err)
	}
	forged := c.DeepCopy()
	forged.Opaque.Parameters.Raw = []byte(`{"apiVersion":"gpu.kubegpu.io/v1","kind":"Other","allocation":""}`)
	alloc.Devices.Config = []resourceapi.DeviceAllocationConfiguration{*forged}
	if _, _, err := SignedValue(alloc); err == nil || errors.Is(err, ErrNotSigned) {
		t.Errorf("another kind: %v, want an error naming it", err)
	}
}

// FuzzSignedValue: whatever a claim's configuration holds, SignedValue
// returns an error or a valid allocation, and never panics.
func FuzzSignedValue(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"gpu.kubegpu.io/v1","kind":"SignedAllocation","allocation":"{}"}`))
	f.Add([]byte(`{"apiVersion":"gpu.kubegpu.io/v1","kind":"SignedAllocation","allocation":"{\"apiVersion\":\"kubegpu.io/v1\",\"kind\":\"PodAllocation\"}"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		alloc := &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Config: []resourceapi.DeviceAllocationConfiguration{{
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: DriverName, Parameters: runtime.RawExtension{Raw: raw}}}}}}}
		a, _, err := SignedValue(alloc)
		if err == nil {
			if verr := a.Validate(); verr != nil {
				t.Fatalf("SignedValue accepted an invalid allocation: %v", verr)
			}
		}
	})
}

func TestClaimEntry(t *testing.T) {
	for _, req := range []string{"gpus", "gpus/big", "a/b"} {
		e := ClaimEntry("pc", req)
		if !IsClaimEntry(e) || !ClaimEntryOf(e, "pc") || ClaimEntryOf(e, "p") {
			t.Errorf("%s: not recognized as the entry of claim pc", e)
		}
		if got, ok := ClaimEntryRequest(e); !ok || got != req {
			t.Errorf("ClaimEntryRequest(%q) = %q, %v; want %q", e, got, ok, req)
		}
	}
	for _, bad := range []string{"gpus", "claim/", "claim/pc", "claim/pc/", "container/pc/gpus"} {
		if req, ok := ClaimEntryRequest(bad); ok {
			t.Errorf("ClaimEntryRequest(%q) = %q, want no request", bad, req)
		}
	}
}
