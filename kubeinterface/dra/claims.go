package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// ClassName is kubegpu's DeviceClass: whole GPUs by count, GPU slices by a
// capacity request (memory, cores). Its one selector admits the devices of
// driver DriverName; claims for it are allocated by kubegpu-scheduler's
// engine, not by the stock DynamicResources plugin.
const ClassName = DriverName

// DevicesQuota is the resource of a ResourceQuota that caps the devices
// a namespace's ResourceClaims of ClassName ask for (Kubernetes' quota on
// DRA devices, per DeviceClass).
const DevicesQuota = ClassName + ".deviceclass.resource.k8s.io/devices"

// ClassSelector is ClassName's CEL selector.
const ClassSelector = `device.driver == "` + DriverName + `"`

// ClaimCDIKind is the CDI kind of the devices of kubegpu's prepared claims,
// which the node's shim resolves itself in CreateContainer.
const ClaimCDIKind = DriverName + "/claim"

// claimEntryPrefix begins the name of an entry of a claim's signed
// allocation (ClaimEntry). Container names are DNS labels: none has a "/".
const claimEntryPrefix = "claim/"

// ClaimEntry names the entry of a signed allocation (and the engine's
// container) that holds the devices of request req of the claim a pod
// names podClaim: "claim/<pod claim>/<request>", where req is a request's
// name, or "<request>/<subrequest>" for the alternative of a firstAvailable
// request it was given, as DRA names the request of a result.
func ClaimEntry(podClaim, req string) string { return claimEntryPrefix + podClaim + "/" + req }

// IsClaimEntry reports whether an allocation's entry (or an engine
// container) stands for a claim request (ClaimEntry).
func IsClaimEntry(name string) bool { return strings.HasPrefix(name, claimEntryPrefix) }

// ClaimEntryOf reports whether entry stands for a request of the claim a
// pod names podClaim.
func ClaimEntryOf(entry, podClaim string) bool {
	return strings.HasPrefix(entry, claimEntryPrefix+podClaim+"/")
}

// ClaimEntryRequest is the request an entry named by ClaimEntry stands
// for: a results' request name, "<request>" or "<request>/<subrequest>".
func ClaimEntryRequest(entry string) (string, bool) {
	rest, ok := strings.CutPrefix(entry, claimEntryPrefix)
	if !ok {
		return "", false
	}
	// The pod's name of the claim is a DNS label: up to the first "/".
	_, req, ok := strings.Cut(rest, "/")
	if !ok || req == "" {
		return "", false
	}
	return req, true
}

// ErrMixedClaim means a claim asks for kubegpu's DeviceClass and for
// another in the same claim: two allocators would have to agree in one
// pass.
var ErrMixedClaim = errors.New("asks for kubegpu's DeviceClass " + ClassName + " beside other DeviceClasses in one claim; use one claim for each")

// Ours reports whether kubegpu-scheduler allocates claim: every request
// (and every alternative of a firstAvailable request) names ClassName. A
// claim that names ClassName beside another class is an error wrapping
// ErrMixedClaim, naming the requests.
func Ours(claim *resourceapi.ResourceClaim) (bool, error) {
	var ours, others []string
	add := func(name, class string) {
		if class == ClassName {
			ours = append(ours, name)
		} else {
			others = append(others, name)
		}
	}
	for _, r := range claim.Spec.Devices.Requests {
		if r.Exactly != nil {
			add(r.Name, r.Exactly.DeviceClassName)
		}
		for _, s := range r.FirstAvailable {
			add(r.Name+"/"+s.Name, s.DeviceClassName)
		}
	}
	switch {
	case len(ours) == 0:
		return false, nil
	case len(others) > 0:
		return false, fmt.Errorf("claim %s/%s %w (requests %q for %s, %q for others)", claim.Namespace, claim.Name, ErrMixedClaim, ours, ClassName, others)
	}
	return true, nil
}

// Signed configuration: kubegpu-scheduler writes, in the allocation of each
// claim it allocates, an opaque configuration for DriverName that carries
// its signed allocation (kubeinterface.Allocation, the claim in place of
// the pod), which the node verifies before it prepares the devices.
const (
	configAPIVersion = "gpu.kubegpu.io/v1"
	configKind       = "SignedAllocation"
)

// signedConfig is the opaque configuration's parameters. The allocation is
// a string, so that the bytes its signature covers survive the API
// server's re-encoding of the parameters.
type signedConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Allocation string `json:"allocation"`
}

