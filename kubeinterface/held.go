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
)

// EncodeHeld returns the AnnotationContainerHeld value for the devices a
// container holds.
func EncodeHeld(devices []types.DeviceShare) (string, error) {
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
func DecodeHeld(value string) ([]types.DeviceShare, error) {
	if len(value) > maxHeldBytes {
		return nil, fmt.Errorf("%w: %s: %d bytes, at most %d", ErrInvalid, AnnotationContainerHeld, len(value), maxHeldBytes)
	}
	var devices []types.DeviceShare
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
		}
	}
	return devices, nil
}
