package amd

import "fmt"

// model names an AMD GPU from its PCI device ID and compute units. The IDs
// are those the ROCm runtime's gfx table lists (ROCR-Runtime,
// libhsakmt/src/topology.c); MI250X and MI250 share 0x740c and differ in
// their compute units per GCD (110 and 104, AMD's product pages).
func model(deviceID uint64, computeUnits int32) string {
	switch deviceID {
	case 0x74a1:
		return "AMD Instinct MI300X"
	case 0x74a2:
		return "AMD Instinct MI308X"
	case 0x740c:
		if computeUnits == 110 {
			return "AMD Instinct MI250X"
		}
		return "AMD Instinct MI250"
	case 0x740f:
		return "AMD Instinct MI210"
	}
	return fmt.Sprintf("AMD GPU %#04x", deviceID)
}
