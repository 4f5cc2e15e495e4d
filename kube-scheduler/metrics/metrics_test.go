package metrics

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/kubeinterface"
)

// TestNodesByInventory: a node without an inventory counts as missing one
// only when its capacity has GPUs; CPU-only and control-plane nodes are
// "none", so that the inventory alert does not fire for them.
func TestNodesByInventory(t *testing.T) {
	c, _ := testCache(t)
	g := &gpuCollector{}
	g.report(c, false)
	logger := klog.Background()
	withCapacity := func(name string, capacity corev1.ResourceList) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Capacity: capacity}}
	}
	cpu := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8")}
	c.UpdateNode(logger, withCapacity("control-plane", cpu))
	c.UpdateNode(logger, withCapacity("cpu-only", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), kubeinterface.ResourceGPU: resource.MustParse("0")}))
	c.UpdateNode(logger, withCapacity("gpu-no-shim", corev1.ResourceList{kubeinterface.ResourceGPU: resource.MustParse("4")}))
	c.UpdateNode(logger, testNode(t, "gpu", "t4x4"))
	// A node whose advertiser stopped: kubegpu.io/gpus still in its
	// capacity, its inventory gone.
	c.UpdateNode(logger, withCapacity("gpu-stale", corev1.ResourceList{kubeinterface.ResourceGPUs: resource.MustParse("8")}))
	want := func(ok, missing, invalid, none int) string {
		var b strings.Builder
		b.WriteString("# HELP kubegpu_scheduler_nodes [ALPHA] Nodes known to the device cache, by the state of their device inventory: ok, invalid, missing (the node's capacity has GPUs but it publishes no inventory), none (no GPUs and no inventory: CPU-only and control-plane nodes).\n")
		b.WriteString("# TYPE kubegpu_scheduler_nodes gauge\n")
		for _, s := range []struct {
			state string
			n     int
		}{{"invalid", invalid}, {"missing", missing}, {"none", none}, {"ok", ok}} {
			b.WriteString(`kubegpu_scheduler_nodes{inventory="` + s.state + `"} ` + string(rune('0'+s.n)) + "\n")
		}
		return b.String()
	}
	if err := testutil.CustomCollectAndCompare(g, strings.NewReader(want(1, 2, 0, 2)), "kubegpu_scheduler_nodes"); err != nil {
		t.Error(err)
	}
	// The CPU-only node gets a GPU (its capacity changes, not its
	// annotations): now it misses an inventory.
	c.UpdateNode(logger, withCapacity("cpu-only", corev1.ResourceList{kubeinterface.ResourceGPU: resource.MustParse("1")}))
	c.DeleteNode("gpu-stale")
	g = &gpuCollector{}
	g.report(c, false)
	if err := testutil.CustomCollectAndCompare(g, strings.NewReader(want(1, 2, 0, 1)), "kubegpu_scheduler_nodes"); err != nil {
		t.Error(err)
	}
}
