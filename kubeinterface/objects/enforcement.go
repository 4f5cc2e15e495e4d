package objects

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// EnforcementPolicy is the policy a pod of namespace ns is placed under:
// the namespace's kubegpu.io/enforcement label if it has one, else def
// (the scheduler's). ns may be nil (not known yet): def applies. A label
// with another value is an error that says what it may be, and the pod
// is not placed until it is fixed: a typo must not relax a Required
// namespace.
func EnforcementPolicy(ns *corev1.Namespace, def types.EnforcementPolicy) (types.EnforcementPolicy, error) {
	if ns == nil {
		return def, nil
	}
	v, ok := ns.Labels[kubeinterface.LabelEnforcement]
	if !ok {
		return def, nil
	}
	p := types.EnforcementPolicy(v)
	if !p.Valid() {
		return "", fmt.Errorf("namespace %s: label %s=%q: want %s or %s", ns.Name, kubeinterface.LabelEnforcement, v,
			types.EnforcementRequired, types.EnforcementBestEffort)
	}
	return p, nil
}

// Enforcement is what a pod's kubegpu.io/Enforced condition says: State is
// its reason (ReasonEnforced, ReasonMismatch, ...), or "" when the node
// has not recorded it yet (the pod has no slices running, or its node's
// shim predates the condition).
type Enforcement struct {
	State, Message string
}

// PodEnforcement reads the pod's kubegpu.io/Enforced condition.
func PodEnforcement(pod *corev1.Pod) Enforcement {
	for _, c := range pod.Status.Conditions {
		if string(c.Type) == kubeinterface.ConditionEnforced {
			return Enforcement{State: c.Reason, Message: c.Message}
		}
	}
	return Enforcement{}
}
