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

// MaxVariants bounds the combinations of the alternatives of a pod's
// firstAvailable requests (Compile): the engine evaluates each on a node
// where the ones before it do not fit.
const MaxVariants = 32

// Compile returns the engine's container requests for the requests of the
// unallocated claims among pcs, one container per request (dra.ClaimEntry),
// as variants in the order DRA prefers them: one for each combination of
// the alternatives of their firstAvailable requests, earlier alternatives
// of earlier requests first (one variant when there are none). An
// alternative whose selectors no device passes is left out. A request
// kubegpu cannot place yet is an error wrapping ErrInvalid that says what;
// one no device passes the selectors of (of any alternative), one wrapping
// ErrWaiting (devices may be published later).
func (c *Compiler) Compile(ctx context.Context, pcs []PodClaim) ([][]types.ContainerRequest, error) {
	// Bounded before any selector is evaluated: the engine takes at most
	// MaxRequests containers and MaxVariants variants, and selectors get
	// selectorTimeout in all.
	n, variants := 0, 1
	for _, pc := range pcs {
		if pc.Allocated() {
			continue
		}
		for _, r := range pc.Claim.Spec.Devices.Requests {
			n++
			if k := len(r.FirstAvailable); k > 0 && variants <= MaxVariants {
				variants *= k
			}
		}
	}
	if n > MaxRequests {
		return nil, fmt.Errorf("%w: the pod's claims of kubegpu's DeviceClass make %d requests, at most %d are placed", ErrInvalid, n, MaxRequests)
	}
	if variants > MaxVariants {
		return nil, fmt.Errorf("%w: the alternatives (firstAvailable) of the pod's claims of kubegpu's DeviceClass make over %d combinations, at most %d are placed", ErrInvalid, MaxVariants, MaxVariants)
	}
	ctx, cancel := context.WithTimeout(ctx, selectorTimeout)
	defer cancel()
	v := &view{list: c.Devices}
	var options [][]types.ContainerRequest // per request, its alternatives
	for _, pc := range pcs {
		if pc.Allocated() {
			continue
		}
		for _, r := range pc.Claim.Spec.Devices.Requests {
			specs := specsOf(r)
			var alts []types.ContainerRequest
			var left []string // the alternatives left out, and why
			waiting := false
			for _, sp := range specs {
				cr, err := c.compile(ctx, pc, sp, v)
				if sp.alt && ctx.Err() == nil && (errors.Is(err, errNoDevice) || errors.Is(err, errTooMany)) {
					// As DRA's allocator passes over an alternative
					// it cannot satisfy.
					left = append(left, err.Error())
					waiting = waiting || errors.Is(err, errNoDevice)
					continue
				}
				if err != nil {
					return nil, err
				}
				alts = append(alts, cr)
			}
			if len(alts) == 0 {
				wrap := ErrInvalid
				if waiting {
					wrap = ErrWaiting
				}
				return nil, fmt.Errorf("%w: claim %s request %s: none of its alternatives can be placed: %s", wrap, pc.Claim.Name, r.Name, strings.Join(left, "; "))
			}
			options = append(options, alts)
		}
	}
	return combinations(options), nil
}

// combinations returns one list for each choice of one element of every
// options[i], the later lists changing first (an odometer): the order in
// which DRA's allocator tries the alternatives of a claim's requests.
func combinations(options [][]types.ContainerRequest) [][]types.ContainerRequest {
	idx := make([]int, len(options))
	var out [][]types.ContainerRequest
	for {
		v := make([]types.ContainerRequest, len(options))
		for i, o := range options {
			v[i] = o[idx[i]]
		}
		out = append(out, v)
		i := len(options) - 1
		for ; i >= 0; i-- {
			if idx[i]++; idx[i] < len(options[i]) {
				break
			}
			idx[i] = 0
		}
		if i < 0 {
			return out
		}
	}
}

