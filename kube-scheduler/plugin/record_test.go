package plugin

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// TestRecorderPatchesStatus: the record is a strategic-merge patch of the
// pod's status subresource carrying the pod's UID, and only a leading
// scheduler (one that started its recorder) writes it.
func TestRecorderPatchesStatus(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-p"}}
	client := fake.NewClientset(pod)
	var patches []k8stesting.PatchAction
	client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		patches = append(patches, a.(k8stesting.PatchAction))
		return false, nil, nil
	})
	r := newRecorder(client, client, nil)
	r.now = func() time.Time { return testNow }
	r.Add("uid-p", ktypesName("ns", "p"), "VALUE")
	time.Sleep(50 * time.Millisecond)
	if len(patches) != 0 {
		t.Fatalf("a recorder that was not started wrote %d records", len(patches))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.start(ctx)
	deadline := time.Now().Add(5 * time.Second)
	for len(r.pendingLen()) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if len(patches) != 1 {
		t.Fatalf("%d patches, want 1", len(patches))
	}
	p := patches[0]
	if p.GetSubresource() != "status" || p.GetPatchType() != "application/strategic-merge-patch+json" {
		t.Errorf("patch of %q with %s, want a strategic merge of status", p.GetSubresource(), p.GetPatchType())
	}
	var body struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
		Status   corev1.PodStatus  `json:"status"`
	}
	if err := json.Unmarshal(p.GetPatch(), &body); err != nil {
		t.Fatal(err)
	}
	if body.Metadata.UID != "uid-p" || len(body.Status.Conditions) != 1 || body.Status.Conditions[0].Message != "VALUE" ||
		body.Status.Conditions[0].Type != kubeinterface.ConditionAllocated {
		t.Errorf("patch = %s", p.GetPatch())
	}
	got, _ := client.CoreV1().Pods("ns").Get(ctx, "p", metav1.GetOptions{})
	if v, ok := objects.RecordValue(got); !ok || v != "VALUE" {
		t.Errorf("pod's record = %q, %v", v, ok)
	}
}

// TestRecorderWaitsWhileScheduling: background records wait while the
// plugin reserves pods, go out once it has reserved none for recordIdle,
// and under a load that never pauses once they have waited recordMaxWait;
// urgent records never wait. The recorder's clock is the test's.
func TestRecorderWaitsWhileScheduling(t *testing.T) {
	for _, tc := range []struct {
		name string
		// advance is how far the clock moves after the busy spell;
		// busy is whether the plugin still reserves pods then.
		advance           time.Duration
		busy, urgent      bool
		writtenDuringBusy bool
	}{
		{name: "idle", advance: recordIdle},
		{name: "waited long enough", advance: recordMaxWait, busy: true},
		{name: "urgent", urgent: true, writtenDuringBusy: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-p"}}
			client := fake.NewClientset(pod)
			var patched atomic.Int32
			client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				patched.Add(1)
				return false, nil, nil
			})
			var clock atomic.Int64
			clock.Store(testNow.UnixNano())
			r := newRecorder(client, client, nil)
			r.now = func() time.Time { return time.Unix(0, clock.Load()) }
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r.start(ctx)
			r.startUrgent(ctx)
			r.cycle()
			if tc.urgent {
				r.AddUrgent("uid-p", ktypesName("ns", "p"), "VALUE")
			} else {
				r.Add("uid-p", ktypesName("ns", "p"), "VALUE")
			}
			// Busy, on a clock that stands still: several polls.
			deadline := time.Now().Add(5 * recordPoll)
			for patched.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if got := patched.Load() == 1; got != tc.writtenDuringBusy {
				t.Fatalf("written while the plugin was reserving pods: %v, want %v", got, tc.writtenDuringBusy)
			}
			clock.Add(int64(tc.advance))
			if tc.busy {
				r.cycle()
			}
			deadline = time.Now().Add(5 * time.Second)
			for patched.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := patched.Load(); n != 1 {
				t.Fatalf("%d records written after the clock moved %v, want 1", n, tc.advance)
			}
		})
	}
}

func ktypesName(ns, name string) ktypes.NamespacedName {
	return ktypes.NamespacedName{Namespace: ns, Name: name}
}

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
