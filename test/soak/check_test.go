package main

import (
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubegpu/kubegpu/internal/tracegpus"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// testChecker is a checker over informer stores the test fills, with a
// key generation to sign allocations with.
type testChecker struct {
	*checker
	t   *testing.T
	key *kubeinterface.Key
	inv types.Inventory
}

func newTestChecker(t *testing.T) *testChecker {
	t.Helper()
	keys, err := newKeyring(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	key, err := kubeinterface.LoadSigningKey(keys.gen(0).private)
	if err != nil {
		t.Fatal(err)
	}
	s := &soak{keys: keys}
	c := newChecker(s, fake.NewClientset())
	tc := &testChecker{checker: c, t: t, key: key, inv: tracegpus.Inventory("n1", "V100M16", 2)}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{simLabel: "true"}},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	if err := objects.SetNodeInventory(node, tc.inv); err != nil {
		t.Fatal(err)
	}
	if err := c.nodeInf.GetStore().Add(node); err != nil {
		t.Fatal(err)
	}
	return tc
}

// renew records a renewal of n1's Lease at the checker's now.
func (tc *testChecker) renew(at time.Time) {
	tc.observeLease(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: at}}})
}

// pod adds a pod asking for gpus (cores < 100: slices); bound to n1 with
// shares signed by signer when shares are given.
func (tc *testChecker) pod(name string, gpus, cores int, signer *kubeinterface.Key, shares ...types.DeviceShare) *corev1.Pod {
	tc.t.Helper()
	limits := corev1.ResourceList{kubeinterface.ResourceGPU: *resource.NewQuantity(int64(gpus), resource.DecimalSI)}
	if cores < 100 {
		limits[kubeinterface.ResourceGPUCores] = *resource.NewQuantity(int64(cores), resource.DecimalSI)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: soakNamespace, UID: ktypes.UID("uid-" + name), Annotations: map[string]string{}},
		Spec: corev1.PodSpec{NodeSelector: map[string]string{simLabel: "true"}, Containers: []corev1.Container{{Name: "main",
			Resources: corev1.ResourceRequirements{Limits: limits, Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}}}}
	if len(shares) > 0 {
		p.Spec.NodeName = "n1"
		a := kubeinterface.Allocation{Pod: kubeinterface.PodRef{Namespace: p.Namespace, Name: p.Name, UID: p.UID},
			PodAllocation: types.PodAllocation{Node: "n1", Containers: []types.ContainerAllocation{{Name: "main", Devices: shares}}}}
		signed, err := signer.Sign(a)
		if err != nil {
			tc.t.Fatal(err)
		}
		value, err := kubeinterface.EncodeAllocation(signed)
		if err != nil {
			tc.t.Fatal(err)
		}
		p.Annotations[kubeinterface.AnnotationAllocation] = value
	}
	if err := tc.podInf.GetStore().Add(p); err != nil {
		tc.t.Fatal(err)
	}
	return p
}

func (tc *testChecker) whole(i int) types.DeviceShare {
	d := tc.inv.Devices[i]
	return types.DeviceShare{ID: d.ID, UUID: d.UUID, Exclusive: true, MemoryMiB: d.MemoryMiB, ComputePercent: 100}
}

func (tc *testChecker) slice(i, cores int) types.DeviceShare {
	d := tc.inv.Devices[i]
	return types.DeviceShare{ID: d.ID, UUID: d.UUID, MemoryMiB: 1024, ComputePercent: cores}
}

