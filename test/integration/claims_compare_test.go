package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubegpu/kubegpu/kubeinterface/dra"
)

// stockClass selects kubegpu's devices for the stock DynamicResources
// plugin: its claims tolerate kubegpu's taint, so the stock allocator
// takes the devices (first fit), as it would without kubegpu.
const stockClass = "gpu-stock.example.com"

// TestClaimsQuadComparison is the side-by-side run of README's "4-GPU
// claims on DGX-1 nodes": on 8 DGX-1s, each with GPU i (i = 0..7) held
// by a 1-GPU claim, one 4-GPU claim per node, allocated once by kubegpu
// (DeviceClass gpu.kubegpu.io) and once by the stock DynamicResources
// plugin (a class over the same devices, claims tolerating kubegpu's
// taint), on node sets of the same layout in the same cluster. It reports
// the share of 4-GPU claims that got an all-NVLink quad (each node has
// one free); kubegpu must get every one.
//
//	go test ./test/integration -run TestClaimsQuadComparison -v
func TestClaimsQuadComparison(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t)
	if _, err := cluster.Client.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: stockClass},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: dra.ClassSelector}}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.ResourceV1().DeviceClasses().Delete(context.Background(), stockClass, metav1.DeleteOptions{})
	})
	const nodes = 8
	share := map[string]int{}
	for _, run := range []struct{ name, class string }{{"kubegpu", dra.ClassName}, {"stock", stockClass}} {
		sn := addNodes(ctx, t, "cmp"+run.name, "dgx1", nodes)
		publishSlices(ctx, t, sn)
		ns := namespace(ctx, t, "cmp"+run.name)
		client := tenant(t, ns)
		claim := func(name, node string, count int64, uuid string) {
			t.Helper()
			spec := gpuClaimSpec(count)
			r := spec.Devices.Requests[0].Exactly
			r.DeviceClassName = run.class
			if run.class == stockClass {
				r.Tolerations = []resourceapi.DeviceToleration{{Key: dra.TaintManaged, Operator: resourceapi.DeviceTolerationOpExists}}
			}
			if uuid != "" {
				r.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.attributes[%q].uuid == %q", dra.DriverName, uuid)}}}
			}
			if _, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			p := claimUser(name, name, false)
			p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
			createPods(ctx, t, ns, p)
		}
		for i, node := range sn.names {
			var uuid string
			for _, d := range sn.invs[node].Devices {
				if d.Index == i {
					uuid = d.UUID
				}
			}
			claim(fmt.Sprint("one-", i), node, 1, uuid)
		}
		waitBound(ctx, t, ns, nodes)
		for i, node := range sn.names {
			claim(fmt.Sprint("four-", i), node, 4, "")
		}
		waitBound(ctx, t, ns, 2*nodes)
		for i, node := range sn.names {
			p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, fmt.Sprint("four-", i), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, fmt.Sprint("four-", i), metav1.GetOptions{})
			if err != nil || c.Status.Allocation == nil {
				t.Fatalf("claim four-%d: %v", i, err)
			}
			idx := claimedIndexes(t, c, sn, p.Spec.NodeName)
			if q := fmt.Sprint(idx); q == "[0 1 2 3]" || q == "[4 5 6 7]" {
				share[run.name]++
			} else if run.name == "kubegpu" {
				t.Errorf("node %s (GPU %d held): kubegpu gave the 4-GPU claim GPUs %v, not the free all-NVLink quad", node, i, idx)
			}
		}
	}
	t.Logf("4-GPU claims on an all-NVLink quad (one free on each of %d DGX-1s): kubegpu %d/%d (%.0f%%), stock DynamicResources %d/%d (%.0f%%)",
		nodes, share["kubegpu"], nodes, 100*float64(share["kubegpu"])/nodes, share["stock"], nodes, 100*float64(share["stock"])/nodes)
	if share["kubegpu"] <= share["stock"] {
		t.Errorf("kubegpu placed %d quads, the stock allocator %d", share["kubegpu"], share["stock"])
	}
}

// waitBound waits until want pods of ns are bound.
func waitBound(ctx context.Context, t *testing.T, ns string, want int) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		return len(slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return p.Spec.NodeName == "" })) == want, nil
	}); err != nil {
		t.Fatalf("%d pods of %s not bound: %v\n%v", want, ns, err, failedSchedulingAll(ctx, t, ns))
	}
}
