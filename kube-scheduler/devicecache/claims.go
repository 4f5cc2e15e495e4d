package devicecache

import (
	"errors"
	"reflect"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
)

// ResourceClaims of kubegpu's DeviceClass hold devices as pods do, under
// the claim's UID: a claim shared by several pods holds its devices once,
// for as long as it is allocated, whichever of its pods come and go.

// ClaimPart is what one claim holds of the devices Reserve chose for a
// pod: the engine containers that stand for the claim's requests.
type ClaimPart struct {
	UID   ktypes.UID
	Claim ktypes.NamespacedName
	// Containers are the claim's containers of the pod's allocation.
	Containers []string
}

// MoveToClaims hands the devices Reserve assumed for pod uid's claim
// containers to the claims of parts, each assumed under its claim's UID
// until UpdateClaim sees it allocated (or Forget releases it). What is
// left is the pod's own, returned; a pod left with no devices is no longer
// held.
func (c *Cache) MoveToClaims(uid ktypes.UID, parts []ClaimPart) (types.PodAllocation, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ps, ok := c.pods[uid]
	if !ok || !ps.applied {
		return types.PodAllocation{}, errors.New("the pod's devices are not reserved")
	}
	ns := c.nodes[ps.node]
	own := ps.alloc
	own.Containers = nil
	byName := map[string]types.ContainerAllocation{}
	for _, ctr := range ps.alloc.Containers {
		byName[ctr.Name] = ctr
	}
	for _, p := range parts {
		for _, n := range p.Containers {
			delete(byName, n)
		}
	}
	for _, ctr := range ps.alloc.Containers {
		if _, ok := byName[ctr.Name]; ok {
			own.Containers = append(own.Containers, ctr)
		}
	}
	ns.devices.Release(string(uid))
	ns.devicesChanged()
	var errs []error
	for _, p := range parts {
		a := types.PodAllocation{Node: ps.node, Enforcement: ps.alloc.Enforcement}
		for _, ctr := range ps.alloc.Containers {
			if slices.Contains(p.Containers, ctr.Name) {
				a.Containers = append(a.Containers, ctr)
			}
		}
		c.forgetLocked(p.UID)
		errs = append(errs, ns.devices.Assume(string(p.UID), a, devicescheduler.Host{}))
		c.pods[p.UID] = &podState{pod: p.Claim, node: ps.node, alloc: a, assumed: true, applied: true}
		ns.pods[p.UID] = struct{}{}
	}
	if len(own.Containers)+len(own.InitContainers) == 0 {
		delete(c.pods, uid)
		delete(ns.pods, uid)
	} else {
		errs = append(errs, ns.devices.Assume(string(uid), own, devicescheduler.Host{}))
		ps.alloc = own
	}
	return own, errors.Join(errs...)
}

// ForgetAssumed releases the devices of claim uid if they are only
// assumed (Reserve's, not yet seen allocated): a claim seen allocated
// keeps them.
func (c *Cache) ForgetAssumed(logger klog.Logger, uid ktypes.UID) {
	c.mu.RLock()
	ps, ok := c.pods[uid]
	assumed := ok && ps.assumed
	c.mu.RUnlock()
	if assumed {
		c.Forget(logger, uid)
	}
}

// UpdateClaim takes in a ResourceClaim from the informer. An allocated
// claim whose allocation carries kubegpu-scheduler's verified signature
// for it holds the signed devices; any other claim holds none, except that
// a claim Reserve assumed stays assumed until it is seen allocated or is
// released. A counted claim keeps the devices it was counted with for as
// long as it stays allocated (its pods' containers hold them).
func (c *Cache) UpdateClaim(logger klog.Logger, claim *resourceapi.ResourceClaim) {
	alloc, value, err := dra.ClaimAllocation(claim, c.verifyClaim)
	if c.updateClaimLocked(logger, claim, alloc, value, err) {
		c.wake(c.deviceWaiters)
	}
}

// updateClaimLocked is UpdateClaim under the write lock; it reports
// whether the claim released devices.
func (c *Cache) updateClaimLocked(logger klog.Logger, claim *resourceapi.ResourceClaim, alloc kubeinterface.Allocation, value string, err error) (freed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ps, known := c.pods[claim.UID]
	if err != nil {
		switch {
		case known && ps.assumed:
			// In flight: its allocation is being written.
		case known && claim.Status.Allocation != nil:
			logger.Info("Allocation of a counted ResourceClaim changed; keeping the devices it was counted with", "claim", klog.KObj(claim), "err", err)
		case known:
			return c.forgetLocked(claim.UID)
		case claim.Status.Allocation != nil && !errors.Is(err, dra.ErrNotSigned):
			c.metrics.Rejected(err)
			logger.Info("ResourceClaim's kubegpu allocation is not valid; it holds no devices", "claim", klog.KObj(claim), "err", err)
		}
		return false
	}
	if known && ps.node == alloc.Node && reflect.DeepEqual(ps.alloc, alloc.PodAllocation) {
		ps.assumed, ps.source, ps.value, ps.consumers = false, sourceClaim, value, consumersOf(claim)
		return false
	}
	if known && !ps.assumed {
		logger.Info("Allocation of a counted ResourceClaim changed; keeping the devices it was counted with", "claim", klog.KObj(claim))
		ps.consumers = consumersOf(claim)
		return false
	}
	c.forgetLocked(claim.UID)
	ps = &podState{pod: ktypes.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}, node: alloc.Node, alloc: alloc.PodAllocation,
		source: sourceClaim, value: value, consumers: consumersOf(claim)}
	c.pods[claim.UID] = ps
	c.node(alloc.Node).pods[claim.UID] = struct{}{}
	c.apply(logger, claim.UID, ps)
	return false
}

// consumersOf are the pods a claim is reserved for.
func consumersOf(claim *resourceapi.ResourceClaim) []ktypes.UID {
	var out []ktypes.UID
	for _, r := range claim.Status.ReservedFor {
		if r.Resource == "pods" && r.APIGroup == "" {
			out = append(out, r.UID)
		}
	}
	return out
}

// claimsGoneLocked lists the claims on ns whose pods are all gone: in
// removed, or among gone; must hold c.mu.
func (c *Cache) claimsGoneLocked(ns *nodeState, removed map[ktypes.UID]struct{}, gone []ktypes.UID) []ktypes.UID {
	var out []ktypes.UID
	for uid := range ns.pods {
		ps := c.pods[uid]
		if ps == nil || len(ps.consumers) == 0 {
			continue
		}
		all := true
		for _, p := range ps.consumers {
			if _, ok := removed[p]; !ok && !slices.Contains(gone, p) {
				all = false
				break
			}
		}
		if all {
			out = append(out, uid)
		}
	}
	return out
}

// sourceClaim is where a claim's devices were read from: its
// allocation's signed configuration.
const sourceClaim = "claim"

// verifyClaim checks the signature of a claim's allocation
// (dra.ClaimAllocation checks that it is for the claim): by a trusted key.
func (c *Cache) verifyClaim(a kubeinterface.Allocation) error {
	switch {
	case c.keys != nil:
		return c.keys.Verify(a)
	case c.formOnly:
		return nil
	}
	return errNoKeys(a)
}