// spec is one way to satisfy a claim request: the request itself, or one
// alternative of its firstAvailable list.
type spec struct {
	// ref is the request's name in results: "<request>", or
	// "<request>/<subrequest>" (alt).
	ref         string
	alt         bool
	class       string
	selectors   []resourceapi.DeviceSelector
	mode        resourceapi.DeviceAllocationMode
	count       int64
	adminAccess bool
	capacity    *resourceapi.CapacityRequirements
}

// specsOf returns the ways to satisfy r, in DRA's order of preference.
func specsOf(r resourceapi.DeviceRequest) []spec {
	if e := r.Exactly; e != nil {
		return []spec{{ref: r.Name, class: e.DeviceClassName, selectors: e.Selectors, mode: e.AllocationMode, count: e.Count,
			adminAccess: e.AdminAccess != nil && *e.AdminAccess, capacity: e.Capacity}}
	}
	out := make([]spec, len(r.FirstAvailable))
	for i, s := range r.FirstAvailable {
		out[i] = spec{ref: r.Name + "/" + s.Name, alt: true, class: s.DeviceClassName, selectors: s.Selectors, mode: s.AllocationMode, count: s.Count, capacity: s.Capacity}
	}
	return out
}

// errNoDevice marks ErrWaiting for a request no device passes the
// selectors of, and errTooMany ErrInvalid for one that asks for more
// devices than an allocation holds: an alternative that is left out.
var (
	errNoDevice = errors.New("no device passes the selectors")
	errTooMany  = fmt.Errorf("more devices than an allocation holds (%d)", resourceapi.AllocationResultsMaxSize)
)

// view is the cluster's kubegpu devices, listed once per Compile, when a
// request first needs them.
type view struct {
	list       func() ([]*resourceapi.ResourceSlice, error)
	listed     bool
	devices    []*resourceapi.ResourceSlice
	partitions bool
}

func (v *view) get() error {
	if v.listed {
		return nil
	}
	devices, err := v.list()
	if err != nil {
		return fmt.Errorf("ResourceSlices: %w", err)
	}
	v.listed, v.devices, v.partitions = true, devices, hasPartitions(devices)
	return nil
}

// compile returns the engine's container request for one way to satisfy
// a request of pc, its selectors evaluated over v's devices.
func (c *Compiler) compile(ctx context.Context, pc PodClaim, sp spec, v *view) (types.ContainerRequest, error) {
	cr, selectors, err := c.request(pc, sp)
	if err != nil {
		return cr, err
	}
	// DRA takes a partition (MIG) whole: a claim's slices go on whole
	// GPUs only. An alternative goes only on devices whose node prepares
	// alternatives (dra.AttributePreparesAlternatives).
	m := match{wholeOnly: cr.Shared(), alternative: sp.alt}
	if len(selectors) == 0 && !m.wholeOnly && !m.alternative {
		return cr, nil
	}
	if err := v.get(); err != nil {
		return cr, err
	}
	if len(selectors) == 0 && !v.partitions && !m.alternative {
		return cr, nil // nothing to narrow
	}
	uuids, err := c.matching(ctx, selectors, v.devices, m)
	switch {
	case err != nil && ctx.Err() != nil:
		// Slow, not wrong: tried again later.
		return cr, fmt.Errorf("%w: claim %s request %s: %w", ErrWaiting, pc.Claim.Name, sp.ref, err)
	case err != nil:
		return cr, fmt.Errorf("%w: claim %s request %s: %w", ErrInvalid, pc.Claim.Name, sp.ref, err)
	case len(uuids) == 0 && m.wholeOnly:
		return cr, fmt.Errorf("%w: claim %s request %s: %w: no whole GPU of driver %s does (a slice goes on a whole GPU, not a partition)", ErrWaiting, pc.Claim.Name, sp.ref, errNoDevice, dra.DriverName)
	case len(uuids) == 0 && m.alternative:
		return cr, fmt.Errorf("%w: claim %s request %s: %w: no device of driver %s whose node's kubegpu-crishim prepares alternatives does", ErrWaiting, pc.Claim.Name, sp.ref, errNoDevice, dra.DriverName)
	case len(uuids) == 0:
		return cr, fmt.Errorf("%w: claim %s request %s: %w: no device of driver %s does", ErrWaiting, pc.Claim.Name, sp.ref, errNoDevice, dra.DriverName)
	}
	cr.Selector.IncludeUUIDs = uuids
	return cr, nil
}