func TestCheckerCountsDevices(t *testing.T) {
	tests := []struct {
		name string
		pods func(tc *testChecker)
		want map[string]int
	}{
		{"two GPUs to two pods", func(tc *testChecker) {
			tc.pod("a", 1, 100, tc.key, tc.whole(0))
			tc.pod("b", 1, 100, tc.key, tc.whole(1))
		}, map[string]int{}},
		{"one GPU to two pods", func(tc *testChecker) {
			tc.pod("a", 1, 100, tc.key, tc.whole(0))
			tc.pod("b", 1, 100, tc.key, tc.whole(0))
		}, map[string]int{"double-allocation": 1}},
		{"slices within a GPU", func(tc *testChecker) {
			tc.pod("a", 1, 60, tc.key, tc.slice(0, 60))
			tc.pod("b", 1, 40, tc.key, tc.slice(0, 40))
		}, map[string]int{}},
		{"slices over a GPU's compute", func(tc *testChecker) {
			tc.pod("a", 1, 60, tc.key, tc.slice(0, 60))
			tc.pod("b", 1, 50, tc.key, tc.slice(0, 50))
		}, map[string]int{"double-allocation": 1}},
		{"a slice beside a whole GPU", func(tc *testChecker) {
			tc.pod("a", 1, 100, tc.key, tc.whole(0))
			tc.pod("b", 1, 10, tc.key, tc.slice(0, 10))
		}, map[string]int{"double-allocation": 1}},
		{"a device the node does not have", func(tc *testChecker) {
			tc.pod("a", 1, 100, tc.key, types.DeviceShare{ID: "gpu-99", UUID: "GPU-x", Exclusive: true, ComputePercent: 100})
		}, map[string]int{"unknown-device": 1}},
		{"an allocation signed with another key", func(tc *testChecker) {
			other, err := newKeyring(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			key, err := kubeinterface.LoadSigningKey(other.gen(0).private)
			if err != nil {
				t.Fatal(err)
			}
			tc.pod("a", 1, 100, key, tc.whole(0))
		}, map[string]int{"unverified-allocation": 1}},
		{"a succeeded pod holds nothing", func(tc *testChecker) {
			p := tc.pod("a", 1, 100, tc.key, tc.whole(0))
			p.Status.Phase = corev1.PodSucceeded
			tc.pod("b", 1, 100, tc.key, tc.whole(0))
		}, map[string]int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc := newTestChecker(t)
			tt.pods(tc)
			tc.checkAPI(time.Now())
			if len(tc.byKind) != len(tt.want) {
				t.Errorf("violations %v, want %v", tc.byKind, tt.want)
			}
			for k, n := range tt.want {
				if tc.byKind[k] != n {
					t.Errorf("violations %v, want %v", tc.byKind, tt.want)
				}
			}
		})
	}
}

// TestCheckerStuckPending: a pod that has had room on a live node for
// stuckAfter, with no fault, is stuck; a fault under way, a node whose
// Lease stopped, or a node with its GPUs taken, is not room.
func TestCheckerStuckPending(t *testing.T) {
	start := time.Now()
	steps := func(tc *testChecker, until time.Duration) {
		for d := time.Duration(0); d <= until; d += 10 * time.Second {
			tc.renew(start.Add(d)) // the Lease's renewTime changes
			tc.renewed["n1"] = start.Add(d)
			tc.checkAPI(start.Add(d))
		}
	}
	t.Run("room and calm", func(t *testing.T) {
		tc := newTestChecker(t)
		tc.pod("waiting", 2, 100, nil)
		steps(tc, stuckAfter+20*time.Second)
		if tc.byKind["stuck-pending"] != 1 {
			t.Errorf("violations %v, want one stuck-pending", tc.byKind)
		}
	})
	t.Run("no room", func(t *testing.T) {
		tc := newTestChecker(t)
		tc.pod("holder", 1, 100, tc.key, tc.whole(0))
		tc.pod("waiting", 2, 100, nil)
		steps(tc, stuckAfter+20*time.Second)
		if len(tc.byKind) != 0 {
			t.Errorf("violations %v, want none", tc.byKind)
		}
	})
	t.Run("fault under way", func(t *testing.T) {
		tc := newTestChecker(t)
		tc.pod("waiting", 1, 100, nil)
		tc.faultStarted("apiserver-restart")
		steps(tc, stuckAfter+20*time.Second)
		if len(tc.byKind) != 0 {
			t.Errorf("violations %v, want none", tc.byKind)
		}
	})
	t.Run("node not renewing", func(t *testing.T) {
		tc := newTestChecker(t)
		tc.pod("waiting", 1, 100, nil)
		tc.renew(start)
		for d := time.Duration(0); d <= stuckAfter+20*time.Second; d += 10 * time.Second {
			tc.checkAPI(time.Now().Add(d))
		}
		if len(tc.byKind) != 0 {
			t.Errorf("violations %v, want none", tc.byKind)
		}
	})
}

