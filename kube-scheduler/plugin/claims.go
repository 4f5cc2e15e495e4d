package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/util/retry"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"

	"github.com/kubegpu/kubegpu/kube-scheduler/claims"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
)

// claimDeps are what the plugin needs to allocate kubegpu's claims: the
// scheduler's DRA manager (claims with allocations in flight, slices,
// classes), and the compiler and allocator over them.
type claimDeps struct {
	manager   fwk.SharedDRAManager
	compiler  *claims.Compiler
	allocator *claims.Allocator
}

func newClaimDeps(m fwk.SharedDRAManager) *claimDeps {
	fts := feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	celCache := cel.NewCache(256, cel.Features{EnableConsumableCapacity: fts.EnableDRAConsumableCapacity, EnableListTypeAttributes: fts.EnableDRAListTypeAttributes})
	return &claimDeps{
		manager:   m,
		compiler:  &claims.Compiler{Classes: m.DeviceClasses(), CEL: celCache},
		allocator: &claims.Allocator{Features: dynamicresources.AllocatorFeatures(fts), Classes: m.DeviceClasses(), CEL: celCache},
	}
}

// claimCycle is one cycle's kubegpu claims of the pod.
type claimCycle struct {
	claims []claims.PodClaim
	// node is the node the pod's allocated claims are on; "" when none
	// is allocated yet.
	node string
	// unallocated reports whether a claim is to be allocated this cycle;
	// then slices and state are what PreFilter saw.
	unallocated bool
	slices      []*resourceapi.ResourceSlice
	state       *structured.AllocatedState
	// allocated are the claims Reserve allocated, with their allocation,
	// in flight until PreBind writes them; written marks those written.
	allocated []*resourceapi.ResourceClaim
	written   []bool
	// reserved are the claims PreBind reserved for the pod, to release
	// should the pod not be bound.
	reserved []ktypes.NamespacedName
}

// podClaims reads the pod's kubegpu claims in PreFilter: nil when it has
// none, and the engine's container requests for those to allocate, as
// variants in DRA's order of preference (claims.Compile).
func (p *Plugin) podClaims(ctx context.Context, pod *corev1.Pod) (*claimCycle, [][]types.ContainerRequest, *fwk.Status) {
	if len(pod.Spec.ResourceClaims) == 0 || p.claimDeps == nil {
		return nil, nil, nil
	}
	tracker := p.claimDeps.manager.ResourceClaims()
	pending := func(c *resourceapi.ResourceClaim) bool { return tracker.GetPendingAllocation(c.UID) != nil }
	pcs, err := claims.ForPod(pod, tracker, pending)
	if err != nil {
		return nil, nil, claimStatus(err)
	}
	if len(pcs) == 0 {
		return nil, nil, nil
	}
	cc := &claimCycle{claims: pcs}
	for _, pc := range pcs {
		if !pc.Allocated() {
			cc.unallocated = true
			continue
		}
		n, err := claims.NodeOf(pc.Claim)
		if err != nil {
			return nil, nil, claimStatus(err)
		}
		if cc.node != "" && cc.node != n {
			return nil, nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, fmt.Sprintf("GPUs: the pod's ResourceClaims are allocated on different nodes (%s, %s)", cc.node, n))
		}
		cc.node = n
	}
	if !cc.unallocated {
		return cc, nil, nil
	}
	// Listed once: for the selectors and for the allocator's check.
	published, err := p.claimDeps.manager.ResourceSlices().ListWithDeviceTaintRules()
	if err != nil {
		return nil, nil, fwk.AsStatus(fmt.Errorf("GPUs: ResourceSlices: %w", err))
	}
	cc.slices = published
	comp := *p.claimDeps.compiler
	comp.Devices = func() ([]*resourceapi.ResourceSlice, error) { return published, nil }
	variants, err := comp.Compile(ctx, pcs)
	if err != nil {
		return nil, nil, claimStatus(err)
	}
	// The tracker refuses while claims change under it: a few tries,
	// as the stock plugin makes.
	for range 5 {
		if cc.state, err = tracker.GatherAllocatedState(); err == nil {
			break
		}
	}
	if err != nil {
		return nil, nil, fwk.AsStatus(fmt.Errorf("GPUs: allocated devices: %w", err))
	}
	return cc, variants, nil
}

// claimStatus is the framework's status for an error of package claims.
func claimStatus(err error) *fwk.Status {
	switch {
	case errors.Is(err, claims.ErrWaiting):
		return fwk.NewStatus(fwk.Unschedulable, "GPUs: "+err.Error())
	case errors.Is(err, claims.ErrInvalid):
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "GPUs: "+err.Error())
	}
	return fwk.AsStatus(fmt.Errorf("GPUs: %w", err))
}

