package devicecache

import (
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
	if len(c.taints.sets) != 1 || c.taints.sets[func() string { _, k := hardTaints(tainted("x", gpuTaint)); return k }()].nodes != 2 {
		t.Errorf("sets %v: want one set of two nodes (PreferNoSchedule does not count)", c.taints.sets)
	}

	// A GPU node with only a soft taint is open to every pod.
	c.UpdateNode(logger, tainted("gpu-c", corev1.Taint{Key: "other", Effect: corev1.TaintEffectPreferNoSchedule}))
	check("an untainted GPU node", none, true)
	c.UpdateNode(logger, tainted("gpu-c", corev1.Taint{Key: "evicting", Effect: corev1.TaintEffectNoExecute}))
	check("gpu-c tainted NoExecute", none, false)
	check("gpu-c tainted NoExecute, GPU toleration (gpu-a and gpu-b)", gpu, true)
	check("gpu-c tainted NoExecute, tolerating everything", tolerating(corev1.Toleration{Operator: corev1.TolerationOpExists}), true)

	// A node that stops publishing devices stops counting.
	c.UpdateNode(logger, tainted("gpu-c", corev1.Taint{Key: "evicting", Effect: corev1.TaintEffectNoExecute}))
	noInventory := tainted("gpu-c")
	delete(noInventory.Annotations, kubeinterface.AnnotationInventory)
	c.UpdateNode(logger, noInventory)
	check("gpu-c without inventory", gpu, true)
	check("gpu-c without inventory, no toleration", none, false)

	for _, name := range []string{"gpu-a", "gpu-b", "gpu-c", "cpu"} {
		c.DeleteNode(name)
	}
	check("all deleted", tolerating(corev1.Toleration{Operator: corev1.TolerationOpExists}), false)
	if len(c.taints.sets) != 0 {
		t.Errorf("sets %v after every node went, want none", c.taints.sets)
	}
}
