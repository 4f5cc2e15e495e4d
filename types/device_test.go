package types

import (
	"errors"
	"strings"
	"testing"
)

func gpu(id, uuid string) Device {
	return Device{ID: id, UUID: uuid, Vendor: VendorNVIDIA, Model: "Tesla T4", MemoryMiB: 15360, NUMANode: 0, Health: Healthy}
}

func TestInventoryValidate(t *testing.T) {
	mig := gpu("gpu0-mig0", "MIG-0")
	mig.Parent = "gpu0"
	migOfMig := gpu("gpu0-mig1", "MIG-1")
	migOfMig.Parent = "gpu0-mig0"
	sick := gpu("gpu1", "GPU-1")
	sick.Health = "Sick"

	tests := []struct {
		name    string
		inv     Inventory
		wantErr string
	}{
		{name: "empty", inv: Inventory{}},
		{name: "two gpus linked", inv: Inventory{
			Devices: []Device{gpu("gpu0", "GPU-0"), gpu("gpu1", "GPU-1")},
			Links:   []Link{{A: "gpu0", B: "gpu1", Kind: LinkNVLink, Count: 2}},
		}},
		{name: "mig slice", inv: Inventory{Devices: []Device{gpu("gpu0", "GPU-0"), mig}}},
		{name: "missing id", inv: Inventory{Devices: []Device{gpu("", "GPU-0")}}, wantErr: "device 0 has no id"},
		{name: "duplicate id", inv: Inventory{Devices: []Device{gpu("gpu0", "GPU-0"), gpu("gpu0", "GPU-1")}}, wantErr: `device id "gpu0" appears twice`},
		{name: "duplicate uuid", inv: Inventory{Devices: []Device{gpu("gpu0", "GPU-0"), gpu("gpu1", "GPU-0")}}, wantErr: `share uuid "GPU-0"`},
		{name: "missing uuid", inv: Inventory{Devices: []Device{gpu("gpu0", "")}}, wantErr: `"gpu0" has no uuid`},
		{name: "bad health", inv: Inventory{Devices: []Device{sick}}, wantErr: `health "Sick"`},
		{name: "unknown parent", inv: Inventory{Devices: []Device{mig}}, wantErr: `unknown parent "gpu0"`},
		{name: "nested slice", inv: Inventory{Devices: []Device{gpu("gpu0", "GPU-0"), mig, migOfMig}}, wantErr: "itself a slice"},
		{name: "unknown link kind", inv: Inventory{
			Devices: []Device{gpu("gpu0", "GPU-0"), gpu("gpu1", "GPU-1")},
			Links:   []Link{{A: "gpu0", B: "gpu1", Kind: "Carrier pigeon"}},
		}, wantErr: `unknown kind "Carrier pigeon"`},
		{name: "self link", inv: Inventory{
			Devices: []Device{gpu("gpu0", "GPU-0")},
			Links:   []Link{{A: "gpu0", B: "gpu0", Kind: LinkNVLink}},
		}, wantErr: "to itself"},
		{name: "link to unknown", inv: Inventory{
			Devices: []Device{gpu("gpu0", "GPU-0")},
			Links:   []Link{{A: "gpu0", B: "gpu9", Kind: LinkNVLink}},
		}, wantErr: `unknown device "gpu9"`},
		{name: "link to slice", inv: Inventory{
			Devices: []Device{gpu("gpu0", "GPU-0"), gpu("gpu1", "GPU-1"), mig},
			Links:   []Link{{A: "gpu1", B: "gpu0-mig0", Kind: LinkNVLink}},
		}, wantErr: "slices use their parent's links"},
		{name: "xgmi two hops", inv: Inventory{
			Devices: []Device{gpu("gpu0", "GPU-0"), gpu("gpu1", "GPU-1")},
			Links:   []Link{{A: "gpu0", B: "gpu1", Kind: LinkXGMI, Hops: 2}},
		}},
		{name: "too many hops", inv: Inventory{
			Devices: []Device{gpu("gpu0", "GPU-0"), gpu("gpu1", "GPU-1")},
			Links:   []Link{{A: "gpu0", B: "gpu1", Kind: LinkXGMI, Hops: MaxLinkHops + 1}},
		}, wantErr: "9 hops, want 0 to 8"},
		{name: "negative hops", inv: Inventory{
			Devices: []Device{gpu("gpu0", "GPU-0"), gpu("gpu1", "GPU-1")},
			Links:   []Link{{A: "gpu0", B: "gpu1", Kind: LinkXGMI, Hops: -1}},
		}, wantErr: "-1 hops"},
		{name: "pair twice", inv: Inventory{
			Devices: []Device{gpu("gpu0", "GPU-0"), gpu("gpu1", "GPU-1")},
			Links:   []Link{{A: "gpu0", B: "gpu1", Kind: LinkNVLink}, {A: "gpu1", B: "gpu0", Kind: LinkPCIeSwitch}},
		}, wantErr: "appears twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.inv.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want error containing %q", tt.wantErr)
			}
			if !errors.Is(err, ErrInvalidInventory) {
				t.Errorf("Validate() = %v, does not wrap ErrInvalidInventory", err)
			}
			if got := err.Error(); !strings.Contains(got, tt.wantErr) {
				t.Errorf("Validate() = %q, want it to contain %q", got, tt.wantErr)
			}
		})
	}
}

