package objects

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubegpu/kubegpu/kubeinterface"
)

// Where a pod's allocation is read from.
const (
	// SourceRecord is the scheduler's record in the pod's status
	// (condition kubeinterface.ConditionAllocated).
	SourceRecord = "record"
	// SourceAnnotation is the pod's kubeinterface.AnnotationAllocation,
	// for a pod the scheduler has not recorded (yet).
	SourceAnnotation = "annotation"
)

// ErrMismatch is wrapped by HeldAllocation's error when an allocation was
// written for another pod, an earlier pod of the same name, or another node.
var ErrMismatch = errors.New("allocation belongs elsewhere")

// Held is the allocation by which a bound pod holds devices.
type Held struct {
	kubeinterface.Allocation
	// Source is SourceRecord or SourceAnnotation.
	Source string
	// Value is the encoded payload the allocation was read from.
	Value string
	// AnnotationDiffers is true when the pod has a record and its
	// annotation is missing or is not the recorded value: it was changed
	// after binding, and what the node gives new containers no longer
	// matches the devices the pod holds.
	AnnotationDiffers bool
}

// PodRecord returns the allocation the scheduler recorded in the pod's
// status, decoded but not verified, or kubeinterface.ErrNoAllocation.
func PodRecord(pod *corev1.Pod) (kubeinterface.Allocation, string, error) {
	value, ok := RecordValue(pod)
	if !ok {
		return kubeinterface.Allocation{}, "", kubeinterface.ErrNoAllocation
	}
	a, err := kubeinterface.DecodeAllocation(value)
	if err != nil {
		return kubeinterface.Allocation{}, value, fmt.Errorf("pod %s/%s: condition %s: %w", pod.Namespace, pod.Name, kubeinterface.ConditionAllocated, err)
	}
	return a, value, nil
}

// RecordValue returns the message of the pod's ConditionAllocated, the
// recorded payload, if the pod has the condition with status True.
func RecordValue(pod *corev1.Pod) (string, bool) {
	for i := range pod.Status.Conditions {
		c := &pod.Status.Conditions[i]
		if c.Type == kubeinterface.ConditionAllocated && c.Status == corev1.ConditionTrue {
			return c.Message, true
		}
	}
	return "", false
}

// RecordCondition is the condition that records value, an encoded
// allocation, in a pod's status.
func RecordCondition(value string, now metav1.Time) corev1.PodCondition {
	return corev1.PodCondition{
		Type: kubeinterface.ConditionAllocated, Status: corev1.ConditionTrue,
		Reason: "Allocated", Message: value, LastTransitionTime: now,
	}
}

// HeldAllocation returns the allocation by which the bound pod holds
// devices: the scheduler's record in the pod's status when the pod has one,
// else its annotation. The allocation must name this pod (namespace, name
// and UID) and its node, and pass verify, when verify is not nil (the
// scheduler's key's Verify). A pod with neither gives
// kubeinterface.ErrNoAllocation; a record that does not verify is an error
// whatever the annotation says, since only the scheduler and the pod's node
// can write a pod's status.
func HeldAllocation(pod *corev1.Pod, verify func(kubeinterface.Allocation) error) (Held, error) {
	annotation, annotated := pod.Annotations[kubeinterface.AnnotationAllocation]
	h := Held{Source: SourceRecord}
	var err error
	h.Allocation, h.Value, err = PodRecord(pod)
	switch {
	case errors.Is(err, kubeinterface.ErrNoAllocation):
		h.Source = SourceAnnotation
		h.Allocation, err = PodAllocation(pod)
		h.Value = annotation
	case err == nil:
		h.AnnotationDiffers = !annotated || annotation != h.Value
	}
	if err != nil {
		return h, err
	}
	if verify != nil {
		if err := verify(h.Allocation); err != nil {
			return h, fmt.Errorf("pod %s/%s: %s: %w", pod.Namespace, pod.Name, h.Source, err)
		}
	}
	a := h.Allocation
	if a.Pod.Namespace != pod.Namespace || a.Pod.Name != pod.Name || a.Pod.UID != pod.UID || a.Node != pod.Spec.NodeName {
		return h, fmt.Errorf("%w: the %s is for pod %s/%s (uid %s) on node %s, not pod %s/%s (uid %s) on node %s", ErrMismatch, h.Source,
			a.Pod.Namespace, a.Pod.Name, a.Pod.UID, kubeinterface.Quote(a.Node), pod.Namespace, pod.Name, pod.UID, kubeinterface.Quote(pod.Spec.NodeName))
	}
	return h, nil
}
