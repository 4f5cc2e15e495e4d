package claims

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/kubegpu/kubegpu/kubeinterface/dra"
)

// Getter gets a claim by namespace and name: the scheduler's claim tracker
// (fwk.ResourceClaimTracker), which includes the allocations in flight.
type Getter interface {
	Get(namespace, name string) (*resourceapi.ResourceClaim, error)
}

// PodClaim is one of a pod's kubegpu claims.
type PodClaim struct {
	// Name is the claim's entry in the pod's spec.resourceClaims.
	Name  string
	Claim *resourceapi.ResourceClaim
}

// Allocated reports whether the claim is allocated (or its allocation is
// in flight).
func (pc PodClaim) Allocated() bool { return pc.Claim.Status.Allocation != nil }

// Errors of ForPod. ErrWaiting: the pod waits for something that will
// change (a claim not yet created, being deleted, or being allocated for
// another pod); ErrInvalid: the user must change something.
var (
	ErrWaiting = errors.New("waiting for its ResourceClaims")
	ErrInvalid = errors.New("invalid ResourceClaim")
)

// ForPod returns the pod's claims that kubegpu allocates (dra.Ours), in
// the order of spec.resourceClaims; the others are the DynamicResources
// plugin's. A claim whose owner or state keeps the pod from using it is
// an error wrapping ErrWaiting or ErrInvalid. pending reports whether an
// unallocated claim's allocation is in flight (for another pod sharing
// it): the pod waits until it is written, as with the stock plugin.
func ForPod(pod *corev1.Pod, claims Getter, pending func(*resourceapi.ResourceClaim) bool) ([]PodClaim, error) {
	var out []PodClaim
	for i := range pod.Spec.ResourceClaims {
		pc := &pod.Spec.ResourceClaims[i]
		name, mustCheckOwner, err := resourceclaim.Name(pod, pc)
		switch {
		case errors.Is(err, resourceclaim.ErrClaimNotFound):
			return nil, fmt.Errorf("%w: %w", ErrWaiting, err)
		case err != nil:
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		case name == nil:
			continue // a template that asked for nothing
		}
		claim, err := claims.Get(pod.Namespace, *name)
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w: ResourceClaim %s/%s not found", ErrWaiting, pod.Namespace, *name)
		}
		if err != nil {
			return nil, fmt.Errorf("ResourceClaim %s/%s: %w", pod.Namespace, *name, err)
		}
		ours, err := dra.Ours(claim)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		if !ours {
			continue
		}
		if mustCheckOwner {
			if err := resourceclaim.IsForPod(pod, claim, false); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
			}
		}
		if claim.DeletionTimestamp != nil {
			return nil, fmt.Errorf("%w: ResourceClaim %s/%s is being deleted", ErrWaiting, claim.Namespace, claim.Name)
		}
		switch {
		case claim.Status.Allocation != nil:
			if !resourceclaim.IsReservedForPod(pod, claim, false) && !resourceclaim.CanBeReserved(claim) {
				return nil, fmt.Errorf("%w: ResourceClaim %s/%s is reserved for the most pods it may serve", ErrWaiting, claim.Namespace, claim.Name)
			}
			if err := SliceInUse(pod, claim); err != nil {
				return nil, err
			}
		case pending != nil && pending(claim):
			return nil, fmt.Errorf("%w: ResourceClaim %s/%s is being allocated for another pod", ErrWaiting, claim.Namespace, claim.Name)
		}
		for _, c := range claim.Spec.Devices.Config {
			if c.Opaque != nil && c.Opaque.Driver == dra.DriverName {
				return nil, fmt.Errorf("%w: ResourceClaim %s/%s configures driver %s itself: only kubegpu-scheduler does", ErrInvalid, claim.Namespace, claim.Name, dra.DriverName)
			}
		}
		if (claim.Status.Allocation == nil && asksForSlice(claim)) || (claim.Status.Allocation != nil && holdsSlice(claim)) {
			if a, b := twoHolders(pod, pc.Name); a != "" {
				return nil, fmt.Errorf("%w: ResourceClaim %s/%s is for a GPU slice, which serves one container at a time, and containers %s and %s, which run at the same time, both name it: give each its own claim, or name different requests",
					ErrInvalid, claim.Namespace, claim.Name, a, b)
			}
		}
		out = append(out, PodClaim{Name: pc.Name, Claim: claim})
	}
	return out, nil
}

