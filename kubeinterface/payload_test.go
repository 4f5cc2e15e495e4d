package kubeinterface

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/kubegpu/kubegpu/types"
)

// bigInventory is a 16-GPU node with 7 MIG slices on half of its GPUs and a
// link for every pair of whole GPUs: larger than any real node publishes.
func bigInventory() types.Inventory {
	var inv types.Inventory
	for i := 0; i < 16; i++ {
		inv.Devices = append(inv.Devices, types.Device{
			ID: fmt.Sprintf("gpu%d", i), Index: i, UUID: fmt.Sprintf("GPU-%08x-1111-2222-3333-444455556666", i),
			Vendor: types.VendorNVIDIA, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, ComputeUnits: 132,
			ComputeCapability: "9.0", NUMANode: i / 8, PCIBusID: fmt.Sprintf("0000:%02x:00.0", i+0x10), Health: types.Healthy,
		})
	}
	for i := 0; i < 8; i++ {
		for s := 0; s < 7; s++ {
			inv.Devices = append(inv.Devices, types.Device{
				ID: fmt.Sprintf("gpu%d-mig%d", i, s), Index: i, UUID: fmt.Sprintf("MIG-%08x-%04x-2222-3333-444455556666", i, s),
				Vendor: types.VendorNVIDIA, Model: "NVIDIA H100 80GB HBM3 MIG 1g.10gb", MemoryMiB: 9856, ComputeUnits: 16,
				NUMANode: 0, Health: types.Healthy, Parent: fmt.Sprintf("gpu%d", i),
			})
		}
	}
	for i := 0; i < 16; i++ {
		for j := i + 1; j < 16; j++ {
			inv.Links = append(inv.Links, types.Link{A: fmt.Sprintf("gpu%d", i), B: fmt.Sprintf("gpu%d", j), Kind: types.LinkNVLink, Count: 18, BandwidthMBps: 450000})
		}
	}
	return inv
}

func TestInventoryRoundTrip(t *testing.T) {
	inv := bigInventory()
	value, err := EncodeInventory(inv)
	if err != nil {
		t.Fatalf("EncodeInventory() error = %v", err)
	}
	got, err := DecodeInventory(value)
	if err != nil {
		t.Fatalf("DecodeInventory() error = %v", err)
	}
	if !reflect.DeepEqual(got, inv) {
		t.Errorf("round trip changed the inventory")
	}
	size := len(value)
	t.Logf("16 GPUs + 56 MIG slices + 120 links: %d bytes", size)
	if size > 64<<10 {
		t.Errorf("inventory of a 16-GPU node is %d bytes, want well under the API's 256 KiB (<= 64 KiB)", size)
	}
	if !strings.HasPrefix(value, `{"apiVersion":"kubegpu.io/v1","kind":"NodeInventory",`) {
		t.Errorf("payload does not start with its version header: %.60s", value)
	}
}

