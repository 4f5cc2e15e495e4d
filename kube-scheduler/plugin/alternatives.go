package plugin

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/types"
)

// maxAllocatorChecks bounds the structured allocator's checks of one node
// for one pod in a cycle: a claim whose constraints fail for every variant
// the engine places (the engine does not weigh them) costs at most this
// many, however many alternatives it has.
const maxAllocatorChecks = 4

// tryVariants evaluates the pod's variants (one, unless its claims have
// alternatives: cycleState.others) on node in DRA's order of preference,
// with eval, and returns the first that fits: its index and score. With
// checkClaims, a variant fits only if the structured allocator also
// accepts the devices the engine chose for the pod's claims (filterClaims;
// at most maxAllocatorChecks times). When none fits, the most hopeful
// refusal (devicecache.MostHopeful): the engine's err, or the allocator's
// status. A status that is no refusal of this node (an error, the
// scheduler's request to stop) is returned at once; so is a node where DRA
// serves the pod (isDRAServes), whatever the variant.
func (p *Plugin) tryVariants(ctx context.Context, s *cycleState, node *corev1.Node, checkClaims bool, pl *devicescheduler.Placement,
	eval func(*devicecache.Input) (int64, error)) (score int64, variant int, status *fwk.Status, err error) {
	n := len(s.others) + 1
	// Filled on refusals only: a node that fits allocates nothing.
	var refusals []error
	var statuses []*fwk.Status
	checks := 0
	for i := range n {
		score, err := eval(s.input(i))
		if err == nil && checkClaims && s.claims != nil {
			if checks == maxAllocatorChecks {
				break
			}
			checks++
			if st := p.filterClaims(ctx, s.claims, node, pl.Allocation()); st != nil {
				if st.Code() != fwk.Unschedulable || ctx.Err() != nil {
					return 0, 0, st, nil
				}
				// Resolvable: other claims' devices may go.
				refusals, statuses = append(refusals, errors.New(st.Message())), append(statuses, st)
				continue
			}
		}
		if err == nil || isDRAServes(err) {
			return score, i, nil, err
		}
		refusals, statuses = append(refusals, err), append(statuses, nil)
	}
	i := devicecache.MostHopeful(refusals)
	if statuses[i] != nil {
		return 0, 0, statuses[i], nil
	}
	return 0, 0, nil, refusals[i]
}

// reserveVariant reserves variant i of the pod's devices on the node (see
// Reserve): the engine's choice assumed in the device cache and, for the
// pod's claims, their allocations (reserveClaims), all undone should any
// step fail. It returns what of the devices is the pod's own.
func (p *Plugin) reserveVariant(ctx context.Context, s *cycleState, pod *corev1.Pod, node *corev1.Node, nodeName string, capacity, free devicescheduler.Host, i int) (types.PodAllocation, *fwk.Status) {
	alloc, err := p.cache.Reserve(pod, nodeName, s.requestOf(i), capacity, free, p.nominated(pod, nodeName))
	if err != nil {
		var nf *devicescheduler.NotFitError
		if errors.As(err, &nf) {
			return alloc, fwk.NewStatus(fwk.Unschedulable, "GPUs: "+nf.Detail())
		}
		return alloc, fwk.AsStatus(err)
	}
	if s.claims == nil {
		return alloc, nil
	}
	own, st := p.reserveClaims(ctx, pod, node, s.claims, alloc)
	if st != nil {
		p.unreserveClaims(ctx, pod, s.claims)
		p.cache.Unreserve(pod.UID)
		return alloc, st
	}
	s.claimOnly = len(own.Containers)+len(own.InitContainers) == 0
	return own, nil
}