// asksForSlice reports whether a request of the unallocated claim asks
// for capacity: a slice, not whole GPUs.
func asksForSlice(claim *resourceapi.ResourceClaim) bool {
	for _, r := range claim.Spec.Devices.Requests {
		for _, sp := range specsOf(r) {
			if sp.capacity != nil && len(sp.capacity.Requests) > 0 {
				return true
			}
		}
	}
	return false
}

// twoHolders names two containers of pod that may run at the same time
// and name the same request of pod claim podClaim (a reference without a
// request names all of them), or is empty. Regular containers and sidecars
// (init containers that keep running) run together; a plain init container
// runs beside the sidecars declared before it.
func twoHolders(pod *corev1.Pod, podClaim string) (string, string) {
	type ref struct{ container, request string }
	names := func(c *corev1.Container) []ref {
		var out []ref
		for _, rc := range c.Resources.Claims {
			if rc.Name == podClaim {
				out = append(out, ref{c.Name, rc.Request})
			}
		}
		return out
	}
	overlap := func(running []ref, c *corev1.Container) (string, string) {
		for _, r := range names(c) {
			for _, o := range running {
				if o.request == "" || r.request == "" || o.request == r.request {
					return o.container, r.container
				}
			}
		}
		return "", ""
	}
	var running []ref // the sidecars started so far
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if a, b := overlap(running, c); a != "" {
			return a, b
		}
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			running = append(running, names(c)...)
		}
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if a, b := overlap(running, c); a != "" {
			return a, b
		}
		running = append(running, names(c)...)
	}
	return "", ""
}

// SliceInUse is an error wrapping ErrWaiting when the allocated claim holds
// a GPU slice and a consumer other than pod uses it: a slice serves one
// pod at a time (each pod's slice limits are its own, so two pods would
// hold it twice while the claim counts once). PreFilter asks, and PreBind
// again when it reserves the claim.
func SliceInUse(pod *corev1.Pod, claim *resourceapi.ResourceClaim) error {
	if other := otherConsumer(pod, claim); other != "" && holdsSlice(claim) {
		return fmt.Errorf("%w: ResourceClaim %s/%s holds a GPU slice, which serves one pod at a time (each pod's slice limits are its own); %s uses it",
			ErrWaiting, claim.Namespace, claim.Name, other)
	}
	return nil
}

// otherConsumer names a consumer of claim other than pod, or is empty.
func otherConsumer(pod *corev1.Pod, claim *resourceapi.ResourceClaim) string {
	for _, r := range claim.Status.ReservedFor {
		if r.UID != pod.UID {
			return r.Resource + " " + r.Name
		}
	}
	return ""
}

// holdsSlice reports whether the claim's signed allocation gives a share
// of a GPU rather than the whole of it. An allocation that does not read
// is taken to: the node does not prepare it anyway.
func holdsSlice(claim *resourceapi.ResourceClaim) bool {
	a, _, err := dra.SignedValue(claim.Status.Allocation)
	if err != nil {
		return true
	}
	for _, c := range a.Containers {
		for _, d := range c.Devices {
			if !d.Exclusive {
				return true
			}
		}
	}
	return false
}

// NodeOf is the node an allocated kubegpu claim's devices are on: the
// node name its allocation's node selector requires (as Allocate writes
// it).
func NodeOf(claim *resourceapi.ResourceClaim) (string, error) {
	a := claim.Status.Allocation
	if a == nil {
		return "", nil
	}
	if ns := a.NodeSelector; ns != nil && len(ns.NodeSelectorTerms) == 1 {
		t := ns.NodeSelectorTerms[0]
		if len(t.MatchExpressions) == 0 && len(t.MatchFields) == 1 {
			f := t.MatchFields[0]
			if f.Key == "metadata.name" && f.Operator == corev1.NodeSelectorOpIn && len(f.Values) == 1 {
				return f.Values[0], nil
			}
		}
	}
	return "", fmt.Errorf("%w: ResourceClaim %s/%s is allocated without a single node", ErrInvalid, claim.Namespace, claim.Name)
}
