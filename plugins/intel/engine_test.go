package intel

import (
	"os"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// TestEngineGAS places pods written for GPU Aware Scheduling on the four
// Max 1550 node: i915: 2 with 1000 millicores is half of each of two
// GPUs; a second such pod shares those two GPUs (binpacked); a third of
// 1200 millicores (600 a GPU) fits only beside them, on the other two.
func TestEngineGAS(t *testing.T) {
	topo, err := Discover(os.DirFS(tree("max1550-4")), "n")
	if err != nil {
		t.Fatal(err)
	}
	e, err := devicescheduler.New(devicescheduler.Config{Plugins: []types.SchedulerPlugin{NewScheduler()}, Policy: devicescheduler.PolicyBinpack})
	if err != nil {
		t.Fatal(err)
	}
	n, err := e.NewNode("n", topo.Inventory, devicescheduler.Host{})
	if err != nil {
		t.Fatal(err)
	}
	place := func(name, milli string) []int {
		t.Helper()
		p := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			types.ResourceIntelI915: resource.MustParse("2"), kubeinterface.ResourceIntelMillicores: resource.MustParse(milli)}}}}}}
		req, err := objects.PodRequest(p)
		if err != nil {
			t.Fatal(err)
		}
		r, err := e.NewRequest(req, devicescheduler.Host{})
		if err != nil {
			t.Fatal(err)
		}
		var pl devicescheduler.Placement
		if err := e.Evaluate(n, r, &pl); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := n.Assume(name, pl.Allocation(), r.Host); err != nil {
			t.Fatal(err)
		}
		for _, s := range pl.Allocation().Containers[0].Devices {
			if s.Exclusive || s.ComputePercent != req.Containers[0].ComputePercent {
				t.Errorf("%s got %+v, want slices of %d%%", name, s, req.Containers[0].ComputePercent)
			}
		}
		d := pl.Devices(0, nil)
		slices.Sort(d)
		return d
	}
	a, b := place("a", "1000"), place("b", "1000")
	if len(a) != 2 || !slices.Equal(a, b) {
		t.Errorf("two pods of 500 millicores a GPU got GPUs %v and %v, want the same two", a, b)
	}
	c := place("c", "1200")
	if slices.ContainsFunc(c, func(i int) bool { return slices.Contains(a, i) }) {
		t.Errorf("600 millicores a GPU went to %v, beside full GPUs %v", c, a)
	}
}
