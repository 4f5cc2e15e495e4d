package types

import (
	"context"
	"fmt"
	"strings"
)

// EnforcementPolicy says what becomes of a shared slice that no mechanism on
// its node can hold to its memory and compute share. Whole devices and MIG
// devices need no enforcer: the device is the limit.
type EnforcementPolicy string

const (
	// EnforcementRequired places slices only on devices whose node enforces
	// them, and stops a container whose applied limits, read back by its
	// node, differ from its grant.
	EnforcementRequired EnforcementPolicy = "Required"
	// EnforcementBestEffort places slices on any device with room; the pod
	// records whether its limits were applied, and a mismatch is reported
	// but the container keeps running.
	EnforcementBestEffort EnforcementPolicy = "BestEffort"
)

// EnforcementPolicies lists the valid policies.
var EnforcementPolicies = []EnforcementPolicy{EnforcementRequired, EnforcementBestEffort}

// Valid reports whether p is one of EnforcementPolicies.
func (p EnforcementPolicy) Valid() bool {
	return p == EnforcementRequired || p == EnforcementBestEffort
}

// Mechanisms that enforce slices, as Device.SliceEnforcer names them.
const (
	// EnforcerMPS is an NVIDIA MPS control daemon per container: its
	// active thread percentage limits the SMs a client's kernels use, its
	// device pinned memory limit the memory a client allocates.
	EnforcerMPS = "mps"
	// EnforcerSimulated is simgpu's stand-in, with MPS's read-back
	// interface and no hardware behind it.
	EnforcerSimulated = "simulated"
)

// Enforcement is what a node's enforcer applied to one container's slices,
// as read back from the enforcer after it was set up.
type Enforcement struct {
	// Mechanism is the enforcer, e.g. EnforcerMPS.
	Mechanism string `json:"mechanism"`
	// ComputePercent is the compute share the container's processes are
	// held to, 1..MaxComputePercent; 0 when nothing limits it.
	ComputePercent int `json:"computePercent"`
	// MemoryMiB is, per device of the allocation and in its order, the
	// memory the container's processes may allocate; 0 when nothing
	// limits it.
	MemoryMiB []int64 `json:"memoryMiB"`
	// Escapes are the pod's processes found using its GPUs outside the
	// enforcer (e.g. "PID 4242 on GPU GPU-..."): what the limits above do
	// not hold.
	Escapes []string `json:"escapes,omitempty"`
	// EscapesUnknown says why the enforcer could not look for escapes
	// (e.g. the driver cannot list a GPU's processes); empty when it
	// looked, or has nothing to look for.
	EscapesUnknown string `json:"escapesUnknown,omitempty"`
}

// String is the enforcement as a pod condition's message shows it, e.g.
// "mps: compute 25%, memory 4096 MiB".
func (e Enforcement) String() string {
	var b strings.Builder
	b.WriteString(e.Mechanism)
	if e.ComputePercent > 0 {
		fmt.Fprintf(&b, ": compute %d%%", e.ComputePercent)
	} else {
		b.WriteString(": compute unlimited")
	}
	for _, m := range e.MemoryMiB {
		if m > 0 {
			fmt.Fprintf(&b, ", memory %d MiB", m)
		} else {
			b.WriteString(", memory unlimited")
		}
	}
	if e.EscapesUnknown != "" {
		fmt.Fprintf(&b, " (processes outside it not checked: %s)", e.EscapesUnknown)
	}
	return b.String()
}

// Mismatch compares what was applied to a container with its allocation:
// nil when every shared device's compute share and memory are held to
// exactly the grant; otherwise an error saying each difference. Whole
// devices need no limit and are not compared.
func (e Enforcement) Mismatch(alloc ContainerAllocation) error {
	if len(e.MemoryMiB) != len(alloc.Devices) {
		return fmt.Errorf("%s reports memory limits for %d devices, the container has %d", e.Mechanism, len(e.MemoryMiB), len(alloc.Devices))
	}
	var diffs []string
	compute := false
	for i, s := range alloc.Devices {
		if s.Exclusive {
			continue
		}
		// One compute share per container (the engine grants each of its
		// slices the same): compared once.
		if !compute && s.ComputePercent > 0 && s.ComputePercent < MaxComputePercent && e.ComputePercent != s.ComputePercent {
			diffs = append(diffs, fmt.Sprintf("compute %s, granted %d%%", percentOrUnlimited(e.ComputePercent), s.ComputePercent))
			compute = true
		}
		if s.MemoryMiB > 0 && e.MemoryMiB[i] != s.MemoryMiB {
			diffs = append(diffs, fmt.Sprintf("device %s memory %s, granted %d MiB", s.ID, mibOrUnlimited(e.MemoryMiB[i]), s.MemoryMiB))
		}
	}
	if len(e.Escapes) > 0 {
		escapes := e.Escapes
		if len(escapes) > 4 {
			escapes = append(escapes[:4:4], fmt.Sprintf("%d more", len(e.Escapes)-4))
		}
		diffs = append(diffs, fmt.Sprintf("processes outside %s: %s", e.Mechanism, strings.Join(escapes, ", ")))
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("%s applied %s", e.Mechanism, strings.Join(diffs, "; "))
}

// Shared reports whether the allocation holds a slice (a share of a
// device rather than the whole of it), which only an enforcer holds to its
// grant.
func (a ContainerAllocation) Shared() bool {
	for _, s := range a.Devices {
		if !s.Exclusive {
			return true
		}
	}
	return false
}

func percentOrUnlimited(p int) string {
	if p <= 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%d%%", p)
}

func mibOrUnlimited(m int64) string {
	if m <= 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%d MiB", m)
}

// EnforcementProver is implemented by a NodePlugin whose devices have a
// SliceEnforcer: it reads back from the enforcer what it applied to a
// container of pod podUID with alloc (only the plugin's own devices). It
// must ask the enforcer itself (the MPS daemon's control pipe), never
// trust a record the container can write, and return an error when the
// enforcer does not answer: the host then reports the slice unproven.
type EnforcementProver interface {
	Enforced(ctx context.Context, podUID string, alloc ContainerAllocation) (Enforcement, error)
}
