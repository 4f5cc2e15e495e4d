package plugin

import (
	"context"
	"fmt"
	"strings"

	"github.com/kubegpu/kubegpu/kube-scheduler/apis/config"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// Bind binds a GPU pod with its signed allocation in one API call: the
// Binding carries the allocation as an annotation, which the API server
// writes onto the pod in the same update that sets its node, with the pod's
// UID as a precondition. The node can never see the pod without its
// allocation, and the pod costs no more API writes than a stock binding.
// Pods without devices, and every pod when writeAllocation is PreBind, are
// left to the next bind plugin (DefaultBinder).
func (p *Plugin) Bind(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) *fwk.Status {
	s := getState(cs)
	if s == nil || s.dra || s.claimOnly || p.args.WriteAllocation != config.WriteAllocationBind {
		return fwk.NewStatus(fwk.Skip)
	}
	value, err := p.signedAllocation(pod, s)
	if err != nil {
		return fwk.AsStatus(err)
	}
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
			Annotations: map[string]string{kubeinterface.AnnotationAllocation: value}},
		Target: corev1.ObjectReference{Kind: "Node", Name: nodeName},
	}
	// Remembered before the call: the informer's event of the bound pod
	// often comes before the call returns, and needs no verification of
	// what this scheduler signed. A failed bind unreserves the pod.
	p.cache.Written(pod.UID, value)
	if err := p.handle.ClientSet().CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		p.metrics.Written("error")
		return fwk.AsStatus(fmt.Errorf("bind pod %s/%s with its allocation: %w", pod.Namespace, pod.Name, err))
	}
	p.metrics.Written("signed")
	s.written, s.value = true, value
	klog.FromContext(ctx).V(2).Info("Bound pod with its allocation", "pod", klog.KObj(pod), "node", nodeName, "devices", devicesOf(s.alloc))
	return nil
}

// devicesOf is an allocation's devices for a log line, by container:
// "train=0,1 init:setup=2". klog would format the allocation itself with
// reflection, which costs several times the line's other fields on every
// bound pod; the annotation on the pod has the whole allocation.
func devicesOf(a types.PodAllocation) string {
	var b strings.Builder
	for _, list := range []struct {
		prefix     string
		containers []types.ContainerAllocation
	}{{"init:", a.InitContainers}, {"", a.Containers}} {
		for _, c := range list.containers {
			if len(c.Devices) == 0 {
				continue
			}
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(list.prefix)
			b.WriteString(c.Name)
			for i, d := range c.Devices {
				if i == 0 {
					b.WriteByte('=')
				} else {
					b.WriteByte(',')
				}
				b.WriteString(d.ID)
			}
		}
	}
	return b.String()
}

// signedAllocation is the annotation value of the cycle's allocation,
// signed for this pod.
func (p *Plugin) signedAllocation(pod *corev1.Pod, s *cycleState) (string, error) {
	return p.sign(kubeinterface.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}, s.alloc)
}

// PostBind reports a GPU pod that another bind plugin bound before this
// plugin's Bind could write its allocation: the node will start it without
// devices. That happens only when the profile does not list KubeGPU first
// under plugins.bind.enabled.
//
// For a pod bound with its allocation, PostBind asks for the scheduler's
// record of it in the pod's status (see package record).
func (p *Plugin) PostBind(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) {
	s := getState(cs)
	if s == nil || s.dra || s.claimOnly { // DRA serves the pod there, or its claims hold its devices
		return
	}
	if s.written {
		p.recorder.Add(pod.UID, ktypes.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, s.value)
		return
	}
	p.metrics.Written("missing")
	msg := fmt.Sprintf("pod was bound to %s without its GPU allocation: another bind plugin ran before %s; list %s first under plugins.bind.enabled in the KubeSchedulerConfiguration", nodeName, Name, Name)
	klog.FromContext(ctx).Error(nil, "Misconfigured profile: "+msg, "pod", klog.KObj(pod))
	p.handle.EventRecorder().Eventf(pod, nil, corev1.EventTypeWarning, "GPUAllocationMissing", "Binding", msg)
}
