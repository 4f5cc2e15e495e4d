package kubeinterface

import (
	"encoding/json"
	"fmt"

	"github.com/kubegpu/kubegpu/types"
)

// Bounds on AnnotationContainerHeld.
const (
	maxHeldBytes = 16 << 10
	// MaxHeldDevices bounds the devices one container holds.
	MaxHeldDevices = 256
	// maxClaimUIDBytes bounds a held device's claim UID (the API's UIDs
	// are 36).
	maxClaimUIDBytes = 64
	// maxRequestBytes bounds a held device's request name (a DNS label).
	maxRequestBytes = 63
)

// HeldDevice is a device a container holds, as the node's ledger records
// it.
type HeldDevice struct {
	types.DeviceShare
	// Claim is the UID of the kubegpu ResourceClaim through which the
	// container's pod holds the device, empty for the pod's own
	// allocation. A claim's slice is held by one container at a time; its
	// whole GPUs are also listed in AnnotationContainerDRAHeld. Ledgers
	// that predate the field ignore it: they count a claim's whole GPU
	// listed here as held through kubegpu's allocations, and refuse the
	// claim's other pods meanwhile.
	Claim string `json:"claim,omitempty"`
	// Request is the claim's request the device is allocated for (its
	// top-level name): the slices of different requests are different
	// slices.
	Request string `json:"request,omitempty"`
}

// Shares are the devices' shares, without their claims.
func Shares(held []HeldDevice) []types.DeviceShare {
	out := make([]types.DeviceShare, len(held))
	for i, h := range held {
		out[i] = h.DeviceShare
	}
	return out
}

// EncodeHeld returns the AnnotationContainerHeld value for the devices a
// container holds.
func EncodeHeld(devices []HeldDevice) (string, error) {
	if len(devices) > MaxHeldDevices {
		return "", fmt.Errorf("encode held devices: %d devices, at most %d", len(devices), MaxHeldDevices)
	}
	b, err := json.Marshal(devices)
	if err != nil {
		return "", fmt.Errorf("encode held devices: %w", err)
	}
	if len(b) > maxHeldBytes {
		return "", fmt.Errorf("encode held devices: %d bytes, at most %d", len(b), maxHeldBytes)
	}
	return string(b), nil
}

// DecodeHeld parses an AnnotationContainerHeld value. Malformed input gives
// an error wrapping ErrInvalid.
func DecodeHeld(value string) ([]HeldDevice, error) {
	if len(value) > maxHeldBytes {
		return nil, fmt.Errorf("%w: %s: %d bytes, at most %d", ErrInvalid, AnnotationContainerHeld, len(value), maxHeldBytes)
	}
	var devices []HeldDevice
	if err := json.Unmarshal([]byte(value), &devices); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, AnnotationContainerHeld, err)
	}
	if len(devices) > MaxHeldDevices {
		return nil, fmt.Errorf("%w: %s: %d devices, at most %d", ErrInvalid, AnnotationContainerHeld, len(devices), MaxHeldDevices)
	}
	for _, d := range devices {
		switch {
		case d.ID == "":
			return nil, fmt.Errorf("%w: %s: a device without an ID", ErrInvalid, AnnotationContainerHeld)
		case d.MemoryMiB < 0 || d.ComputePercent < 0 || d.ComputePercent > types.MaxComputePercent:
			return nil, fmt.Errorf("%w: %s: device %s: memory %d MiB, compute %d%%", ErrInvalid, AnnotationContainerHeld, Quote(d.ID), d.MemoryMiB, d.ComputePercent)
		case len(d.Claim) > maxClaimUIDBytes || len(d.Request) > maxRequestBytes:
			return nil, fmt.Errorf("%w: %s: device %s: a claim UID of %d bytes (at most %d), a request of %d (at most %d)",
				ErrInvalid, AnnotationContainerHeld, Quote(d.ID), len(d.Claim), maxClaimUIDBytes, len(d.Request), maxRequestBytes)
		}
	}
	return devices, nil
}
