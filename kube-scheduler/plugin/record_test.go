package plugin

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

// TestDevicesFreedWakeWaiters: the pods refused for want of devices are
// sent back to the queue once the cache has freed devices (a pod deleted
// or unreserved) or rebuilt an inventory, and not before; the queueing
// hints never touch the cache (the queue calls them holding its lock).
func TestDevicesFreedWakeWaiters(t *testing.T) {
	woken := make(chan []string, 10)
	c, key := testCache(t, func(cfg *devicecache.Config) {
		cfg.Activate = func(pods map[string]*corev1.Pod) {
			var names []string
			for n := range pods {
				names = append(names, n)
			}
			woken <- names
		}
	})
	logger := klog.Background()
	c.UpdateNode(logger, testNode(t, "n1", "t4x4"))
	c.UpdateLease(testLease("n1", testNow), false)
	holder := testPod("holder")
	alloc, err := c.Reserve(holder, "n1", wholeRequest(t, c, 4), noHost, noHost, nil)
	if err != nil {
		t.Fatal(err)
	}
	bound := boundWith(t, key, holder, alloc)
	bound.Spec.Containers = []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{kubeinterface.ResourceGPU: resource.MustParse("4")}}}}
	c.UpdatePod(logger, bound)
	c.WaitForDevices(testPod("waits"))
	if hint, err := heldDevices(logger, nil, bound, nil); err != nil || hint != fwk.Queue {
		t.Fatalf("hint = %v, %v", hint, err)
	}
	if s := c.Snapshot()["n1"]; len(s.Pods) != 1 {
		t.Fatalf("the hint changed the cache: %+v", s)
	}
	select {
	case names := <-woken:
		t.Fatalf("woke %v before any device was freed", names)
	case <-time.After(50 * time.Millisecond):
	}
	c.Forget(logger, holder.UID)
	select {
	case names := <-woken:
		if len(names) != 1 || names[0] != "ns/waits" {
			t.Errorf("woke %v, want [ns/waits]", names)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the pod waiting for devices was not woken when they were freed")
	}
	// An inventory rebuilt wakes them too; a pod placed meanwhile no longer
	// waits.
	c.WaitForDevices(testPod("again"))
	c.WaitForDevices(testPod("placed"))
	c.NotWaiting("uid-placed")
	sick := testNode(t, "n1", "t4x4")
	sick.Annotations["x"] = "y" // not the inventory: no rebuild
	c.UpdateNode(logger, sick)
	select {
	case names := <-woken:
		t.Fatalf("woke %v for a node update that left the inventory alone", names)
	case <-time.After(50 * time.Millisecond):
	}
	c.DeleteNode("n1")
	c.UpdateNode(logger, testNode(t, "n1", "t4x4"))
	select {
	case names := <-woken:
		if len(names) != 1 || names[0] != "ns/again" {
			t.Errorf("woke %v, want [ns/again]", names)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the pod waiting for devices was not woken when the inventory was rebuilt")
	}
}