// SignedConfig is the configuration that carries value, an encoded signed
// allocation (kubeinterface.EncodeAllocation), in a claim's allocation.
func SignedConfig(value string) (resourceapi.DeviceAllocationConfiguration, error) {
	b, err := json.Marshal(signedConfig{APIVersion: configAPIVersion, Kind: configKind, Allocation: value})
	if err != nil {
		return resourceapi.DeviceAllocationConfiguration{}, fmt.Errorf("signed configuration: %w", err)
	}
	if len(b) > resourceapi.OpaqueParametersMaxLength {
		return resourceapi.DeviceAllocationConfiguration{}, fmt.Errorf("signed configuration: %d bytes is over the API's %d", len(b), resourceapi.OpaqueParametersMaxLength)
	}
	return resourceapi.DeviceAllocationConfiguration{
		Source: resourceapi.AllocationConfigSourceClass,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: DriverName, Parameters: runtime.RawExtension{Raw: b},
		}},
	}, nil
}

// SignedConfigFor signs alloc, the devices of the claim ref, with sign
// (a kubeinterface.Key's Sign) and returns the configuration that carries
// it (SignedConfig).
func SignedConfigFor(sign func(kubeinterface.Allocation) (kubeinterface.Allocation, error), ref kubeinterface.PodRef, alloc types.PodAllocation) (resourceapi.DeviceAllocationConfiguration, error) {
	a, err := sign(kubeinterface.Allocation{Pod: ref, PodAllocation: alloc})
	if err != nil {
		return resourceapi.DeviceAllocationConfiguration{}, err
	}
	value, err := kubeinterface.EncodeAllocation(a)
	if err != nil {
		return resourceapi.DeviceAllocationConfiguration{}, err
	}
	return SignedConfig(value)
}

// ErrNotSigned means a claim's allocation carries no signed configuration
// of kubegpu-scheduler's.
var ErrNotSigned = errors.New("the claim's allocation carries no " + configKind + " configuration of driver " + DriverName)

// SignedValue returns the encoded signed allocation in alloc (see
// SignedConfig), decoded and validated but not verified: the caller
// verifies it with its keys. Exactly one such configuration is allowed;
// none is ErrNotSigned, anything malformed an error that says what.
func SignedValue(alloc *resourceapi.AllocationResult) (kubeinterface.Allocation, string, error) {
	if alloc == nil {
		return kubeinterface.Allocation{}, "", ErrNotSigned
	}
	var found []string
	for _, c := range alloc.Devices.Config {
		// Only what the scheduler adds (FromClass): a claim's own
		// configuration is its tenant's.
		if c.Opaque == nil || c.Opaque.Driver != DriverName || c.Source != resourceapi.AllocationConfigSourceClass {
			continue
		}
		raw := c.Opaque.Parameters.Raw
		if len(raw) > resourceapi.OpaqueParametersMaxLength {
			return kubeinterface.Allocation{}, "", fmt.Errorf("%s configuration: %d bytes is over the API's %d", configKind, len(raw), resourceapi.OpaqueParametersMaxLength)
		}
		var p signedConfig
		if err := json.Unmarshal(raw, &p); err != nil {
			return kubeinterface.Allocation{}, "", fmt.Errorf("%s configuration: %w", configKind, err)
		}
		if p.APIVersion != configAPIVersion || p.Kind != configKind {
			return kubeinterface.Allocation{}, "", fmt.Errorf("configuration of driver %s is %s %s, want %s %s", DriverName, p.APIVersion, p.Kind, configAPIVersion, configKind)
		}
		found = append(found, p.Allocation)
	}
	switch len(found) {
	case 0:
		return kubeinterface.Allocation{}, "", ErrNotSigned
	case 1:
	default:
		return kubeinterface.Allocation{}, "", fmt.Errorf("the claim's allocation carries %d %s configurations of driver %s, want one", len(found), configKind, DriverName)
	}
	a, err := kubeinterface.DecodeAllocation(found[0])
	if err != nil {
		return kubeinterface.Allocation{}, "", err
	}
	return a, found[0], nil
}

// ClaimAllocation is the kubegpu allocation signed into claim's status
// (SignedValue), refused unless it names this very claim (namespace, name
// and UID) and, with verify, unless verify accepts its signature.
func ClaimAllocation(claim *resourceapi.ResourceClaim, verify func(kubeinterface.Allocation) error) (kubeinterface.Allocation, string, error) {
	a, value, err := SignedValue(claim.Status.Allocation)
	if err != nil {
		return kubeinterface.Allocation{}, "", err
	}
	if a.Pod.UID != claim.UID || a.Pod.Namespace != claim.Namespace || a.Pod.Name != claim.Name {
		return kubeinterface.Allocation{}, "", errors.New("the signed allocation is for another object")
	}
	if verify != nil {
		if err := verify(a); err != nil {
			return kubeinterface.Allocation{}, "", err
		}
	}
	return a, value, nil
}