func TestDecodeInventoryErrors(t *testing.T) {
	tests := []struct {
		name, value, want string
	}{
		{"not json", "{devices:", `kubegpu.io/inventory must be a JSON object`},
		{"trailing data", `{"apiVersion":"kubegpu.io/v1","kind":"NodeInventory"} {}`, "must be a single JSON object"},
		{"trailing bracket", `{"apiVersion":"kubegpu.io/v1","kind":"NodeInventory"}]]`, "must be a single JSON object"},
		{"no version", `{"kind":"NodeInventory","devices":[]}`, `kubegpu.io/inventory apiVersion must be apiVersion kubegpu.io/v1, got ""`},
		{"future version", `{"apiVersion":"kubegpu.io/v9","kind":"NodeInventory"}`, "written by a different kubegpu version"},
		{"wrong kind", `{"apiVersion":"kubegpu.io/v1","kind":"PodAllocation"}`, `kind must be NodeInventory, got "PodAllocation"`},
		{"wrong type", `{"apiVersion":"kubegpu.io/v1","kind":"NodeInventory","devices":{}}`, "must be a JSON object"},
		{"invalid content", `{"apiVersion":"kubegpu.io/v1","kind":"NodeInventory","devices":[{"id":"gpu0","uuid":"u","health":"Healthy"},{"id":"gpu0","uuid":"v","health":"Healthy"}]}`, `device id "gpu0" appears twice`},
		{"too big", strings.Repeat(" ", MaxPayloadBytes+1), "must be at most 131072 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeInventory(tt.value)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("DecodeInventory() error = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("DecodeInventory() error = %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func testAllocation() Allocation {
	return Allocation{
		Pod: PodRef{Namespace: "default", Name: "train", UID: "5f3c0b7e-1d2a-4c4e-9d55-0a1b2c3d4e5f"},
		PodAllocation: types.PodAllocation{
			Node:           "dgx-1",
			InitContainers: []types.ContainerAllocation{{Name: "warmup", Devices: []types.DeviceShare{{ID: "gpu4", UUID: "GPU-4", MemoryMiB: 2048, ComputePercent: 10}}}},
			Containers: []types.ContainerAllocation{
				{Name: "train", Devices: []types.DeviceShare{
					{ID: "gpu0", UUID: "GPU-0", Exclusive: true, MemoryMiB: 16384, ComputePercent: 100},
					{ID: "gpu1", UUID: "GPU-1", Exclusive: true, MemoryMiB: 16384, ComputePercent: 100},
				}},
				{Name: "sidecar", Devices: []types.DeviceShare{}},
			},
		},
		Signature: "c2lnbmF0dXJl",
	}
}

func TestAllocationRoundTrip(t *testing.T) {
	a := testAllocation()
	s, err := EncodeAllocation(a)
	if err != nil {
		t.Fatalf("EncodeAllocation() error = %v", err)
	}
	got, err := DecodeAllocation(s)
	if err != nil {
		t.Fatalf("DecodeAllocation() error = %v", err)
	}
	if !reflect.DeepEqual(got.Pod, a.Pod) || !reflect.DeepEqual(got.PodAllocation, a.PodAllocation) || got.Signature != a.Signature {
		t.Errorf("round trip =\n%+v\nwant\n%+v", got, a)
	}
	if again, err := EncodeAllocation(got); err != nil || again != s {
		t.Errorf("re-encoding a decoded allocation = %q, %v; want the value it was read from", again, err)
	}
}

func TestSigningBytes(t *testing.T) {
	a := testAllocation()
	b := a
	b.Signature = "something else"
	if string(a.SigningBytes()) != string(b.SigningBytes()) {
		t.Error("SigningBytes depends on the signature")
	}
	if strings.Contains(string(a.SigningBytes()), "signature") {
		t.Error("SigningBytes contains the signature field")
	}
	for name, mutate := range map[string]func(*Allocation){
		"uid":    func(x *Allocation) { x.Pod.UID = "other" },
		"node":   func(x *Allocation) { x.Node = "other" },
		"device": func(x *Allocation) { x.Containers[0].Devices[1].UUID = "GPU-7" },
		"share":  func(x *Allocation) { x.InitContainers[0].Devices[0].ComputePercent = 90 },
	} {
		c := testAllocation()
		mutate(&c)
		if string(c.SigningBytes()) == string(a.SigningBytes()) {
			t.Errorf("changing the %s does not change SigningBytes", name)
		}
	}
}

func TestDecodeAllocationErrors(t *testing.T) {
	tests := []struct {
		name, value, want string
	}{
		{"not json", "yes please", "must be a JSON object"},
		{"wrong kind", `{"apiVersion":"kubegpu.io/v1","kind":"NodeInventory"}`, `kind must be PodAllocation`},
		{"no pod", `{"apiVersion":"kubegpu.io/v1","kind":"PodAllocation","node":"n"}`, "pod must be a namespace, name and uid"},
		{"no node", `{"apiVersion":"kubegpu.io/v1","kind":"PodAllocation","pod":{"namespace":"a","name":"b","uid":"c"}}`, "node must be the name of the node"},
		{"bad share", `{"apiVersion":"kubegpu.io/v1","kind":"PodAllocation","pod":{"namespace":"a","name":"b","uid":"c"},"node":"n",
			"containers":[{"name":"x","devices":[{"id":"gpu0","uuid":"u","computePercent":101}]}]}`, `container "x": devices[].computePercent must be 0..100, got "101"`},
		{"empty share", `{"apiVersion":"kubegpu.io/v1","kind":"PodAllocation","pod":{"namespace":"a","name":"b","uid":"c"},"node":"n",
			"containers":[{"name":"x","devices":[{"id":"gpu0","uuid":"u"}]}]}`, "exclusive, or a computePercent or memoryMiB above zero"},
		{"duplicate container", `{"apiVersion":"kubegpu.io/v1","kind":"PodAllocation","pod":{"namespace":"a","name":"b","uid":"c"},"node":"n",
			"containers":[{"name":"x"}],"initContainers":[{"name":"x"}]}`, "unique, non-empty container name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeAllocation(tt.value)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("DecodeAllocation() error = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("DecodeAllocation() error = %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestQuote(t *testing.T) {
	long := strings.Repeat("x", 64)
	for _, tt := range []struct{ in, want string }{
		{"", `""`},
		{"150", `"150"`},
		{`a "b"`, `"a "b""`},
		{long, `"` + long + `"`},
		{long + "y", `"` + long + `"... (65 characters)`},
		{long + "\x1b[2J", `"` + long + `"... (68 characters)`},
		{"T4\x1b[2J", "(6 characters, not all printable ASCII)"},
		{"\u202erequired", "(9 characters, not all printable ASCII)"},
		{strings.Repeat("é", 70), "(70 characters, not all printable ASCII)"},
	} {
		if got := Quote(tt.in); got != tt.want {
			t.Errorf("Quote(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// TestEnforcementIsCritical: an allocation with a slice under Required
// lists enforcement as critical, and this version reads it; one without a
// slice, or under BestEffort, lists nothing, as earlier versions wrote it.
func TestEnforcementIsCritical(t *testing.T) {
	key, err := NewHMACKey([]byte(strings.Repeat("s", 32)))
	if err != nil {
		t.Fatal(err)
	}
	slice := []types.ContainerAllocation{{Name: "c", Devices: []types.DeviceShare{{ID: "gpu0", UUID: "GPU-0", MemoryMiB: 1024, ComputePercent: 10}}}}
	whole := []types.ContainerAllocation{{Name: "c", Devices: []types.DeviceShare{{ID: "gpu0", UUID: "GPU-0", Exclusive: true}}}}
	for _, tt := range []struct {
		policy     types.EnforcementPolicy
		containers []types.ContainerAllocation
		critical   bool
	}{
		{types.EnforcementRequired, slice, true},
		{types.EnforcementRequired, whole, false},
		{types.EnforcementBestEffort, slice, false},
		{"", slice, false},
	} {
		a, err := key.Sign(Allocation{Pod: PodRef{Namespace: "ns", Name: "p", UID: "u"}, PodAllocation: types.PodAllocation{Node: "n", Enforcement: tt.policy, Containers: tt.containers}})
		if err != nil {
			t.Fatal(err)
		}
		v, err := EncodeAllocation(a)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(v, `"critical":["enforcement"]`); got != tt.critical {
			t.Errorf("%s, %+v: critical %v in %s, want %v", tt.policy, tt.containers[0].Devices[0], got, v, tt.critical)
		}
		back, err := DecodeAllocation(v)
		if err != nil {
			t.Fatalf("decode %s: %v", v, err)
		}
		if err := key.Verify(back); err != nil || back.Enforcement != tt.policy {
			t.Errorf("decoded %s: policy %q, verify %v", v, back.Enforcement, err)
		}
	}
	for _, v := range []string{`"critical":["enforcement","migProfile"]`, `"enforcement":"required"`} {
		bad := `{"apiVersion":"kubegpu.io/v1","kind":"PodAllocation","pod":{"namespace":"ns","name":"p","uid":"u"},"node":"n","containers":[],` + v + `}`
		if _, err := DecodeAllocation(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("DecodeAllocation(%s) = %v, want ErrInvalid", v, err)
		}
	}
}
