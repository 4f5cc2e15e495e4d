package devicecache

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
)

// waitSet remembers pods this plugin refused for a reason that a later
// event of the device cache ends (a node live again, devices freed), so
// that the cache can send them back to the scheduling queue once it has
// applied that event. The scheduler's own queueing hints move pods on the
// same events, but the scheduler's queue and the cache hear of an event
// through handlers of their own, in no set order: a pod retried before the
// cache applied the event would be refused again and wait in the
// unschedulable queue for minutes. Waking the pods from the cache, after it
// applied the event, closes that gap. (The hints themselves must not touch
// the cache: the queue calls them holding its own lock.)
type waitSet struct {
	mu   sync.Mutex
	pods map[ktypes.UID]*corev1.Pod
}

// maxWaiting bounds the pods a waitSet remembers; beyond it they wait for
// the scheduler's periodic retry of unschedulable pods.
const maxWaiting = 10000

func newWaitSet() *waitSet { return &waitSet{pods: map[ktypes.UID]*corev1.Pod{}} }

// add remembers pod.
func (w *waitSet) add(pod *corev1.Pod) {
	w.mu.Lock()
	if len(w.pods) < maxWaiting {
		w.pods[pod.UID] = pod
	}
	w.mu.Unlock()
}

// remove forgets a pod that was placed or deleted.
func (w *waitSet) remove(uid ktypes.UID) {
	w.mu.Lock()
	delete(w.pods, uid)
	w.mu.Unlock()
}

// drain returns the pods, keyed as the scheduler's Activate wants them,
// and forgets them.
func (w *waitSet) drain() map[string]*corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.pods) == 0 {
		return nil
	}
	out := make(map[string]*corev1.Pod, len(w.pods))
	for _, p := range w.pods {
		out[p.Namespace+"/"+p.Name] = p
	}
	clear(w.pods)
	return out
}

// wake sends the pods of w back to the scheduling queue. Callers hold no
// lock of the cache's, and none of the queue's: it is called from the
// cache's informer handlers, never from a queueing hint.
func (c *Cache) wake(w *waitSet) {
	if pods := w.drain(); len(pods) > 0 {
		c.activate(pods)
	}
}

// WaitForHeartbeat remembers a pod that a node refused for not being live
// (or that waited while the cache warmed up).
func (c *Cache) WaitForHeartbeat(pod *corev1.Pod) { c.liveWaiters.add(pod) }

// WaitForDevices remembers a pod that nodes refused for want of free
// devices.
func (c *Cache) WaitForDevices(pod *corev1.Pod) { c.deviceWaiters.add(pod) }

// NotWaiting forgets a pod that was placed or deleted.
func (c *Cache) NotWaiting(uid ktypes.UID) {
	c.liveWaiters.remove(uid)
	c.deviceWaiters.remove(uid)
	c.draWaiters.remove(uid)
}

// activateWaiting sends the pods refused for a node that was not live back
// to the scheduling queue.
func (c *Cache) activateWaiting() { c.wake(c.liveWaiters) }