func TestLinkMatrix(t *testing.T) {
	mig0 := gpu("gpu0-mig0", "MIG-0")
	mig0.Parent = "gpu0"
	mig1 := gpu("gpu0-mig1", "MIG-1")
	mig1.Parent = "gpu0"
	inv := Inventory{
		Devices: []Device{gpu("gpu0", "GPU-0"), gpu("gpu1", "GPU-1"), gpu("gpu2", "GPU-2"), mig0, mig1},
		Links:   []Link{{A: "gpu1", B: "gpu0", Kind: LinkNVLink, Count: 2}},
	}
	if err := inv.Validate(); err != nil {
		t.Fatal(err)
	}
	m := inv.LinkMatrix()
	check := func(i, j int, kind LinkKind, count int) {
		t.Helper()
		if m[i][j].Kind != kind || m[i][j].Count != count {
			t.Errorf("m[%d][%d] = %+v, want %s x%d", i, j, m[i][j], kind, count)
		}
		if m[i][j].A != inv.Devices[i].ID || m[i][j].B != inv.Devices[j].ID {
			t.Errorf("m[%d][%d] ends = %s-%s, want %s-%s", i, j, m[i][j].A, m[i][j].B, inv.Devices[i].ID, inv.Devices[j].ID)
		}
	}
	check(0, 1, LinkNVLink, 2)
	check(1, 0, LinkNVLink, 2)
	check(0, 2, LinkCrossSocket, 0)
	check(3, 1, LinkNVLink, 2) // slice of gpu0 inherits gpu0-gpu1
	check(1, 4, LinkNVLink, 2)
	check(3, 4, LinkNVSwitch, 0) // two slices of one GPU
	check(3, 0, LinkNVSwitch, 0) // slice and its parent
	if m[2][2] != (Link{}) {
		t.Errorf("diagonal = %+v, want zero", m[2][2])
	}
}

func TestPodAllocationContainer(t *testing.T) {
	a := PodAllocation{
		InitContainers: []ContainerAllocation{{Name: "init", Devices: []DeviceShare{{ID: "gpu1"}}}},
		Containers:     []ContainerAllocation{{Name: "main", Devices: []DeviceShare{{ID: "gpu0"}}}},
	}
	if c, ok := a.Container("init"); !ok || c.Devices[0].ID != "gpu1" {
		t.Errorf("Container(init) = %+v, %v", c, ok)
	}
	if c, ok := a.Container("main"); !ok || c.Devices[0].ID != "gpu0" {
		t.Errorf("Container(main) = %+v, %v", c, ok)
	}
	if _, ok := a.Container("sidecar"); ok {
		t.Error("Container(sidecar) found, want not found")
	}
}

func TestLinkLabel(t *testing.T) {
	for _, tt := range []struct {
		l    Link
		want string
	}{
		{Link{Kind: LinkNVLink, Count: 2}, "NV2"},
		{Link{Kind: LinkNVLink, Count: 18}, "NV18"},
		{Link{Kind: LinkNVSwitch}, "NVS"},
		{Link{Kind: LinkPCIeSwitch}, "PIX"},
		{Link{Kind: LinkHostBridge}, "PHB"},
		{Link{Kind: LinkCrossSocket}, "SYS"},
	} {
		if got := tt.l.Label(); got != tt.want {
			t.Errorf("%+v.Label() = %q, want %q", tt.l, got, tt.want)
		}
	}
}

