package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubegpu/kubegpu/kubeinterface/dra"
)

// altClaimSpec asks for whole GPUs of kubegpu's DeviceClass in one request
// "gpus" with alternatives (firstAvailable), named "c<count>", in the
// order of counts.
func altClaimSpec(counts ...int64) resourceapi.ResourceClaimSpec {
	r := resourceapi.DeviceRequest{Name: "gpus"}
	for _, n := range counts {
		r.FirstAvailable = append(r.FirstAvailable, resourceapi.DeviceSubRequest{Name: fmt.Sprint("c", n), DeviceClassName: dra.ClassName,
			AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: n})
	}
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{r}}}
}

// allocatedRequests are the requests a claim's results name, in order,
// one per device.
func allocatedRequests(c *resourceapi.ResourceClaim) string {
	var out []string
	for _, r := range c.Status.Allocation.Devices.Results {
		out = append(out, r.Request)
	}
	return strings.Join(out, ",")
}

// TestClaimAlternatives: a claim whose request has alternatives
// (firstAvailable: eight GPUs, else four) gets the first that fits
// somewhere: eight on the DGX-1 while it is free, though a 4-GPU node
// would take the second; then, the DGX-1 full, four on the 4-GPU node.
// The results name the alternative as DRA does. With neither free, the
// pod waits, and kubegpu explain says the node is judged with each way.
func TestClaimAlternatives(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t)
	big := addNodes(ctx, t, "claimalt-dgx", "dgx1", 1)
	small := addNodes(ctx, t, "claimalt-t4", "t4x4", 1)
	publishSlices(ctx, t, big)
	publishSlices(ctx, t, small)
	ns := namespace(ctx, t, "claimalt")
	client := tenant(t, ns)
	for _, name := range []string{"first", "second", "third"} {
		if _, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: altClaimSpec(8, 4)}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range []struct{ node, request string }{{big.names[0], "gpus/c8"}, {small.names[0], "gpus/c4"}} {
		name := []string{"first", "second"}[i]
		createPods(ctx, t, ns, claimUser(name, name, false))
		pods := settle(ctx, t, ns, time.Second, time.Minute)
		for _, p := range pods {
			if p.Name != name {
				continue
			}
			if p.Spec.NodeName != want.node {
				t.Fatalf("pod %s on node %q, want %s: %s", name, p.Spec.NodeName, want.node, strings.Join(failedSchedulingAll(ctx, t, ns), "\n"))
			}
			c := claimOf(ctx, t, ns, &p)
			count := map[string]int{"gpus/c8": 8, "gpus/c4": 4}[want.request]
			if got := allocatedRequests(c); got != strings.TrimSuffix(strings.Repeat(want.request+",", count), ",") {
				t.Errorf("claim %s: results for %s, want %d for %s", name, got, count, want.request)
			}
		}
	}
	createPods(ctx, t, ns, claimUser("third", "third", false))
	waitUnschedulable(ctx, t, ns, "third", "not enough free GPUs")
	out := kubegpu(t, "explain", "-n", ns, "third")
	for _, want := range []string{"claim/gpu/gpus/c8", "alternatives (firstAvailable), 2 ways"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubegpu explain of the waiting pod does not say %q:\n%s", want, out)
		}
	}
}
