package devicecache

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/kubeinterface"
)

// TestDeviceNodesTolerated follows the device nodes' hard taints through
// node updates and deletes: only NoSchedule and NoExecute taints count,
// only nodes that publish devices, and the sets are forgotten with their
// last node.
func TestDeviceNodesTolerated(t *testing.T) {
	c, _ := testCache(t)
	logger := klog.Background()
	gpuTaint := corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}
	tainted := func(name string, taints ...corev1.Taint) *corev1.Node {
		n := testNode(t, name, "t4x4")
		n.Spec.Taints = taints
		return n
	}
	tolerating := func(tolerations ...corev1.Toleration) func([]corev1.Taint) bool {
		return func(taints []corev1.Taint) bool {
			for i := range taints {
				ok := false
				for _, tol := range tolerations {
					ok = ok || tol.ToleratesTaint(logger, &taints[i], false)
				}
				if !ok {
					return false
				}
			}
			return true
		}
	}
	none := tolerating()
	gpu := tolerating(corev1.Toleration{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists})
	check := func(what string, f func([]corev1.Taint) bool, want bool) {
		t.Helper()
		if got := c.DeviceNodesTolerated(f); got != want {
			t.Errorf("%s: DeviceNodesTolerated = %v, want %v (sets %v)", what, got, want, c.taints.sets)
		}
	}

	check("no nodes", none, false)
	// A node without devices counts for nothing, tainted or not.
	c.UpdateNode(logger, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu"}})
	check("a node without devices", none, false)

	c.UpdateNode(logger, tainted("gpu-a", gpuTaint))
	c.UpdateNode(logger, tainted("gpu-b", corev1.Taint{Key: "other", Effect: corev1.TaintEffectPreferNoSchedule}, gpuTaint))
	check("tainted GPU nodes, no toleration", none, false)
	check("tainted GPU nodes, tolerated", gpu, true)
	if len(c.taints.sets) != 1 || c.taints.sets[hardTaints(tainted("x", gpuTaint)).key].nodes != 2 {
		t.Errorf("sets %v: want one set of two nodes (PreferNoSchedule does not count)", c.taints.sets)
	}

	// A GPU node with only a soft taint is open to every pod.
	c.UpdateNode(logger, tainted("gpu-c", corev1.Taint{Key: "other", Effect: corev1.TaintEffectPreferNoSchedule}))
	check("an untainted GPU node", none, true)
	c.UpdateNode(logger, tainted("gpu-c", corev1.Taint{Key: "evicting", Effect: corev1.TaintEffectNoExecute}))
	check("gpu-c tainted NoExecute", none, false)
	check("gpu-c tainted NoExecute, GPU toleration (gpu-a and gpu-b)", gpu, true)
	check("gpu-c tainted NoExecute, tolerating it alone", tolerating(corev1.Toleration{Key: "evicting", Operator: corev1.TolerationOpExists}), true)

	// A node that stops publishing devices stops counting.
	c.UpdateNode(logger, tainted("gpu-c", corev1.Taint{Key: "evicting", Effect: corev1.TaintEffectNoExecute}))
	noInventory := tainted("gpu-c")
	delete(noInventory.Annotations, kubeinterface.AnnotationInventory)
	c.UpdateNode(logger, noInventory)
	check("gpu-c without inventory", gpu, true)
	check("gpu-c without inventory, no toleration", none, false)

	// Deleted and created again, a node is counted once.
	c.DeleteNode("gpu-a")
	c.UpdateNode(logger, tainted("gpu-a", gpuTaint))
	c.UpdateNode(logger, tainted("gpu-a", gpuTaint))
	if s := c.taints.sets[hardTaints(tainted("x", gpuTaint)).key]; s == nil || s.nodes != 2 {
		t.Errorf("gpu-a deleted and created again: set %+v, want 2 nodes (gpu-a, gpu-b)", s)
	}

	for _, name := range []string{"gpu-a", "gpu-b", "gpu-c", "cpu"} {
		c.DeleteNode(name)
	}
	check("all deleted", tolerating(corev1.Toleration{Operator: corev1.TolerationOpExists}), false)
	if len(c.taints.sets) != 0 || c.taints.open != 0 || c.KnowsDevices() {
		t.Errorf("sets %v, %d open after every node went, want none", c.taints.sets, c.taints.open)
	}
}

// TestDeviceTaintsBounded: what a node says cannot make a cycle's check
// cost more than maxHardTaints or maxTaintSets: a node with more hard
// taints counts as open to every pod, and with more distinct sets every
// pod is taken to reach a device node.
func TestDeviceTaintsBounded(t *testing.T) {
	c, _ := testCache(t)
	logger := klog.Background()
	calls := 0
	none := func([]corev1.Taint) bool { calls++; return false }

	many := testNode(t, "many", "t4x4")
	for i := range maxHardTaints + 1 {
		many.Spec.Taints = append(many.Spec.Taints, corev1.Taint{Key: fmt.Sprint("k", i), Effect: corev1.TaintEffectNoSchedule})
	}
	c.UpdateNode(logger, many)
	if !c.DeviceNodesTolerated(none) || calls != 0 {
		t.Errorf("a node with %d hard taints: not open to every pod (%d sets asked)", maxHardTaints+1, calls)
	}
	c.DeleteNode("many")

	for i := range maxTaintSets + 1 {
		n := testNode(t, fmt.Sprint("n", i), "t4x4")
		n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: fmt.Sprint("team", i), Effect: corev1.TaintEffectNoSchedule}}
		c.UpdateNode(logger, n)
		if i == maxTaintSets-1 {
			calls = 0
			if c.DeviceNodesTolerated(none) || calls != maxTaintSets {
				t.Errorf("%d sets: asked %d, want all and false", maxTaintSets, calls)
			}
		}
	}
	calls = 0
	if !c.DeviceNodesTolerated(none) || calls != 0 {
		t.Errorf("%d sets: want true unasked, asked %d", maxTaintSets+1, calls)
	}
}
