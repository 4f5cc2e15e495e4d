package devicecache

import (
	"errors"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
)

// claimOf is claim uid allocated with alloc, signed by key, reserved for
// the pods consumers.
func claimOf(t *testing.T, key *kubeinterface.Key, uid ktypes.UID, alloc types.PodAllocation, consumers ...ktypes.UID) *resourceapi.ResourceClaim {
	t.Helper()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "claim-" + string(uid), UID: uid}}
	cfg, err := dra.SignedConfigFor(key.Sign, kubeinterface.PodRef{Namespace: "ns", Name: c.Name, UID: uid}, alloc)
	if err != nil {
		t.Fatal(err)
	}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Config: []resourceapi.DeviceAllocationConfiguration{cfg}}}
	for _, p := range consumers {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: string(p), UID: p})
	}
	return c
}

func claimRequest(t *testing.T, c *Cache, own, claimed int) *devicescheduler.Request {
	t.Helper()
	var req types.PodRequest
	if own > 0 {
		req.Containers = append(req.Containers, types.ContainerRequest{Name: "main", Count: own})
	}
	req.Containers = append(req.Containers, types.ContainerRequest{Name: "claim/gpu/gpus", Count: claimed})
	r, err := c.engine.NewRequest(req, devicescheduler.Host{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func held(c *Cache, node string) []string {
	pods := slices.Clone(c.Snapshot()[node].Pods)
	slices.Sort(pods)
	return pods
}

// TestClaimsHoldDevices: Reserve's devices for a pod's claim containers
// move to the claim (the pod keeps its own); an assumed claim is released
// by ForgetAssumed, a claim seen allocated and signed is counted and kept
// by it; a claim deallocated, or signed by another key, holds nothing.
func TestClaimsHoldDevices(t *testing.T) {
	c, key := testCache(t)
	logger := klog.Background()
	c.UpdateNode(logger, testNode(t, "n1", "dgx1"))
	c.UpdateLease(testLease("n1", testNow), false)
	pod := testPod("a")
	alloc, err := c.Reserve(pod, "n1", claimRequest(t, c, 1, 2), noHost, noHost, nil)
	if err != nil {
		t.Fatal(err)
	}
	own, err := c.MoveToClaims(pod.UID, []ClaimPart{{UID: "c1", Claim: ktypes.NamespacedName{Namespace: "ns", Name: "claim-c1"}, Containers: []string{"claim/gpu/gpus"}}})
	if err != nil || len(own.Containers) != 1 || own.Containers[0].Name != "main" {
		t.Fatalf("MoveToClaims = %+v, %v; want the pod's own container", own, err)
	}
	if got := held(c, "n1"); !slices.Equal(got, []string{"c1", "uid-a"}) {
		t.Fatalf("holders %v, want the claim and the pod", got)
	}
	c.ForgetAssumed(logger, "c1")
	if got := held(c, "n1"); !slices.Equal(got, []string{"uid-a"}) {
		t.Fatalf("holders after ForgetAssumed %v, want the pod alone", got)
	}

	// Seen allocated (a restarted scheduler): counted, kept by
	// ForgetAssumed, released when deallocated.
	claimAlloc, _ := alloc.Container("claim/gpu/gpus")
	signed := claimOf(t, key, "c1", types.PodAllocation{Node: "n1", Containers: []types.ContainerAllocation{claimAlloc}}, "uid-b")
	c.UpdateClaim(logger, signed)
	c.ForgetAssumed(logger, "c1")
	if got := held(c, "n1"); !slices.Equal(got, []string{"c1", "uid-a"}) {
		t.Fatalf("holders with the claim allocated %v", got)
	}
	// Its devices are taken: 8 - 1 - 2 GPUs left.
	var p devicescheduler.Placement
	if _, err := c.Evaluate(named("n1"), ptr(c.InputOnce(wholeRequest(t, c, 6))), noHost, noHost, &p); !errors.Is(err, devicescheduler.ErrDoesNotFit) {
		t.Fatalf("6 GPUs beside the claim and the pod: %v, want ErrDoesNotFit", err)
	}
	// Preemption's dry run: with the claim's only pod gone, its GPUs are
	// free.
	o := &Overlay{Removed: map[ktypes.UID]struct{}{"uid-b": {}, pod.UID: {}}, DryRun: true}
	if _, err := c.EvaluateWith(named("n1"), o, ptr(c.InputOnce(wholeRequest(t, c, 8))), 0, noHost, noHost, &p); err != nil {
		t.Fatalf("8 GPUs with the pod and the claim's only pod gone: %v", err)
	}
	o = &Overlay{Removed: map[ktypes.UID]struct{}{pod.UID: {}}, DryRun: true}
	if _, err := c.EvaluateWith(named("n1"), o, ptr(c.InputOnce(wholeRequest(t, c, 8))), 0, noHost, noHost, &p); err == nil {
		t.Fatal("8 GPUs fit while the claim's pod stays")
	}
	released := signed.DeepCopy()
	released.Status.Allocation, released.Status.ReservedFor = nil, nil
	c.UpdateClaim(logger, released)
	if got := held(c, "n1"); !slices.Equal(got, []string{"uid-a"}) {
		t.Fatalf("holders after the claim was released %v", got)
	}

	// Signed by a key the cache does not hold: nothing.
	other, err := kubeinterface.NewHMACKey([]byte(strings.Repeat("x", 32)))
	if err != nil {
		t.Fatal(err)
	}
	c.UpdateClaim(logger, claimOf(t, other, "c2", types.PodAllocation{Node: "n1", Containers: []types.ContainerAllocation{claimAlloc}}))
	if got := held(c, "n1"); !slices.Equal(got, []string{"uid-a"}) {
		t.Fatalf("holders with a claim signed by another key %v", got)
	}
}
