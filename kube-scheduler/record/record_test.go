package record

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

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
	r := New(client, client, nil)
	r.now = func() time.Time { return testNow }
	r.Add("uid-p", ktypesName("ns", "p"), "VALUE")
	// Only started workers take records off the queue: the record is
	// still queued, and nothing was written.
	if r.started.Load() || r.queue.Len() != 1 || len(patches) != 0 {
		t.Fatalf("a recorder that was not started: started %v, %d queued, %d records written", r.started.Load(), r.queue.Len(), len(patches))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.Start(ctx)
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
			r := New(client, client, nil)
			r.now = func() time.Time { return time.Unix(0, clock.Load()) }
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r.Start(ctx)
			r.StartUrgent(ctx)
			r.Cycle()
			if tc.urgent {
				r.AddUrgent("uid-p", ktypesName("ns", "p"), "VALUE")
			} else {
				r.Add("uid-p", ktypesName("ns", "p"), "VALUE")
			}
			// Busy, on a clock that stands still: the background
			// worker looks at the clock several times and writes
			// nothing; the urgent one writes at once.
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) && (tc.writtenDuringBusy && patched.Load() == 0 || !tc.writtenDuringBusy && r.polls.Load() < 3) {
				time.Sleep(10 * time.Millisecond)
			}
			if got := patched.Load() == 1; got != tc.writtenDuringBusy {
				t.Fatalf("written while the plugin was reserving pods: %v, want %v (%d polls)", got, tc.writtenDuringBusy, r.polls.Load())
			}
			clock.Add(int64(tc.advance))
			if tc.busy {
				r.Cycle()
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

var testNow = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