func TestSlope(t *testing.T) {
	start := time.Now()
	var pts []sample
	for i := range 60 {
		pts = append(pts, sample{at: start.Add(time.Duration(i) * time.Minute), rss: 100 + 2*float64(i), goroutines: 50})
	}
	if got := pooledSlope([][]sample{pts}, func(p sample) (float64, bool) { return p.rss, true }); got < 119.9 || got > 120.1 {
		t.Errorf("slope of 2 per minute = %v per hour, want 120", got)
	}
	if got := pooledSlope([][]sample{pts}, func(p sample) (float64, bool) { return p.goroutines, true }); got != 0 {
		t.Errorf("slope of a constant = %v, want 0", got)
	}
	// Two processes, each growing 1 per minute, the second restarted low:
	// pooled, 60 per hour; one fit over both would fall.
	a, b := pts[:30], slices.Clone(pts[30:])
	for i := range b {
		b[i].rss = 50 + float64(i)
		a[i].rss = 100 + float64(i)
	}
	if got := pooledSlope([][]sample{a, b}, func(p sample) (float64, bool) { return p.rss, true }); got < 59.9 || got > 60.1 {
		t.Errorf("pooled slope = %v per hour, want 60", got)
	}
}

func TestCheckNodeShares(t *testing.T) {
	held := func(exclusive bool, compute int) string {
		v, err := kubeinterface.EncodeHeld([]kubeinterface.HeldDevice{{DeviceShare: types.DeviceShare{ID: "gpu-0", UUID: "GPU-0",
			Exclusive: exclusive, ComputePercent: compute}}})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tests := []struct {
		name       string
		containers []realContainer
		want       int
	}{
		{"two pods, two GPUs", []realContainer{{podUID: "a", visible: []string{"GPU-0"}, held: held(true, 100)},
			{podUID: "b", visible: []string{"GPU-1"}}}, 0},
		{"two pods, one whole GPU", []realContainer{{podUID: "a", visible: []string{"GPU-0"}, held: held(true, 100)},
			{podUID: "b", visible: []string{"GPU-0"}, held: held(false, 30)}}, 1},
		{"two pods, no ledger record", []realContainer{{podUID: "a", visible: []string{"GPU-0"}},
			{podUID: "b", visible: []string{"GPU-0"}}}, 1},
		{"slices that fit", []realContainer{{podUID: "a", visible: []string{"GPU-0"}, held: held(false, 30)},
			{podUID: "b", visible: []string{"GPU-0"}, held: held(false, 70)}}, 0},
		{"slices over the GPU", []realContainer{{podUID: "a", visible: []string{"GPU-0"}, held: held(false, 60)},
			{podUID: "b", visible: []string{"GPU-0"}, held: held(false, 60)}}, 1},
		{"one pod's two containers", []realContainer{{podUID: "a", name: "x", visible: []string{"GPU-0"}},
			{podUID: "a", name: "y", visible: []string{"GPU-0"}}}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc := newTestChecker(t)
			tc.checkNodeShares(tt.containers)
			if got := tc.byKind["node-double-allocation"]; got != tt.want {
				t.Errorf("node-double-allocation %d, want %d", got, tt.want)
			}
		})
	}
}
