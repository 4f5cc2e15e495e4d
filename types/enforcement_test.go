package types

import (
	"strings"
	"testing"
)

func TestEnforcementMismatch(t *testing.T) {
	alloc := ContainerAllocation{Name: "c", Devices: []DeviceShare{
		{ID: "gpu0", UUID: "GPU-0", MemoryMiB: 4096, ComputePercent: 25},
		{ID: "gpu1", UUID: "GPU-1", Exclusive: true, MemoryMiB: 16384, ComputePercent: 100},
	}}
	for _, tt := range []struct {
		name string
		e    Enforcement
		want string // "" for no mismatch
	}{
		{"as granted", Enforcement{Mechanism: "mps", ComputePercent: 25, MemoryMiB: []int64{4096, 0}}, ""},
		{"whole device unlimited", Enforcement{Mechanism: "mps", ComputePercent: 25, MemoryMiB: []int64{4096, 9}}, ""},
		{"compute raised", Enforcement{Mechanism: "mps", ComputePercent: 0, MemoryMiB: []int64{4096, 0}}, "compute unlimited, granted 25%"},
		{"memory raised", Enforcement{Mechanism: "mps", ComputePercent: 25, MemoryMiB: []int64{8192, 0}}, "device gpu0 memory 8192 MiB, granted 4096 MiB"},
		{"memory unlimited", Enforcement{Mechanism: "mps", ComputePercent: 25, MemoryMiB: []int64{0, 0}}, "memory unlimited"},
		{"too few devices", Enforcement{Mechanism: "mps", ComputePercent: 25, MemoryMiB: []int64{4096}}, "for 1 devices, the container has 2"},
		{"escapes", Enforcement{Mechanism: "mps", ComputePercent: 25, MemoryMiB: []int64{4096, 0}, Escapes: []string{"PID 1", "PID 2", "PID 3", "PID 4", "PID 5", "PID 6"}},
			"processes outside mps: PID 1, PID 2, PID 3, PID 4, 2 more"},
	} {
		err := tt.e.Mismatch(alloc)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v, want none", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
	if got := (Enforcement{Mechanism: "mps", ComputePercent: 25, MemoryMiB: []int64{4096}, EscapesUnknown: "no listing"}).String(); got != "mps: compute 25%, memory 4096 MiB (processes outside it not checked: no listing)" {
		t.Errorf("String() = %q", got)
	}
}
