package enforce

import (
	"fmt"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// ClaimPolicies says under which policy kubegpu-scheduler placed the
// slices of a kubegpu ResourceClaim prepared on this node, from the
// claim's verified allocation (claimplugin.Store).
type ClaimPolicies interface {
	Enforcement(claimUID string) (types.EnforcementPolicy, error)
}

// allocation is what a running container was given, and whether its
// slices are placed under Required. A container of a pod with kubegpu
// ResourceClaims was given its pod's allocation and its claims' devices:
// all of them are in its ledger annotation, in the order its edits were
// made from (only the shim writes it: CreateContainer drops what a config
// brings), and it is Required when its pod's allocation or any of its
// claims is. Any other container's devices are its verified allocation's.
func (c *Checker) allocation(ctr *runtimeapi.Container, sb *runtimeapi.PodSandbox) (types.ContainerAllocation, bool, error) {
	pa, err := c.o.Rewriter.PodAllocation(&runtimeapi.PodSandboxConfig{Metadata: sb.GetMetadata(), Annotations: sb.GetAnnotations()})
	if err != nil {
		return types.ContainerAllocation{}, false, err
	}
	name := ctr.GetMetadata().GetName()
	required := pa.Enforcement == types.EnforcementRequired
	held, err := claimHeld(ctr)
	if err != nil {
		return types.ContainerAllocation{}, false, err
	}
	if held == nil {
		alloc, _ := pa.Container(name)
		alloc.Name = name
		return alloc, required, nil
	}
	seen := map[string]bool{}
	for _, d := range held {
		if d.Claim == "" || seen[d.Claim] {
			continue
		}
		seen[d.Claim] = true
		if c.o.Claims == nil {
			return types.ContainerAllocation{}, false, fmt.Errorf("the container holds devices of ResourceClaim %s and this shim serves no claims", d.Claim)
		}
		policy, err := c.o.Claims.Enforcement(d.Claim)
		if err != nil {
			return types.ContainerAllocation{}, false, err
		}
		required = required || policy == types.EnforcementRequired
	}
	return types.ContainerAllocation{Name: name, Devices: kubeinterface.Shares(held)}, required, nil
}

// claimHeld returns the devices in a container's ledger annotation when
// any of them is held through a kubegpu ResourceClaim, else nil.
func claimHeld(ctr *runtimeapi.Container) ([]kubeinterface.HeldDevice, error) {
	v, ok := ctr.GetAnnotations()[kubeinterface.AnnotationContainerHeld]
	if !ok || ctr.GetLabels()[kubeinterface.LabelContainerLedger] != kubeinterface.LedgerVersion {
		return nil, nil
	}
	held, err := kubeinterface.DecodeHeld(v)
	if err != nil {
		return nil, err
	}
	for _, d := range held {
		if d.Claim != "" {
			return held, nil
		}
	}
	return nil, nil
}
