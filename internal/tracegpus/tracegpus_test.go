package tracegpus

import "testing"

func TestInventory(t *testing.T) {
	for _, tt := range []struct {
		model      string
		gpus       int
		wantModel  string
		wantMemory int64
	}{
		{"G2", 8, "G2", 24576},           // openb's preset
		{"t4", 2, "T4", 15360},           // any case
		{"Unknown", 4, "Unknown", 16384}, // no preset: 16 GiB GPUs
	} {
		inv := Inventory("n1", tt.model, tt.gpus)
		if err := inv.Validate(); err != nil {
			t.Errorf("%s×%d: %v", tt.model, tt.gpus, err)
			continue
		}
		if len(inv.Devices) != tt.gpus {
			t.Errorf("%s×%d: %d devices", tt.model, tt.gpus, len(inv.Devices))
			continue
		}
		for _, d := range inv.Devices {
			if d.Model != tt.wantModel || d.MemoryMiB != tt.wantMemory {
				t.Errorf("%s×%d: device %s is a %s of %d MiB, want a %s of %d MiB", tt.model, tt.gpus, d.ID, d.Model, d.MemoryMiB, tt.wantModel, tt.wantMemory)
			}
		}
	}
	if ps, err := Plugins(); err != nil || len(ps) != 1 {
		t.Errorf("Plugins() = %v, %v; want simgpu's", ps, err)
	}
}
