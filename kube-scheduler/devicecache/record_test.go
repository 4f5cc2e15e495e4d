package devicecache

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// recorded returns pod with the scheduler's record of its annotation's
// allocation in its status.
func recorded(pod *corev1.Pod) *corev1.Pod {
	p := pod.DeepCopy()
	p.Status.Conditions = append(p.Status.Conditions, objects.RecordCondition(p.Annotations[kubeinterface.AnnotationAllocation], metav1.NewTime(testNow)))
	return p
}

// TestCacheCountsByRecord: a restarted scheduler counts a pod's devices by
// the record in its status, whatever its tenant did to the annotation; a
// pod without a record is counted by its annotation and recorded.
func TestCacheCountsByRecord(t *testing.T) {
	c, key := testCache(t)
	logger := klog.Background()
	c.UpdateNode(logger, testNode(t, "n1", "dgx1"))
	c.UpdateLease(testLease("n1", testNow), false)
	holder := testPod("holder")
	alloc, err := c.Reserve(holder, "n1", wholeRequest(t, c, 4), noHost, noHost, nil)
	if err != nil {
		t.Fatal(err)
	}
	bound := recorded(boundWith(t, key, holder, alloc))
	c.UpdatePod(logger, bound)
	want := c.Snapshot()

	stripped := bound.DeepCopy()
	delete(stripped.Annotations, kubeinterface.AnnotationAllocation)
	junk := bound.DeepCopy()
	junk.Annotations[kubeinterface.AnnotationAllocation] = "{junk"
	for name, pod := range map[string]*corev1.Pod{"annotation removed": stripped, "annotation junk": junk} {
		// The running scheduler keeps what it counted.
		c.UpdatePod(logger, pod)
		if got := c.Snapshot(); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s, same scheduler: %+v, want %+v", name, got, want)
		}
		// A restarted one counts the record.
		fresh, _ := testCache(t)
		fresh.UpdateNode(logger, testNode(t, "n1", "dgx1"))
		fresh.UpdateLease(testLease("n1", testNow), false)
		fresh.UpdatePod(logger, pod)
		if got := fresh.Snapshot(); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s, restarted: %+v, want %+v", name, got, want)
		}
		next, err := fresh.Reserve(testPod("next"), "n1", wholeRequest(t, fresh, 4), noHost, noHost, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range next.Containers[0].Devices {
			for _, h := range alloc.Containers[0].Devices {
				if d.ID == h.ID {
					t.Fatalf("%s: the next pod got %s, which %s holds", name, d.ID, holder.Name)
				}
			}
		}
	}

	// A record that does not verify (a node rewrote its pod's status)
	// counts nothing, whatever the annotation says.
	forgedKey, _ := kubeinterface.NewHMACKey([]byte(strings.Repeat("f", 32)))
	forged := recorded(boundWith(t, forgedKey, holder, alloc))
	forged.Annotations = bound.Annotations
	fresh, _ := testCache(t)
	fresh.UpdateNode(logger, testNode(t, "n1", "dgx1"))
	fresh.UpdatePod(logger, forged)
	if s := fresh.Snapshot()["n1"]; len(s.Pods) != 0 {
		t.Fatalf("a forged record was counted: %+v", s)
	}

	// Without a record (bound by a scheduler that died before writing
	// it): counted by the annotation, and recorded.
	fresh, _ = testCache(t)
	rec := &fakeRecorder{}
	fresh.recorder = rec
	fresh.UpdateNode(logger, testNode(t, "n1", "dgx1"))
	fresh.UpdateLease(testLease("n1", testNow), false)
	fresh.UpdatePod(logger, boundWith(t, key, holder, alloc))
	if got := fresh.Snapshot(); !reflect.DeepEqual(got, want) {
		t.Fatalf("no record: %+v, want %+v", got, want)
	}
	if len(rec.added) != 1 {
		t.Fatalf("%d records queued, want 1", len(rec.added))
	}
}

// TestCacheRecordsAtOnceWhenTheAnnotationChanges: a pod counted but not
// yet recorded whose annotation is removed is recorded at once (urgent
// queue, every replica) from what the scheduler counted; a record written
// with that value is taken without verifying it again.
func TestCacheRecordsAtOnceWhenTheAnnotationChanges(t *testing.T) {
	c, key := testCache(t)
	logger := klog.Background()
	rec := &fakeRecorder{}
	c.recorder = rec
	c.UpdateNode(logger, testNode(t, "n1", "dgx1"))
	c.UpdateLease(testLease("n1", testNow), false)
	holder := testPod("holder")
	alloc, err := c.Reserve(holder, "n1", wholeRequest(t, c, 2), noHost, noHost, nil)
	if err != nil {
		t.Fatal(err)
	}
	bound := boundWith(t, key, holder, alloc)
	value := bound.Annotations[kubeinterface.AnnotationAllocation]
	c.Written(holder.UID, value)
	c.UpdatePod(logger, bound)
	want := c.Snapshot()
	if len(rec.urgent) != 0 {
		t.Fatal("an urgent record for an untouched pod")
	}
	stripped := bound.DeepCopy()
	delete(stripped.Annotations, kubeinterface.AnnotationAllocation)
	c.UpdatePod(logger, stripped)
	if len(rec.urgent) != 1 {
		t.Fatalf("%d urgent records after the annotation was removed, want 1", len(rec.urgent))
	}
	if got := rec.urgent[holder.UID]; got != value {
		t.Errorf("urgent record of %q, want the value counted", got)
	}
	// The record arrives (written by this or another replica): taken as
	// it is, the pod still holds its devices, nothing left pending.
	withRecord := recorded(bound)
	delete(withRecord.Annotations, kubeinterface.AnnotationAllocation)
	c.keys = nil // a verification now would panic
	c.UpdatePod(logger, withRecord)
	if got := c.Snapshot(); !reflect.DeepEqual(got, want) {
		t.Fatalf("after the record arrived: %+v, want %+v", got, want)
	}
	if len(rec.added)+len(rec.urgent) != 0 {
		t.Errorf("records still pending: %v %v", rec.added, rec.urgent)
	}
}

// fakeRecorder keeps the records the cache asks for.
type fakeRecorder struct {
	added, urgent map[ktypes.UID]string
}

func (r *fakeRecorder) Add(uid ktypes.UID, _ ktypes.NamespacedName, value string) {
	if r.added == nil {
		r.added = map[ktypes.UID]string{}
	}
	r.added[uid] = value
}

func (r *fakeRecorder) AddUrgent(uid ktypes.UID, _ ktypes.NamespacedName, value string) {
	if r.urgent == nil {
		r.urgent = map[ktypes.UID]string{}
	}
	r.urgent[uid] = value
}

func (r *fakeRecorder) Forget(uid ktypes.UID) {
	delete(r.added, uid)
	delete(r.urgent, uid)
}
