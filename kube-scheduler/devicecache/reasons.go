package devicecache

import (
	"errors"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
)

// Reason is why a GPU pod does not fit on a node, or waits, as
// kubegpu_scheduler_pending_gpu_pods labels it.
type Reason int

// The reasons, in the order of the metric's label values.
const (
	ReasonNotEnoughFree Reason = iota
	ReasonTopology
	ReasonSelectors
	ReasonUnhealthy
	ReasonHostResources
	ReasonTooManyShares
	// ReasonUnenforced: its slices need an enforcer (enforcement
	// Required) and the node has none.
	ReasonUnenforced
	ReasonNoInventory
	ReasonNodeNotLive
	ReasonInvalidRequest
	ReasonWarmingUp
	// ReasonDRA: the node's GPUs are left to DRA (another driver
	// publishes them, or a DeviceClass maps the resource the pod asks
	// for).
	ReasonDRA
	// ReasonGroupsOff: the pod belongs to a pod group, which the
	// scheduler does not place whole.
	ReasonGroupsOff
	// ReasonResource: the node has no GPUs of the device resource the
	// pod asks for (amd.com/gpu on an NVIDIA node).
	ReasonResource
	// ReasonOther: no node refused it for its GPUs (another plugin did:
	// CPU, affinity, taints), or its cycle has not run yet.
	ReasonOther
	// NumReasons counts the reasons.
	NumReasons
)

var reasonNames = [NumReasons]string{
	"not_enough_free_gpus", "topology", "selectors", "unhealthy_gpus", "host_resources",
	"too_many_shares", "unenforced", "no_inventory", "node_not_live", "invalid_request", "warming_up", "dra", "pod_groups_off", "device_resource", "other",
}

// String is the reason's label value.
func (r Reason) String() string {
	if r < 0 || r >= NumReasons {
		return reasonNames[ReasonOther]
	}
	return reasonNames[r]
}

// engineReasons maps the engine's constant reasons to Reasons.
var engineReasons = map[string]Reason{
	devicescheduler.ReasonNotEnoughFree: ReasonNotEnoughFree,
	devicescheduler.ReasonTopology:      ReasonTopology,
	devicescheduler.ReasonSelectors:     ReasonSelectors,
	devicescheduler.ReasonUnhealthy:     ReasonUnhealthy,
	devicescheduler.ReasonHostResources: ReasonHostResources,
	devicescheduler.ReasonTooManyShares: ReasonTooManyShares,
	devicescheduler.ReasonUnenforced:    ReasonUnenforced,
	devicescheduler.ReasonResource:      ReasonResource,
}

// ReasonOf is the Reason of an error Evaluate or EvaluateWith returned.
func ReasonOf(err error) Reason {
	if r, ok := err.(*Refusal); ok { //nolint:errorlint // the memo returns refusals unwrapped; see Refusal
		return r.Reason // classified when the memo took it in
	}
	var nf *devicescheduler.NotFitError
	switch {
	case errors.As(err, &nf):
		if r, ok := engineReasons[nf.Reason]; ok {
			return r
		}
	case errors.Is(err, ErrNoInventory), errors.Is(err, ErrKeyRefused):
		return ReasonNoInventory
	case errors.Is(err, ErrStale):
		return ReasonNodeNotLive
	case errors.Is(err, ErrDRA):
		return ReasonDRA
	}
	return ReasonOther
}
