package objects

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// NodeInventory returns the inventory the node's advertiser published, or
// kubeinterface.ErrNoInventory.
func NodeInventory(node *corev1.Node) (types.Inventory, error) {
	value, ok := node.Annotations[kubeinterface.AnnotationInventory]
	if !ok {
		return types.Inventory{}, kubeinterface.ErrNoInventory
	}
	inv, err := kubeinterface.DecodeInventory(value)
	if err != nil {
		return types.Inventory{}, fmt.Errorf("node %s: %w", node.Name, err)
	}
	return inv, nil
}

// SetNodeInventory writes inv onto the node's annotations.
func SetNodeInventory(node *corev1.Node, inv types.Inventory) error {
	value, err := kubeinterface.EncodeInventory(inv)
	if err != nil {
		return err
	}
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[kubeinterface.AnnotationInventory] = value
	return nil
}

// PodAllocation returns the allocation annotation on the pod, decoded but not
// verified, or kubeinterface.ErrNoAllocation.
func PodAllocation(pod *corev1.Pod) (kubeinterface.Allocation, error) {
	value, ok := pod.Annotations[kubeinterface.AnnotationAllocation]
	if !ok {
		return kubeinterface.Allocation{}, kubeinterface.ErrNoAllocation
	}
	a, err := kubeinterface.DecodeAllocation(value)
	if err != nil {
		return kubeinterface.Allocation{}, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return a, nil
}

// userAnnotations are the annotations a user may set on a pod; any other
// annotation under kubeinterface.Domain that is not written by kubegpu is a
// typo.
var userAnnotations = map[string]bool{
	kubeinterface.AnnotationModelInclude: true,
	kubeinterface.AnnotationModelExclude: true,
	kubeinterface.AnnotationUUIDInclude:  true,
	kubeinterface.AnnotationUUIDExclude:  true,
	kubeinterface.AnnotationTopology:     true,
	kubeinterface.AnnotationPlacement:    true,
	kubeinterface.AnnotationAllocation:   true,
}

// collector gathers field errors for one object.
type collector struct {
	object string
	fields []*kubeinterface.FieldError
}

func (c *collector) add(container, field, value, want string) {
	c.fields = append(c.fields, &kubeinterface.FieldError{Container: container, Field: field, Value: value, Want: want})
}

func (c *collector) err() error {
	if len(c.fields) == 0 {
		return nil
	}
	return &kubeinterface.InvalidError{Object: c.object, Fields: c.fields}
}

// PreemptedByScheduler reports whether the scheduler is evicting pod for a
// preemptor: the pod is being deleted and carries the DisruptionTarget
// condition the scheduler sets before it deletes a victim.
func PreemptedByScheduler(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp == nil {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue && c.Reason == corev1.PodReasonPreemptionByScheduler {
			return true
		}
	}
	return false
}
