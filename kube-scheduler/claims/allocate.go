package claims

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
)

// ErrRejected means the structured allocator does not accept the devices
// the engine chose for a pod's claims on a node: a rule of the claim the
// engine does not weigh (a constraint, a capacity policy) fails for them.
var ErrRejected = errors.New("the devices kubegpu chose do not satisfy the claims' constraints")

// Allocator checks the engine's choice and writes the standard allocation.
type Allocator struct {
	Features structured.Features
	Classes  structured.DeviceClassLister
	CEL      *cel.Cache
}

// toleration lets the allocator take kubegpu's devices, which carry
// dra.TaintManaged against every other allocator.
var toleration = resourceapi.DeviceToleration{
	Key: dra.TaintManaged, Operator: resourceapi.DeviceTolerationOpEqual,
	Value: dra.TaintManagedValue, Effect: resourceapi.DeviceTaintEffectNoSchedule,
}

// Allocate returns the allocation results of the unallocated claims among
// pcs on node, in their order, each request given exactly the devices
// alloc holds for its engine container (dra.ClaimEntry): the structured
// allocator's results over copies of the node's slices of dra.DriverName
// (from published) that keep only those devices, and copies of the claims
// that tolerate dra.TaintManaged and select only those devices. state is
// what other claims hold (GatherAllocatedState). The results carry the
// claims' own tolerations only.
func (a *Allocator) Allocate(ctx context.Context, node *corev1.Node, pcs []PodClaim, alloc types.PodAllocation, published []*resourceapi.ResourceSlice, state *structured.AllocatedState) ([]resourceapi.AllocationResult, error) {
	chosen := map[string][]types.DeviceShare{}
	names := map[string]bool{}
	for _, c := range alloc.Containers {
		if dra.IsClaimEntry(c.Name) {
			chosen[c.Name] = c.Devices
			for _, d := range c.Devices {
				names[dra.DeviceName(d.ID)] = true
			}
		}
	}
	var claims []*resourceapi.ResourceClaim
	var podNames []string // the pod's names of claims
	for _, pc := range pcs {
		if pc.Allocated() {
			continue
		}
		podNames = append(podNames, pc.Name)
		cl := pc.Claim.DeepCopy()
		for i := range cl.Spec.Devices.Requests {
			if err := pin(&cl.Spec.Devices.Requests[i], pc.Name, chosen); err != nil {
				return nil, fmt.Errorf("claim %s: %w", pc.Claim.Name, err)
			}
		}
		claims = append(claims, cl)
	}
	if len(claims) == 0 {
		return nil, nil
	}
	var kept []*resourceapi.ResourceSlice
	for _, s := range published {
		if s.Spec.Driver != dra.DriverName || s.Spec.NodeName == nil || *s.Spec.NodeName != node.Name {
			continue
		}
		// Shallow copies: the allocator reads slices (upstream's plugin
		// gives it the informer's own), and Filter checks hundreds of
		// nodes per pod.
		c := *s
		c.Spec.Devices = make([]resourceapi.Device, 0, len(names))
		for _, d := range s.Spec.Devices {
			if names[d.Name] {
				c.Spec.Devices = append(c.Spec.Devices, d)
			}
		}
		kept = append(kept, &c)
	}
	al, err := structured.NewAllocator(ctx, a.Features, *state, a.Classes, kept, a.CEL)
	if err != nil {
		return nil, fmt.Errorf("structured allocator: %w", err)
	}
	results, err := al.Allocate(ctx, node, claims)
	if err != nil {
		return nil, fmt.Errorf("structured allocator: %w", err)
	}
	if len(results) != len(claims) {
		return nil, ErrRejected
	}
	for i := range results {
		if err := check(&results[i], node.Name, podNames[i], chosen); err != nil {
			return nil, err
		}
		for j := range results[i].Devices.Results {
			r := &results[i].Devices.Results[j]
			r.Tolerations = slices.DeleteFunc(slices.Clone(r.Tolerations), func(t resourceapi.DeviceToleration) bool { return t == toleration })
			if len(r.Tolerations) == 0 {
				r.Tolerations = nil
			}
		}
	}
	return results, nil
}

// pin makes r of the pod's claim podName take exactly the devices chosen
// for it, tolerating dra.TaintManaged: an exact request its engine
// container's devices; a firstAvailable request the alternative the engine
// placed (the one with an engine container), alone, so that the result
// names it as DRA names an alternative's ("<request>/<subrequest>").
func pin(r *resourceapi.DeviceRequest, podName string, chosen map[string][]types.DeviceShare) error {
	sel := func(devs []types.DeviceShare) resourceapi.DeviceSelector {
		return resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: pinned(devs)}}
	}
	if e := r.Exactly; e != nil {
		devs := chosen[dra.ClaimEntry(podName, r.Name)]
		if len(devs) == 0 {
			return fmt.Errorf("request %s: no devices chosen", r.Name)
		}
		e.Tolerations = append(e.Tolerations, toleration)
		e.Selectors = append(e.Selectors, sel(devs))
		return nil
	}
	for _, s := range r.FirstAvailable {
		devs := chosen[dra.ClaimEntry(podName, r.Name+"/"+s.Name)]
		if len(devs) == 0 {
			continue
		}
		s.Tolerations = append(slices.Clone(s.Tolerations), toleration)
		s.Selectors = append(slices.Clone(s.Selectors), sel(devs))
		r.FirstAvailable = []resourceapi.DeviceSubRequest{s}
		return nil
	}
	return fmt.Errorf("request %s: no devices chosen for any of its alternatives", r.Name)
}

// check confirms that a result of the pod's claim podName gives each
// request exactly the devices chosen for it (its engine container), on
// node: whatever the pin matched (IDs as published are cut, and a node
// publishes its own), a request gets no device chosen for another.
func check(res *resourceapi.AllocationResult, node, podName string, chosen map[string][]types.DeviceShare) error {
	want := map[string]map[string]int{}
	for _, r := range res.Devices.Results {
		if r.Driver != dra.DriverName || r.Pool != node {
			return fmt.Errorf("%w: the allocator gave device %s/%s/%s", ErrRejected, r.Driver, r.Pool, r.Device)
		}
		w, ok := want[r.Request]
		if !ok {
			w = map[string]int{}
			for _, d := range chosen[dra.ClaimEntry(podName, r.Request)] {
				w[dra.DeviceName(d.ID)]++
			}
			want[r.Request] = w
		}
		if w[r.Device] == 0 {
			return fmt.Errorf("%w: the allocator gave request %s device %s, which kubegpu did not choose for it", ErrRejected, r.Request, r.Device)
		}
		w[r.Device]--
	}
	return nil
}

// pinned is the CEL selector of devs among the node's devices, by their
// IDs as published (Allocate keeps only the node's slices and only the
// chosen devices, and check confirms each result by the device's name).
// IDs rather than UUIDs: the same choice on another node is the same
// expression, compiled once for all (the allocator's CEL cache; Filter
// checks hundreds of nodes per pod).
func pinned(devs []types.DeviceShare) string {
	q := make([]string, len(devs))
	for i, d := range devs {
		q[i] = strconv.Quote(dra.AttributeString(d.ID))
	}
	slices.Sort(q) // one expression for one set
	return `device.attributes["` + dra.DriverName + `"].` + string(dra.AttributeID) + ` in [` + strings.Join(q, ", ") + `]`
}
