package app

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNominationNote: a preemptor's explanation names the victims still
// leaving its nominated node, and says when none is left.
func TestNominationNote(t *testing.T) {
	now := metav1.Now()
	victim := func(name string, preempted bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, DeletionTimestamp: &now}, Spec: corev1.PodSpec{NodeName: "n1"}}
		if preempted {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: corev1.PodReasonPreemptionByScheduler}}
		}
		return p
	}
	s := &clusterState{
		pods:           map[string][]podAllocation{"n1": {{pod: victim("a", true)}, {pod: victim("deleted-by-user", false)}}},
		withoutDevices: map[string][]*corev1.Pod{"n1": {victim("b", true)}},
	}
	pod := &corev1.Pod{Status: corev1.PodStatus{NominatedNodeName: "n1"}}
	if got := nominationNote(s, pod); !strings.Contains(got, "waits for the pods evicted there to leave: ns/a, ns/b.") {
		t.Errorf("note = %q, want the two victims named", got)
	}
	pod.Status.NominatedNodeName = "n2"
	if got := nominationNote(s, pod); !strings.Contains(got, "no pod evicted there is left") {
		t.Errorf("note = %q, want no victims left", got)
	}
}
