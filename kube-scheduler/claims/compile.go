package claims

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"

	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
)

// MaxRequests is the most requests of kubegpu claims one pod may have
// allocated at once: the engine's bound on a pod's containers.
const MaxRequests = types.MaxDeviceContainers

// maxMemory bounds a request's memory (1 PiB): above any GPU's, and far
// from overflowing MiB arithmetic.
const maxMemory = 1 << 50

// selectorTimeout bounds the evaluation of one pod's claim selectors over
// the cluster's devices (once per scheduling attempt).
const selectorTimeout = time.Second

// containerPrefix begins the name of an engine container that stands for
// a claim request. Container names are DNS labels: none has a "/".
const containerPrefix = "claim/"

// ContainerName is the engine container of request req of the pod's
// claim podClaim.
func ContainerName(podClaim, req string) string { return containerPrefix + podClaim + "/" + req }

// IsClaimContainer reports whether an engine container stands for a claim
// request.
func IsClaimContainer(name string) bool { return strings.HasPrefix(name, containerPrefix) }

// ClassLister gets DeviceClasses (fwk.DeviceClassLister).
type ClassLister interface {
	Get(name string) (*resourceapi.DeviceClass, error)
}

// Compiler turns claims into the engine's requests.
type Compiler struct {
	Classes ClassLister
	CEL     *cel.Cache
	// Devices are the cluster's kubegpu devices, for selectors: called at
	// most once per Compile, and only for a claim that has selectors of
	// its own or a class with more than dra.ClassSelector.
	Devices func() ([]*resourceapi.ResourceSlice, error)
}

// Compile returns the engine's container requests for the requests of the
// unallocated claims among pcs. A request kubegpu cannot place yet is an
// error wrapping ErrInvalid that says what; one whose selectors no device
// passes, one wrapping ErrWaiting (devices may be published later).
func (c *Compiler) Compile(ctx context.Context, pcs []PodClaim) ([]types.ContainerRequest, error) {
	// Bounded before any selector is evaluated: the engine takes at most
	// MaxRequests containers, and selectors get selectorTimeout in all.
	n := 0
	for _, pc := range pcs {
		if !pc.Allocated() {
			n += len(pc.Claim.Spec.Devices.Requests)
		}
	}
	if n > MaxRequests {
		return nil, fmt.Errorf("%w: the pod's claims of kubegpu's DeviceClass make %d requests, at most %d are placed", ErrInvalid, n, MaxRequests)
	}
	ctx, cancel := context.WithTimeout(ctx, selectorTimeout)
	defer cancel()
	var out []types.ContainerRequest
	var devices []*resourceapi.ResourceSlice
	listed, partitions := false, false
	for _, pc := range pcs {
		if pc.Allocated() {
			continue
		}
		for _, r := range pc.Claim.Spec.Devices.Requests {
			cr, selectors, err := c.request(pc, r)
			if err != nil {
				return nil, err
			}
			// DRA takes a partition (MIG) whole: a claim's slices go on
			// whole GPUs only.
			wholeOnly := cr.Shared()
			if len(selectors) > 0 || wholeOnly {
				if !listed {
					if devices, err = c.Devices(); err != nil {
						return nil, fmt.Errorf("ResourceSlices: %w", err)
					}
					listed, partitions = true, hasPartitions(devices)
				}
				if len(selectors) == 0 && !partitions {
					out = append(out, cr) // nothing to narrow
					continue
				}
				uuids, err := c.matching(ctx, selectors, devices, wholeOnly)
				switch {
				case err != nil && ctx.Err() != nil:
					// Slow, not wrong: tried again later.
					return nil, fmt.Errorf("%w: claim %s request %s: %w", ErrWaiting, pc.Claim.Name, r.Name, err)
				case err != nil:
					return nil, fmt.Errorf("%w: claim %s request %s: %w", ErrInvalid, pc.Claim.Name, r.Name, err)
				case len(uuids) == 0 && wholeOnly:
					return nil, fmt.Errorf("%w: claim %s request %s: no whole GPU of driver %s passes its selectors (a slice goes on a whole GPU, not a partition)", ErrWaiting, pc.Claim.Name, r.Name, dra.DriverName)
				case len(uuids) == 0:
					return nil, fmt.Errorf("%w: claim %s request %s: no device of driver %s passes its selectors", ErrWaiting, pc.Claim.Name, r.Name, dra.DriverName)
				}
				cr.Selector.IncludeUUIDs = uuids
			}
			out = append(out, cr)
		}
	}
	return out, nil
}