func TestInventoryRefusesUnprintableStrings(t *testing.T) {
	for name, mutate := range map[string]func(*Device){
		"escape in model":   func(d *Device) { d.Model = "T4\x1b[2J" },
		"bidi override":     func(d *Device) { d.UUID = "GPU-\u202e1" },
		"invalid UTF-8":     func(d *Device) { d.Vendor = "\xff" },
		"model too long":    func(d *Device) { d.Model = strings.Repeat("x", MaxDeviceStringBytes+1) },
		"newline in parent": func(d *Device) { d.PCIBusID = "0000:\n" },
	} {
		d := Device{ID: "gpu0", UUID: "GPU-0", Model: "T4", Health: Healthy}
		mutate(&d)
		if err := (Inventory{Devices: []Device{d}}).Validate(); !errors.Is(err, ErrInvalidInventory) {
			t.Errorf("%s: Validate() = %v, want ErrInvalidInventory", name, err)
		}
	}
}

// TestInventoryKeyIDs: an inventory that names no key accepts every key;
// one that names keys, only those; key IDs are bounded and printable.
func TestInventoryKeyIDs(t *testing.T) {
	if !(Inventory{}).AcceptsKey("ed25519:a") {
		t.Error("an inventory that names no key refuses one")
	}
	inv := Inventory{KeyIDs: []string{"ed25519:a", "ed25519:b"}}
	if !inv.AcceptsKey("ed25519:b") || inv.AcceptsKey("ed25519:c") {
		t.Error("AcceptsKey does not follow the listed IDs")
	}
	if err := inv.Validate(); err != nil {
		t.Errorf("valid key IDs: %v", err)
	}
	for _, bad := range [][]string{{""}, {"a\x1b[2J"}, {strings.Repeat("a", 65)}, make([]string, MaxKeyIDs+1)} {
		if err := (Inventory{KeyIDs: bad}).Validate(); !errors.Is(err, ErrInvalidInventory) {
			t.Errorf("key IDs %q: %v, want ErrInvalidInventory", bad, err)
		}
	}
}

// TestCheckOptions: the first unknown key in sorted order is named with
// the module's options, or the side's having none.
func TestCheckOptions(t *testing.T) {
	c := PluginConfig{Options: map[string]string{"b": "1", "a": "2", "root": "/"}}
	if err := c.CheckOptions("m", "root"); err == nil || err.Error() != "unknown option m.a (known: root)" {
		t.Errorf("CheckOptions = %v", err)
	}
	if err := c.CheckOptions("m"); err == nil || err.Error() != "option m.a: this side of the module takes no options" {
		t.Errorf("CheckOptions with none known = %v", err)
	}
	if err := c.CheckOptions("m", "a", "b", "root"); err != nil {
		t.Errorf("CheckOptions with all known = %v", err)
	}
}

// TestValidateResources: a device's resource is bounded and printable; a
// resource this version does not know is no error (a newer node's GPUs
// serve no request here, its others do); a MIG slice is served as its
// GPU is.
func TestValidateResources(t *testing.T) {
	gpu := Device{ID: "gpu0", UUID: "GPU-0", Health: Healthy, Resource: ResourceAMDGPU}
	slice := Device{ID: "gpu0-mig0", UUID: "MIG-0", Health: Healthy, Parent: "gpu0"}
	if err := (Inventory{Devices: []Device{gpu, slice}}).Validate(); err == nil || !strings.Contains(err.Error(), "served as nvidia.com/gpu, its parent \"gpu0\" as amd.com/gpu") {
		t.Errorf("a slice served otherwise than its GPU: %v", err)
	}
	gpu.Resource = "example.com/tpu"
	if err := (Inventory{Devices: []Device{gpu}}).Validate(); err != nil {
		t.Errorf("an unknown resource: %v", err)
	}
	gpu.Resource = "x\x1b[2J"
	if err := (Inventory{Devices: []Device{gpu}}).Validate(); err == nil {
		t.Error("a resource with an escape sequence passed")
	}
	if got := (Device{}).ServedAs(); got != ResourceNVIDIAGPU {
		t.Errorf("an older shim's device is served as %q", got)
	}
}
