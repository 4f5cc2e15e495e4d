package record

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// Recorder writes, for each GPU pod bound with its allocation, the
// scheduler's record of it: the same signed payload, in the pod's status
// (condition kubegpu.io/Allocated). A tenant may change or remove the
// pod's annotation; it cannot write the pod's status. After a restart or a
// leader change the device cache counts a pod's devices by its record, so
// the rebuilt state equals the one before, whatever the tenant did, even on
// a cluster without kubegpu's admission policies.
//
// Records cost one API write per GPU pod, which must not slow scheduling:
// they are written off the scheduling path, on a client of their own
// limited to recordQPS writes per second, by the leader only (workers start
// with the first scheduling cycle, which standby replicas never run), and
// while the scheduler is placing pods they wait: a record is written once
// the plugin has reserved no pod for recordIdle, or once it has waited
// recordMaxWait. During a burst they lag behind the bindings, and the API
// server spends the burst on bindings. Two paths close the gap:
//
//   - urgent: every replica, leader or standby, that sees a counted pod's
//     annotation changed before its record exists writes the record at once,
//     from the value it verified, with the scheduler's own client;
//   - backfill: a pod counted by its annotation (bound by a scheduler that
//     died before recording it, or by an older version) is recorded by the
//     leader.
//
// What stays open: an annotation changed while no replica runs, before the
// pod's record was written. The admission policy kubegpu-allocation refuses
// such changes; kubegpu-crishim refuses the containers of a pod whose
// allocation does not verify.
type Recorder struct {
	metrics Metrics
	now     func() time.Time

	// background writes records at most recordQPS a second; urgent
	// writes them at once.
	background, urgent kubernetes.Interface

	queue, urgentQueue workqueue.TypedRateLimitingInterface[ktypes.UID]
	mu                 sync.Mutex
	pending            map[ktypes.UID]pendingRecord
	started            atomic.Bool
	once, urgentOnce   sync.Once

	// lastCycle is when the plugin last reserved a pod (Unix nanoseconds
	// on now's clock); idle and maxWait are recordIdle and recordMaxWait
	// (shorter in tests).
	lastCycle     atomic.Int64
	idle, maxWait time.Duration
	// polls counts waitIdle's looks at the clock (tests wait for them).
	polls atomic.Int64
}

// pendingRecord is a record to write, asked for at added.
type pendingRecord struct {
	pod   ktypes.NamespacedName
	value string
	added time.Time
}

const (
	// recordIdle is how long the plugin must have reserved no pod before
	// the background records are written.
	recordIdle = time.Second
	// recordPoll is how often a waiting record looks again: it reads the
	// Recorder's clock (now), which tests move.
	recordPoll = 100 * time.Millisecond
	// recordMaxWait is how long a background record waits at most for
	// the scheduler to be idle: under a load that never pauses, records
	// still go out, at recordQPS.
	recordMaxWait = 2 * time.Minute
)

// recordWorkers write background records in parallel: one API call each.
const recordWorkers = 2

// maxRecordRetries bounds the retries of one record; a pod that still has
// none is recorded by the next leader.
const maxRecordRetries = 12

// New writes urgent records with urgent, background ones with
// background (a client limited to recordQPS).
func New(background, urgent kubernetes.Interface, m Metrics) *Recorder {
	newQueue := func(name string) workqueue.TypedRateLimitingInterface[ktypes.UID] {
		return workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[ktypes.UID](),
			workqueue.TypedRateLimitingQueueConfig[ktypes.UID]{Name: name})
	}
	if m == nil {
		m = noMetrics{}
	}
	return &Recorder{
		background: background, urgent: urgent, metrics: m, now: time.Now, pending: map[ktypes.UID]pendingRecord{},
		idle: recordIdle, maxWait: recordMaxWait,
		queue: newQueue("kubegpu_allocation_records"), urgentQueue: newQueue("kubegpu_urgent_allocation_records"),
	}
}

// Add asks the leader for pod uid's record of value; a later add replaces
// it.
func (r *Recorder) Add(uid ktypes.UID, pod ktypes.NamespacedName, value string) {
	if r != nil {
		r.put(r.queue, uid, pod, value)
	}
}

// AddUrgent writes pod uid's record of value at once: its annotation no
// longer says what the pod holds.
func (r *Recorder) AddUrgent(uid ktypes.UID, pod ktypes.NamespacedName, value string) {
	if r != nil {
		r.put(r.urgentQueue, uid, pod, value)
	}
}

func (r *Recorder) put(q workqueue.TypedRateLimitingInterface[ktypes.UID], uid ktypes.UID, pod ktypes.NamespacedName, value string) {
	r.mu.Lock()
	added := r.now()
	if prev, ok := r.pending[uid]; ok {
		added = prev.added // waits no longer for being asked again
	}
	r.pending[uid] = pendingRecord{pod: pod, value: value, added: added}
	r.mu.Unlock()
	q.Add(uid)
}

