package plugin

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/kubegpu/kubegpu/kube-scheduler/apis/config"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/kubegpu/kubegpu/kubeinterface"
)

// PreBindPreFlight says whether PreBind has work: only for pods with
// devices, and only when writeAllocation is PreBind. Skipping matters: a
// PreBind that runs makes the scheduler also write the pod's nominated node
// first, an extra API write per pod.
func (p *Plugin) PreBindPreFlight(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, _ string) (*fwk.PreBindPreFlightResult, *fwk.Status) {
	s := getState(cs)
	switch {
	case s == nil || s.dra:
	case s.claims != nil:
		return nil, nil // the claims' allocations and reservations
	case p.args.WriteAllocation == config.WriteAllocationPreBind:
		return nil, nil
	}
	return nil, fwk.NewStatus(fwk.Skip)
}

// PreBind patches the signed allocation onto the pod before it is bound
// (writeAllocation: PreBind), for clusters whose pods are bound by another
// bind plugin. The patch carries the pod's UID, so it cannot land on a newer
// pod of the same name.
func (p *Plugin) PreBind(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) *fwk.Status {
	s := getState(cs)
	if s == nil || s.dra {
		return nil
	}
	if s.claims != nil {
		if st := p.preBindClaims(ctx, pod, s.claims); st != nil {
			return st
		}
	}
	if s.claimOnly || p.args.WriteAllocation != config.WriteAllocationPreBind {
		return nil
	}
	value, err := p.signedAllocation(pod, s)
	if err != nil {
		return fwk.AsStatus(err)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         pod.UID,
		"annotations": map[string]string{kubeinterface.AnnotationAllocation: value},
	}})
	if err != nil {
		return fwk.AsStatus(err)
	}
	_, err = p.handle.ClientSet().CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, ktypes.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		p.metrics.Written("error")
		return fwk.AsStatus(fmt.Errorf("write allocation to pod %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	p.metrics.Written("signed")
	p.cache.Written(pod.UID, value)
	s.written, s.value = true, value
	klog.FromContext(ctx).V(2).Info("Wrote allocation", "pod", klog.KObj(pod), "node", nodeName, "devices", devicesOf(s.alloc))
	return nil
}