// request compiles one way to satisfy a claim request; selectors are the
// CEL selectors to evaluate, the class's beyond dra.ClassSelector and the
// request's own.
func (c *Compiler) request(pc PodClaim, sp spec) (types.ContainerRequest, []resourceapi.DeviceSelector, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: claim %s request %s: %s", ErrInvalid, pc.Claim.Name, sp.ref, fmt.Sprintf(format, args...))
	}
	if sp.mode != "" && sp.mode != resourceapi.DeviceAllocationModeExactCount {
		return types.ContainerRequest{}, nil, bad("allocationMode %s: kubegpu-scheduler places ExactCount requests only", sp.mode)
	}
	if sp.adminAccess {
		return types.ContainerRequest{}, nil, bad("adminAccess is not offered for kubegpu's devices")
	}
	count := sp.count
	if count == 0 {
		count = 1
	}
	if count > resourceapi.AllocationResultsMaxSize {
		return types.ContainerRequest{}, nil, fmt.Errorf("%w: claim %s request %s: %d devices: %w", ErrInvalid, pc.Claim.Name, sp.ref, count, errTooMany)
	}
	// A claim's devices are NVIDIA's (or simulated): the class publishes
	// no other vendor's apart, and a CUDA claim must not get an AMD GPU.
	cr := types.ContainerRequest{Name: dra.ClaimEntry(pc.Name, sp.ref), Count: int(min(count, 1<<16)),
		Selector: types.Selector{Resource: types.ResourceNVIDIAGPU}}
	if sp.capacity != nil && len(sp.capacity.Requests) > 0 {
		// What DRA's accounting counts for a capacity the request does
		// not name (the devices' request policies, dra.Devices): no
		// memory, and all of the cores.
		cr.ComputePercent = types.MaxComputePercent
		for name, q := range sp.capacity.Requests {
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
	class, err := c.Classes.Get(sp.class)
	if err != nil {
		return types.ContainerRequest{}, nil, fmt.Errorf("%w: claim %s request %s: DeviceClass %s: %w", ErrWaiting, pc.Claim.Name, sp.ref, sp.class, err)
	}
	var selectors []resourceapi.DeviceSelector
	for _, s := range class.Spec.Selectors {
		if s.CEL != nil && strings.TrimSpace(s.CEL.Expression) == dra.ClassSelector {
			continue
		}
		selectors = append(selectors, s)
	}
	selectors = append(selectors, sp.selectors...)
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

// match narrows the devices a request may take beyond its selectors.
type match struct {
	// wholeOnly: no partition. alternative: only devices whose node
	// prepares alternatives.
	wholeOnly, alternative bool
}

// matching returns the UUIDs of the devices of dra.DriverName that pass
// every selector and m.
func (c *Compiler) matching(ctx context.Context, selectors []resourceapi.DeviceSelector, devices []*resourceapi.ResourceSlice, m match) ([]string, error) {
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
			if _, part := d.Attributes[dra.AttributeParent]; part && m.wholeOnly {
				continue
			}
			if a := d.Attributes[dra.AttributePreparesAlternatives].BoolValue; m.alternative && (a == nil || !*a) {
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

// RankScore is the score that ranks a node where the engine placed
// variant of variants (Compile) with score: every node that takes an
// earlier variant before every node that takes a later one, as DRA prefers
// earlier alternatives; by score among nodes of one variant. Scores are
// the engine's, within [-2^62, 2^62+2^24) (devicescheduler.MaxPolicyScore
// shifted over a 24-bit tie-break); with several variants they lose their
// 8 lowest bits, of the tie-break.
func RankScore(score int64, variant, variants int) int64 {
	if variants <= 1 {
		return score
	}
	return score>>8 - int64(min(variant, MaxVariants))<<56
}
