package app

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/kubegpu/kubegpu/types"
)

// TestNodeExcludes: explain leaves out, with the reason, the nodes the
// scheduler's node filters leave out: by nodeSelector and by taints.
func TestNodeExcludes(t *testing.T) {
	node := func(name string, taints ...corev1.Taint) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}}, Spec: corev1.NodeSpec{Taints: taints}}
	}
	pinned := &corev1.Pod{Spec: corev1.PodSpec{NodeSelector: map[string]string{corev1.LabelHostname: "a"}}}
	affinity := nodeaffinity.GetRequiredNodeAffinity(pinned)
	if got := nodeExcludes(affinity, pinned, node("a")); got != "" {
		t.Errorf("the node the pod is pinned to: excluded (%s)", got)
	}
	if got := nodeExcludes(affinity, pinned, node("b")); !strings.Contains(got, "nodeSelector") {
		t.Errorf("another node: %q, want excluded by the nodeSelector", got)
	}
	free := &corev1.Pod{}
	tainted := node("c", corev1.Taint{Key: "gpu", Value: "reserved", Effect: corev1.TaintEffectNoSchedule})
	if got := nodeExcludes(nodeaffinity.GetRequiredNodeAffinity(free), free, tainted); !strings.Contains(got, "gpu=reserved:NoSchedule") {
		t.Errorf("a tainted node: %q, want the taint named", got)
	}
	free.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpExists}}
	if got := nodeExcludes(nodeaffinity.GetRequiredNodeAffinity(free), free, tainted); got != "" {
		t.Errorf("a tolerated taint: %q", got)
	}
}

// TestUnknownModels: models no node has are named, with the models the
// nodes have (bounded); a model named in other case is known.
func TestUnknownModels(t *testing.T) {
	nodes := []nodeState{{inv: types.Inventory{Devices: []types.Device{{Model: "Tesla T4"}, {Model: "NVIDIA A100"}}}}}
	req := func(models ...string) types.PodRequest {
		return types.PodRequest{Containers: []types.ContainerRequest{{Selector: types.Selector{IncludeModels: models}}}}
	}
	if got := unknownModels(req("tesla t4"), nodes); got != "" {
		t.Errorf("a known model in other case: %q", got)
	}
	got := unknownModels(req("T4", "Tesla T4"), nodes)
	if !strings.Contains(got, `model "T4"`) || !strings.Contains(got, `The nodes' models: "NVIDIA A100", "Tesla T4".`) {
		t.Errorf("unknown model: %q", got)
	}
	for i := range 40 {
		nodes = append(nodes, nodeState{inv: types.Inventory{Devices: []types.Device{{Model: strings.Repeat("m", i+1)}}}})
	}
	if got := unknownModels(req("T4"), nodes); !strings.HasSuffix(got, " and 26 more.") {
		t.Errorf("many models: %q, want 16 listed", got)
	}
}

// TestSchedulerSays: a pending pod's PodScheduled message is shown,
// escaped and bounded; a bound pod's is not.
func TestSchedulerSays(t *testing.T) {
	pod := &corev1.Pod{Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Message: "GPUs: the pod belongs to pod group \x1b[2J" + strings.Repeat("x", 2000)}}}}
	got := schedulerSays(pod)
	if !strings.HasPrefix(got, `GPUs: the pod belongs to pod group \x1b[2J`) || len(got) > maxSchedulerWords+20 {
		t.Errorf("message %q (%d bytes), want it escaped and cut", got[:60], len(got))
	}
	pod.Spec.NodeName = "n1"
	if got := schedulerSays(pod); got != "" {
		t.Errorf("a bound pod: %q", got)
	}
}

func TestAcceptsAnyKey(t *testing.T) {
	inv := types.Inventory{KeyIDs: []string{"ed25519:a"}}
	if !acceptsAnyKey(inv, []string{"ed25519:b", "ed25519:a"}) || acceptsAnyKey(inv, []string{"ed25519:b"}) || !acceptsAnyKey(types.Inventory{}, []string{"x"}) {
		t.Error("acceptsAnyKey does not follow the node's key IDs")
	}
}