// filterClaims checks the devices the engine chose on node (alloc) for the
// pod's claims to allocate with the structured allocator (Filter refuses
// the nodes other than the one its allocated claims are on).
func (p *Plugin) filterClaims(ctx context.Context, cc *claimCycle, node *corev1.Node, alloc types.PodAllocation) *fwk.Status {
	if !cc.unallocated {
		return nil
	}
	_, err := p.claimDeps.allocator.Allocate(ctx, node, cc.claims, alloc, cc.slices, cc.state)
	return allocateStatus(ctx, err)
}

// allocateStatus is Filter's answer for the structured allocator's check
// of a node.
func allocateStatus(ctx context.Context, err error) *fwk.Status {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, claims.ErrRejected) || errors.Is(err, structured.ErrFailedAllocationOnNode):
		// This node's devices or slices: the other nodes may do.
		return fwk.NewStatus(fwk.Unschedulable, "GPUs: "+err.Error())
	case ctx.Err() != nil:
		// The scheduler stops filtering once it has found enough nodes;
		// an error would fail the whole cycle (upstream's DynamicResources
		// plugin answers the same).
		return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("GPUs: asked by the scheduler to stop allocating devices: %v", context.Cause(ctx)))
	}
	return fwk.AsStatus(fmt.Errorf("GPUs: %w", err))
}

// reserveClaims turns the devices Reserve chose for the claim containers
// of alloc into the claims' standard allocations, signed, hands them to
// the claims in the device cache and signals them to the scheduler's claim
// tracker. It returns what of alloc is the pod's own.
func (p *Plugin) reserveClaims(ctx context.Context, pod *corev1.Pod, node *corev1.Node, cc *claimCycle, alloc types.PodAllocation) (types.PodAllocation, *fwk.Status) {
	if !cc.unallocated {
		own, err := p.cache.MoveToClaims(pod.UID, nil)
		if err != nil {
			return alloc, fwk.AsStatus(fmt.Errorf("GPUs: %w", err))
		}
		return own, nil
	}
	if node == nil {
		return alloc, fwk.AsStatus(errors.New("GPUs: the node is not in the scheduling snapshot"))
	}
	results, err := p.claimDeps.allocator.Allocate(ctx, node, cc.claims, alloc, cc.slices, cc.state)
	if err != nil {
		return alloc, fwk.NewStatus(fwk.Unschedulable, "GPUs: "+err.Error())
	}
	var parts []devicecache.ClaimPart
	i := 0
	for _, pc := range cc.claims {
		if pc.Allocated() {
			continue
		}
		part := devicecache.ClaimPart{UID: pc.Claim.UID, Claim: ktypes.NamespacedName{Namespace: pc.Claim.Namespace, Name: pc.Claim.Name}}
		claimAlloc := types.PodAllocation{Node: node.Name, Enforcement: alloc.Enforcement}
		// One entry per request, its name the alternative given where
		// the request has several (dra.ClaimEntry).
		for _, c := range alloc.Containers {
			if dra.ClaimEntryOf(c.Name, pc.Name) {
				part.Containers = append(part.Containers, c.Name)
				claimAlloc.Containers = append(claimAlloc.Containers, c)
			}
		}
		config, err := dra.SignedConfigFor(p.signer(), kubeinterface.PodRef{Namespace: pc.Claim.Namespace, Name: pc.Claim.Name, UID: pc.Claim.UID}, claimAlloc)
		if err != nil {
			return alloc, fwk.AsStatus(err)
		}
		res := results[i]
		i++
		res.Devices.Config = append(res.Devices.Config, config)
		c := pc.Claim.DeepCopy()
		c.Status.Allocation = &res
		parts = append(parts, part)
		// With written beside it, so that Unreserve may run at any point.
		cc.allocated = append(cc.allocated, c)
		cc.written = append(cc.written, false)
	}
	own, err := p.cache.MoveToClaims(pod.UID, parts)
	if err != nil {
		return alloc, fwk.AsStatus(fmt.Errorf("GPUs: %w", err))
	}
	tracker := p.claimDeps.manager.ResourceClaims()
	for _, c := range cc.allocated {
		if err := tracker.SignalClaimPendingAllocation(c.UID, c); err != nil {
			return own, fwk.AsStatus(fmt.Errorf("GPUs: claim %s: %w", klog.KObj(c), err))
		}
	}
	return own, nil
}

// unreserveClaims withdraws the allocations Reserve signalled and not yet
// written, once, and takes the pod off the reservations PreBind wrote
// (the claim controller then deallocates a claim reserved for nobody).
func (p *Plugin) unreserveClaims(ctx context.Context, pod *corev1.Pod, cc *claimCycle) {
	tracker := p.claimDeps.manager.ResourceClaims()
	for i, c := range cc.allocated {
		if cc.written[i] {
			continue
		}
		tracker.MaybeRemoveClaimPendingAllocation(c.UID, false)
		tracker.AssumedClaimRestore(c.Namespace, c.Name)
		p.cache.ForgetAssumed(klog.FromContext(ctx), c.UID)
	}
	cc.allocated, cc.written = nil, nil
	for _, ref := range cc.reserved {
		if err := p.unreserveClaim(ctx, pod, ref); err != nil {
			klog.FromContext(ctx).Error(err, "Could not take the pod off its ResourceClaim's reservations; the claim controller does once the pod is gone", "pod", klog.KObj(pod), "claim", ref)
		}
	}
	cc.reserved = nil
}

