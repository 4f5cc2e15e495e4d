package integration

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestClaimAllocatedWhereThePodCannotGo: a pod whose kubegpu claim is
// allocated on a node that does not take it waits while another pod uses
// the claim there; once the claim is reserved for that pod alone (as a
// scheduler leaves it that stopped between reserving the claim and
// binding the pod), kubegpu-scheduler deallocates the claim, as the stock
// DynamicResources plugin does its own, and the pod gets it allocated
// again on a node it may go to.
func TestClaimAllocatedWhereThePodCannotGo(t *testing.T) {
	ctx := context.Background()
	_, _, ns := claimNodes(ctx, t, "claimmove", "t4x4", 2)
	if _, err := tenant(t, ns).ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: gpuClaimSpec(1)}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createPods(ctx, t, ns, claimUser("holder", "c", false))
	waitBound(ctx, t, ns, 1)
	holder, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "holder", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The mover may not go to the claim's node.
	mover := claimUser("mover", "c", false)
	mover.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
			Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpNotIn, Values: []string{holder.Spec.NodeName}}}}}}}}
	createPods(ctx, t, ns, mover)
	waitUnschedulable(ctx, t, ns, "mover", "ResourceClaims are allocated on node "+holder.Spec.NodeName)
	c, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, "c", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Status.Allocation == nil {
		t.Fatal("the claim was deallocated while its holder runs")
	}
	// Reserved for the mover too, then the holder goes: the claim is
	// the mover's alone, on a node it may not go to.
	m, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "mover", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "mover", UID: m.UID})
	if _, err := cluster.Client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deletePod(ctx, t, ns, "holder", true)
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		m, err = cluster.Client.CoreV1().Pods(ns).Get(ctx, "mover", metav1.GetOptions{})
		return err == nil && m.Spec.NodeName != "", nil
	}); err != nil {
		t.Fatalf("the pod was not placed with its claim allocated again: %v\n%v", err, failedSchedulingAll(ctx, t, ns))
	}
	if m.Spec.NodeName == holder.Spec.NodeName {
		t.Fatalf("the pod was bound to %s, which its affinity excludes", m.Spec.NodeName)
	}
	claimOf(ctx, t, ns, m)
}
