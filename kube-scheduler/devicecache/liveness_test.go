package devicecache

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// TestLivenessIsObserved: a node is live while the scheduler sees its
// Lease's renewTime change, on the scheduler's clock, whatever the node's
// clock says, and while the node is Ready.
func TestLivenessIsObserved(t *testing.T) {
	c, _ := testCache(t)
	logger := klog.Background()
	now := testNow
	c.now = func() time.Time { return now }
	c.UpdateNode(logger, testNode(t, "n1", "t4x4"))
	var activated int
	c.activate = func(pods map[string]*corev1.Pod) { activated += len(pods) }
	live := func() error {
		c.mu.RLock()
		defer c.mu.RUnlock()
		return c.usable(c.nodes["n1"])
	}

	// The initial list says nothing about when the Lease was renewed,
	// even if its renewTime is now: wait for a renewal.
	c.UpdateLease(testLease("n1", now), true)
	if err := live(); !errors.Is(err, errUnobserved) {
		t.Fatalf("after the initial list: %v, want %v", err, errUnobserved)
	}
	// A node whose clock is an hour behind is live while it renews.
	c.WaitForHeartbeat(testPod("p"))
	c.UpdateLease(testLease("n1", now.Add(-time.Hour)), false)
	if err := live(); err != nil {
		t.Fatalf("renewed with a clock an hour behind: %v", err)
	}
	if activated != 1 {
		t.Errorf("activated %d pods when the node became live, want 1", activated)
	}
	now = now.Add(30 * time.Second)
	c.UpdateLease(testLease("n1", now.Add(-time.Hour)), false)
	now = now.Add(30 * time.Second)
	if err := live(); err != nil {
		t.Fatalf("30 s after its last renewal: %v", err)
	}
	// The same Lease again while the node is live (an informer resync):
	// no renewal, so 41 s after the last one the node is stale.
	c.UpdateLease(testLease("n1", now.Add(-30*time.Second).Add(-time.Hour)), false)
	now = now.Add(11 * time.Second)
	if err := live(); !errors.Is(err, ErrStale) {
		t.Fatalf("41 s after the last renewal, the same Lease seen again meanwhile: %v", err)
	}
	c.UpdateLease(testLease("n1", now.Add(-time.Hour)), false)
	if err := live(); err != nil {
		t.Fatalf("renewed again: %v", err)
	}
	// A node whose clock is an hour ahead is stale once it stops renewing.
	c.UpdateLease(testLease("n1", now.Add(time.Hour)), false)
	now = now.Add(41 * time.Second)
	if err := live(); !errors.Is(err, ErrStale) || !strings.Contains(err.Error(), "last seen renewed 41s ago (limit 40s)") {
		t.Fatalf("41 s after the last renewal, stamped an hour ahead: %v", err)
	}
	// An informer resync delivering the same Lease is no renewal.
	c.UpdateLease(testLease("n1", now.Add(-41*time.Second).Add(time.Hour)), false)
	if err := live(); err == nil {
		t.Fatal("a Lease seen again unchanged made the node live")
	}

	// Renewing but not Ready (kubelet: container runtime is down).
	c.UpdateLease(testLease("n1", now), false)
	down := testNode(t, "n1", "t4x4")
	down.Status.Conditions[0] = corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse,
		Reason: "KubeletNotReady", Message: "container runtime is down"}
	c.UpdateNode(logger, down)
	if err := live(); !errors.Is(err, ErrStale) || !strings.Contains(err.Error(), `the node is not Ready (KubeletNotReady: "container runtime is down")`) {
		t.Fatalf("not Ready: %v", err)
	}
	c.WaitForHeartbeat(testPod("q"))
	c.UpdateNode(logger, testNode(t, "n1", "t4x4"))
	if err := live(); err != nil {
		t.Fatalf("Ready again: %v", err)
	}
	if activated != 2 {
		t.Errorf("activated %d pods in all, want 2 (one when Ready again)", activated)
	}

	c.DeleteLease(testLease("n1", now))
	if err := live(); !errors.Is(err, errNoLease) {
		t.Fatalf("Lease deleted: %v", err)
	}
	// A Lease created later (not in the initial list) is a renewal.
	c.UpdateLease(testLease("n1", now), false)
	if err := live(); err != nil {
		t.Fatalf("Lease created again: %v", err)
	}
}

// TestWarmUp: a starting scheduler holds GPU pods until it has seen every
// node's Lease renewed, or for a quarter of heartbeatStaleness and two
// seconds, whichever comes first.
func TestWarmUp(t *testing.T) {
	c, _ := testCache(t)
	logger := klog.Background()
	now := testNow
	c.now, c.started = func() time.Time { return now }, testNow
	if !c.warm() {
		t.Fatal("a cache without nodes is not warm")
	}
	c.UpdateNode(logger, testNode(t, "n1", "t4x4"))
	c.UpdateNode(logger, testNode(t, "n2", "t4x4"))
	c.UpdateLease(testLease("n1", now), true)
	c.UpdateLease(testLease("n2", now), true)
	if c.warm() {
		t.Fatal("warm before any renewal was seen")
	}
	c.UpdateLease(testLease("n1", now.Add(time.Second)), false)
	if c.warm() {
		t.Fatal("warm with n2's renewal not seen")
	}
	now = now.Add(12 * time.Second) // 40s/4 + 2s: n2 is dead, then
	if !c.warm() {
		t.Fatal("not warm after a quarter of the staleness and two seconds")
	}
	now = testNow
	c.UpdateLease(testLease("n2", now.Add(time.Second)), false)
	if !c.warm() {
		t.Fatal("not warm with every renewal seen")
	}
	// Not waited for: a node that is not Ready, and one whose last
	// renewal is older than the staleness by the scheduler's clock.
	down := testNode(t, "n3", "t4x4")
	down.Status.Conditions[0].Status = corev1.ConditionFalse
	c.UpdateNode(logger, down)
	c.UpdateLease(testLease("n3", now), true)
	c.UpdateNode(logger, testNode(t, "n4", "t4x4"))
	c.UpdateLease(testLease("n4", now.Add(-time.Hour)), true)
	if !c.warm() {
		t.Fatal("waiting for a node that is not Ready or has not renewed its Lease for an hour")
	}
}