// unreserveClaim removes pod from the reservations of claim ref.
func (p *Plugin) unreserveClaim(ctx context.Context, pod *corev1.Pod, ref ktypes.NamespacedName) error {
	client := p.handle.ClientSet().ResourceV1().ResourceClaims(ref.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := client.Get(ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		kept := slices.DeleteFunc(slices.Clone(cur.Status.ReservedFor), func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == pod.UID })
		if len(kept) == len(cur.Status.ReservedFor) {
			return nil
		}
		cur.Status.ReservedFor = kept
		_, err = client.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

// preBindClaims writes each claim's allocation and the pod's reservation:
// as the stock plugin binds a claim, the finalizer first, then the status.
func (p *Plugin) preBindClaims(ctx context.Context, pod *corev1.Pod, cc *claimCycle) *fwk.Status {
	tracker := p.claimDeps.manager.ResourceClaims()
	client := p.handle.ClientSet().ResourceV1()
	ref := resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: pod.Name, UID: pod.UID}
	bind := func(c *resourceapi.ResourceClaim, alloc *resourceapi.AllocationResult) (*resourceapi.ResourceClaim, error) {
		var updated *resourceapi.ResourceClaim
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := client.ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if cur.UID != c.UID {
				return apierrors.NewConflict(resourceapi.Resource("resourceclaims"), c.Name, errors.New("the claim was replaced"))
			}
			if alloc == nil {
				// Reserved on the node PreFilter pinned the pod to.
				if n, err := claims.NodeOf(cur); cur.Status.Allocation == nil || err != nil || n != cc.node {
					return fmt.Errorf("claim %s is no longer allocated on node %s", klog.KObj(c), cc.node)
				}
				// Checked again where the reservation is written: a
				// pod may have reserved it since PreFilter.
				if err := claims.SliceInUse(pod, cur); err != nil {
					return err
				}
			} else {
				if cur.Status.Allocation != nil {
					return fmt.Errorf("claim %s was allocated meanwhile", klog.KObj(c))
				}
				if !slices.Contains(cur.Finalizers, resourceapi.Finalizer) {
					cur.Finalizers = append(cur.Finalizers, resourceapi.Finalizer)
					if cur, err = client.ResourceClaims(c.Namespace).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
						return err
					}
				}
				cur.Status.Allocation = alloc
			}
			if !slices.ContainsFunc(cur.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == pod.UID }) {
				cur.Status.ReservedFor = append(cur.Status.ReservedFor, ref)
			}
			updated, err = client.ResourceClaims(c.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		return updated, err
	}
	for _, pc := range cc.claims {
		if !pc.Allocated() {
			continue
		}
		updated, err := bind(pc.Claim, nil)
		if err != nil {
			return fwk.AsStatus(fmt.Errorf("GPUs: reserve claim %s for the pod: %w", klog.KObj(pc.Claim), err))
		}
		cc.reserved = append(cc.reserved, ktypes.NamespacedName{Namespace: updated.Namespace, Name: updated.Name})
		if err := tracker.AssumeClaimAfterAPICall(updated); err != nil {
			klog.FromContext(ctx).V(4).Info("Claim tracker did not take the update", "claim", klog.KObj(updated), "err", err)
		}
	}
	for i, c := range cc.allocated {
		updated, err := bind(c, c.Status.Allocation)
		if err != nil {
			return fwk.AsStatus(fmt.Errorf("GPUs: write the allocation of claim %s: %w", klog.KObj(c), err))
		}
		cc.written[i] = true
		cc.reserved = append(cc.reserved, ktypes.NamespacedName{Namespace: updated.Namespace, Name: updated.Name})
		if err := tracker.AssumeClaimAfterAPICall(updated); err != nil {
			klog.FromContext(ctx).V(4).Info("Claim tracker did not take the update", "claim", klog.KObj(updated), "err", err)
		}
		tracker.MaybeRemoveClaimPendingAllocation(c.UID, true)
		klog.FromContext(ctx).V(2).Info("Allocated ResourceClaim", "claim", klog.KObj(c), "pod", klog.KObj(pod), "devices", len(c.Status.Allocation.Devices.Results))
	}
	return nil
}

// signer is the key's signing function, as the args ask.
func (p *Plugin) signer() func(kubeinterface.Allocation) (kubeinterface.Allocation, error) {
	if p.args.SignWithoutKeyID {
		return p.key.SignWithoutKeyID
	}
	return p.key.Sign
}

// sign is the encoded allocation alloc, signed for the object ref.
func (p *Plugin) sign(ref kubeinterface.PodRef, alloc types.PodAllocation) (string, error) {
	a, err := p.signer()(kubeinterface.Allocation{Pod: ref, PodAllocation: alloc})
	if err != nil {
		return "", err
	}
	return kubeinterface.EncodeAllocation(a)
}