// Cycle notes that the plugin is reserving a pod: background records wait
// until it has reserved none for recordIdle.
func (r *Recorder) Cycle() {
	if r != nil {
		r.lastCycle.Store(r.now().UnixNano())
	}
}

// waitIdle waits until the scheduler has run no cycle for r.idle, or rec
// has waited r.maxWait; false if ctx ended first.
func (r *Recorder) waitIdle(ctx context.Context, rec pendingRecord) bool {
	for {
		r.polls.Add(1)
		now := r.now()
		busy := r.idle - now.Sub(time.Unix(0, r.lastCycle.Load()))
		left := r.maxWait - now.Sub(rec.added)
		if busy <= 0 || left <= 0 {
			return true
		}
		t := time.NewTimer(min(busy, left, recordPoll))
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// Forget drops a pod's pending record (the pod is gone, or recorded).
func (r *Recorder) Forget(uid ktypes.UID) {
	if r == nil {
		return
	}
	r.mu.Lock()
	delete(r.pending, uid)
	r.mu.Unlock()
}

// StartUrgent starts the urgent worker; every replica runs it.
func (r *Recorder) StartUrgent(ctx context.Context) {
	if r == nil {
		return
	}
	r.urgentOnce.Do(func() {
		ctx := klog.NewContext(ctx, klog.FromContext(ctx).WithName("records"))
		go func() {
			for r.next(ctx, r.urgentQueue, r.urgent, false) {
			}
		}()
		context.AfterFunc(ctx, r.urgentQueue.ShutDown)
	})
}

// Start starts the background workers once, when this scheduler leads.
func (r *Recorder) Start(ctx context.Context) {
	if r == nil || r.started.Load() {
		return
	}
	r.once.Do(func() {
		r.started.Store(true)
		ctx := klog.NewContext(ctx, klog.FromContext(ctx).WithName("records"))
		for range recordWorkers {
			go func() {
				for r.next(ctx, r.queue, r.background, true) {
				}
			}()
		}
		context.AfterFunc(ctx, r.queue.ShutDown)
	})
}

// next writes one record of queue q with client c, once the scheduler is
// idle if wait; false when q is shut down.
func (r *Recorder) next(ctx context.Context, q workqueue.TypedRateLimitingInterface[ktypes.UID], c kubernetes.Interface, wait bool) bool {
	uid, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(uid)
	r.mu.Lock()
	rec, ok := r.pending[uid]
	r.mu.Unlock()
	if !ok {
		q.Forget(uid)
		return true
	}
	if wait && !r.waitIdle(ctx, rec) {
		return true // shutting down: the next leader records it
	}
	r.mu.Lock()
	rec, ok = r.pending[uid] // the latest value asked for while waiting
	r.mu.Unlock()
	if !ok {
		q.Forget(uid)
		return true
	}
	err := r.write(ctx, c, uid, rec)
	switch {
	case err == nil:
		r.metrics.Recorded("written")
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err) || apierrors.IsInvalid(err):
		// The pod is gone or was re-created under its name.
		r.metrics.Recorded("gone")
	case q.NumRequeues(uid) < maxRecordRetries:
		r.metrics.Recorded("retry")
		q.AddRateLimited(uid)
		return true
	default:
		r.metrics.Recorded("error")
		klog.FromContext(ctx).Error(err, "Recording the allocation in the pod's status failed; the next leader records it", "pod", rec.pod)
	}
	q.Forget(uid)
	r.mu.Lock()
	if cur, ok := r.pending[uid]; ok && cur == rec {
		delete(r.pending, uid)
	}
	r.mu.Unlock()
	return true
}

// write patches the record into the pod's status. The patch carries the
// pod's UID, so it cannot land on a newer pod of the same name, and merges
// the condition by type, leaving kubelet's conditions alone.
func (r *Recorder) write(ctx context.Context, c kubernetes.Interface, uid ktypes.UID, rec pendingRecord) error {
	cond := objects.RecordCondition(rec.value, metav1.NewTime(r.now()))
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": uid},
		"status":   map[string]any{"conditions": []corev1.PodCondition{cond}},
	})
	if err != nil {
		return err
	}
	_, err = c.CoreV1().Pods(rec.pod.Namespace).Patch(ctx, rec.pod.Name, ktypes.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		return fmt.Errorf("record allocation of pod %s: %w", rec.pod, err)
	}
	klog.FromContext(ctx).V(4).Info("Recorded allocation", "pod", rec.pod)
	return nil
}

// pendingLen returns the pods whose records are not written yet.
func (r *Recorder) pendingLen() []ktypes.UID {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ktypes.UID, 0, len(r.pending))
	for uid := range r.pending {
		out = append(out, uid)
	}
	return out
}

// Metrics counts the records written, by result (written, gone, retry,
// error).
type Metrics interface {
	Recorded(result string)
}

type noMetrics struct{}

func (noMetrics) Recorded(string) {}
