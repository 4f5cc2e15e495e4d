package plugin

import (
	"errors"
	"sync"
	"sync/atomic"

	ktypes "k8s.io/apimachinery/pkg/types"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
)

// Why a pending GPU pod waits, as kubegpu_scheduler_pending_gpu_pods
// labels it: the reason most nodes gave in its last scheduling cycle.
const (
	pendingNotEnoughFree = iota
	pendingTopology
	pendingSelectors
	pendingUnhealthy
	pendingHostResources
	pendingTooManyShares
	// pendingUnenforced: its slices need an enforcer (enforcement
	// Required) and no node with room has one.
	pendingUnenforced
	pendingNoInventory
	pendingNodeNotLive
	pendingInvalidRequest
	pendingWarmingUp
	// pendingGroupsOff: the pod belongs to a pod group, which the
	// scheduler does not place whole (placesGroups).
	pendingGroupsOff
	// pendingOther: no node refused it for its GPUs (another plugin did:
	// CPU, affinity, taints), or its cycle has not run yet.
	pendingOther
	numPendingReasons
)

var pendingReasonNames = [numPendingReasons]string{
	"not_enough_free_gpus", "topology", "selectors", "unhealthy_gpus", "host_resources",
	"too_many_shares", "unenforced", "no_inventory", "node_not_live", "invalid_request", "warming_up", "pod_groups_off", "other",
}

// engineReasons maps the engine's constant reasons to pending reasons.
var engineReasons = map[string]int{
	devicescheduler.ReasonNotEnoughFree: pendingNotEnoughFree,
	devicescheduler.ReasonTopology:      pendingTopology,
	devicescheduler.ReasonSelectors:     pendingSelectors,
	devicescheduler.ReasonUnhealthy:     pendingUnhealthy,
	devicescheduler.ReasonHostResources: pendingHostResources,
	devicescheduler.ReasonTooManyShares: pendingTooManyShares,
	devicescheduler.ReasonUnenforced:    pendingUnenforced,
}

// filterReason is the pending reason of a Filter error.
func filterReason(err error) int {
	if r, ok := err.(*refusal); ok { //nolint:errorlint // the memo returns refusals unwrapped; see filterStatus
		return r.reason // classified when the memo took it in
	}
	var nf *devicescheduler.NotFitError
	switch {
	case errors.As(err, &nf):
		if r, ok := engineReasons[nf.Reason]; ok {
			return r
		}
	case errors.Is(err, errNoInventory), errors.Is(err, errKeyRefused):
		return pendingNoInventory
	case errors.Is(err, errStale):
		return pendingNodeNotLive
	}
	return pendingOther
}

// pendingPods are the GPU pods this scheduler has tried and not placed,
// with why: one entry per pod that exists unbound, removed when the pod
// is reserved, bound or deleted.
type pendingPods struct {
	mu   sync.Mutex
	pods map[ktypes.UID]*pendingPod
}

// pendingPod is one pod's last cycle: how many nodes refused it for each
// reason (Filter counts them concurrently), or the reason it was refused
// outright.
type pendingPod struct {
	nodes [numPendingReasons]atomic.Int32
	fixed atomic.Int32 // reason+1 when refused before Filter
}

func newPendingPods() *pendingPods { return &pendingPods{pods: map[ktypes.UID]*pendingPod{}} }

// start begins a cycle of pod: its counts start again.
func (p *pendingPods) start(uid ktypes.UID) *pendingPod {
	pp := &pendingPod{}
	p.mu.Lock()
	p.pods[uid] = pp
	p.mu.Unlock()
	return pp
}

// refuse records pod refused before Filter for reason.
func (p *pendingPods) refuse(uid ktypes.UID, reason int) {
	p.start(uid).fixed.Store(int32(reason) + 1)
}

func (p *pendingPods) remove(uid ktypes.UID) {
	p.mu.Lock()
	delete(p.pods, uid)
	p.mu.Unlock()
}

// count records one node's refusal; nil-safe.
func (pp *pendingPod) count(reason int) {
	if pp != nil {
		pp.nodes[reason].Add(1)
	}
}

func (pp *pendingPod) reason() int {
	if r := pp.fixed.Load(); r > 0 {
		return int(r - 1)
	}
	best, most := pendingOther, int32(0)
	for r := range pp.nodes {
		if n := pp.nodes[r].Load(); n > most {
			best, most = r, n
		}
	}
	return best
}

// byReason counts the pending pods per reason.
func (p *pendingPods) byReason() [numPendingReasons]int {
	var out [numPendingReasons]int
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pp := range p.pods {
		out[pp.reason()]++
	}
	return out
}