// request compiles one claim request; selectors are the CEL selectors to
// evaluate, the class's beyond dra.ClassSelector and the request's own.
func (c *Compiler) request(pc PodClaim, r resourceapi.DeviceRequest) (types.ContainerRequest, []resourceapi.DeviceSelector, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: claim %s request %s: %s", ErrInvalid, pc.Claim.Name, r.Name, fmt.Sprintf(format, args...))
	}
	e := r.Exactly
	if e == nil {
		return types.ContainerRequest{}, nil, bad("kubegpu-scheduler does not place firstAvailable requests yet: use one exact request")
	}
	if e.AllocationMode != "" && e.AllocationMode != resourceapi.DeviceAllocationModeExactCount {
		return types.ContainerRequest{}, nil, bad("allocationMode %s: kubegpu-scheduler places ExactCount requests only", e.AllocationMode)
	}
	if e.AdminAccess != nil && *e.AdminAccess {
		return types.ContainerRequest{}, nil, bad("adminAccess is not offered for kubegpu's devices")
	}
	count := e.Count
	if count == 0 {
		count = 1
	}
	cr := types.ContainerRequest{Name: ContainerName(pc.Name, r.Name), Count: int(min(count, 1<<16))}
	if e.Capacity != nil && len(e.Capacity.Requests) > 0 {
		// What DRA's accounting counts for a capacity the request does
		// not name (the devices' request policies, dra.Devices): no
		// memory, and all of the cores.
		cr.ComputePercent = types.MaxComputePercent
		for name, q := range e.Capacity.Requests {
			switch name {
			case dra.CapacityMemory:
				// None is the devices' default (dra.Devices).
				if q.Sign() < 0 || q.CmpInt64(maxMemory) > 0 {
					return types.ContainerRequest{}, nil, bad("capacity %s must be from 0 to %d bytes, got %s", name, int64(maxMemory), q.String())
				}
				cr.MemoryMiB = (q.Value() + 1<<20 - 1) >> 20
			case dra.CapacityCores:
				if q.Cmp(resource.MustParse("1")) < 0 || q.Cmp(resource.MustParse("100")) > 0 || q.MilliValue()%1000 != 0 {
					return types.ContainerRequest{}, nil, bad("capacity %s must be a whole number from 1 to 100, got %s", name, q.String())
				}
				cr.ComputePercent = int(q.Value())
			default:
				return types.ContainerRequest{}, nil, bad("capacity %s: kubegpu's devices offer %s and %s", name, dra.CapacityMemory, dra.CapacityCores)
			}
		}
	}
	class, err := c.Classes.Get(e.DeviceClassName)
	if err != nil {
		return types.ContainerRequest{}, nil, fmt.Errorf("%w: claim %s request %s: DeviceClass %s: %w", ErrWaiting, pc.Claim.Name, r.Name, e.DeviceClassName, err)
	}
	var selectors []resourceapi.DeviceSelector
	for _, s := range class.Spec.Selectors {
		if s.CEL != nil && strings.TrimSpace(s.CEL.Expression) == dra.ClassSelector {
			continue
		}
		selectors = append(selectors, s)
	}
	selectors = append(selectors, e.Selectors...)
	return cr, selectors, nil
}

// hasPartitions reports whether any device of dra.DriverName is a
// partition.
func hasPartitions(devices []*resourceapi.ResourceSlice) bool {
	for _, sl := range devices {
		if sl.Spec.Driver != dra.DriverName {
			continue
		}
		for i := range sl.Spec.Devices {
			if _, ok := sl.Spec.Devices[i].Attributes[dra.AttributeParent]; ok {
				return true
			}
		}
	}
	return false
}

// matching returns the UUIDs of the devices of dra.DriverName that pass
// every selector; with wholeOnly, of those that are no partition.
func (c *Compiler) matching(ctx context.Context, selectors []resourceapi.DeviceSelector, devices []*resourceapi.ResourceSlice, wholeOnly bool) ([]string, error) {
	progs := make([]cel.CompilationResult, 0, len(selectors))
	for _, s := range selectors {
		if s.CEL == nil {
			return nil, errors.New("a selector without a CEL expression")
		}
		p := c.CEL.GetOrCompile(s.CEL.Expression)
		if p.Error != nil {
			return nil, fmt.Errorf("selector %q: %w", s.CEL.Expression, p.Error)
		}
		progs = append(progs, p)
	}
	var out []string
	for _, sl := range devices {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("the selectors took over %s over the cluster's devices: %w", selectorTimeout, err)
		}
		if sl.Spec.Driver != dra.DriverName {
			continue
		}
		for i := range sl.Spec.Devices {
			d := &sl.Spec.Devices[i]
			uuid := d.Attributes[dra.AttributeUUID].StringValue
			if uuid == nil {
				continue
			}
			if _, part := d.Attributes[dra.AttributeParent]; part && wholeOnly {
				continue
			}
			in := cel.Device{Driver: sl.Spec.Driver, AllowMultipleAllocations: d.AllowMultipleAllocations, Attributes: d.Attributes, Capacity: d.Capacity}
			ok := true
			for _, p := range progs {
				// A runtime error (an attribute missing on this
				// device, a node with an older shim) does not
				// match: one device must not keep the claim off
				// every node. The allocator checks only devices
				// that matched.
				match, _, err := p.DeviceMatches(ctx, in)
				if err != nil || !match {
					ok = false
					break
				}
			}
			if ok {
				out = append(out, *uuid)
			}
		}
	}
	// A deadline passed within the last slice made its devices fail.
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("the selectors took over %s over the cluster's devices: %w", selectorTimeout, err)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
