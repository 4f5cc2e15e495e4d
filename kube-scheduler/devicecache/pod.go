package devicecache

import (
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/mix"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// podState is what one pod holds, or is assumed to hold.
type podState struct {
	pod   ktypes.NamespacedName
	node  string
	alloc types.PodAllocation
	// source is where alloc was read from (objects.SourceRecord or
	// SourceAnnotation); empty while the pod is only assumed.
	source string
	// seen is the pod's annotation and record as last taken in, so that
	// updates that change neither are not decoded and verified again.
	seen podSeen
	// value is the verified payload alloc was read from (or written with).
	value string
	// written is the annotation value this scheduler bound the pod with,
	// or nil. Atomic: Bind sets it under the cache's read lock, beside the
	// next pod's Filter calls (see Written).
	written atomic.Pointer[string]
	// assumed is true from Reserve until the pod is seen bound.
	assumed bool
	// applied is true when alloc is counted in the node's state; false
	// while the node is unknown or its devices no longer match alloc.
	applied bool
	// preempted is set once the scheduler evicts the pod for a preemptor
	// (it is being deleted, with the DisruptionTarget condition the
	// scheduler sets): it holds its devices until it is gone, but
	// preemption's dry run counts them as freed, and nominated pods get
	// the free devices they will need held meanwhile. priority is the
	// pod's.
	preempted bool
	priority  int32
	// running is set once the cache has seen the pod running (for the
	// allocation-to-running metric).
	running atomic.Bool
	// consumers are, for a ResourceClaim, the pods it is reserved for:
	// preemption's dry run counts its devices freed when all of them go.
	consumers []ktypes.UID
}

// podSeen is what a pod says of its allocation: its annotation, which its
// tenant may change, and the scheduler's record in its status.
type podSeen struct {
	annotation, record  string
	annotated, recorded bool
}

func seenOf(pod *corev1.Pod) podSeen {
	var s podSeen
	s.annotation, s.annotated = pod.Annotations[kubeinterface.AnnotationAllocation]
	s.record, s.recorded = objects.RecordValue(pod)
	return s
}

// UpdatePod takes in a pod from the informer. A bound pod holds the devices
// of its verified allocation: the scheduler's record in its status when it
// has one, else its annotation (see objects.HeldAllocation). Any other pod
// holds none, except that a pod this scheduler assumed stays assumed until
// it is seen bound or is unreserved, and a pod once counted keeps the
// devices it was counted with, whatever later happens to its annotation
// (which its tenant may change) or its status (which its node may change):
// its containers hold those devices.
func (c *Cache) UpdatePod(logger klog.Logger, pod *corev1.Pod) {
	c.updatePodDevices(logger, pod)
	if objects.PreemptedByScheduler(pod) {
		c.mu.Lock()
		if ps, ok := c.pods[pod.UID]; ok {
			ps.preempted, ps.priority = true, corev1helpers.PodPriority(pod)
		}
		c.mu.Unlock()
	}
	c.learnMu.Lock()
	state := c.learnState
	c.learnMu.Unlock()
	if state != notLearning && pod.Spec.NodeName != "" {
		// Bound by another replica, another scheduler, or before this
		// one started: learned once the cache counts its devices.
		mix.Observe(c.engine, pod, c.HasDevices(pod.Spec.NodeName), c.Holds(pod.UID))
	}
}

// updatePodDevices takes in a pod's devices (see UpdatePod).
func (c *Cache) updatePodDevices(logger klog.Logger, pod *corev1.Pod) {
	if pod.Spec.NodeName == "" {
		return
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		c.Forget(logger, pod.UID)
		return
	}
	seen := seenOf(pod)
	c.mu.RLock()
	ps, known := c.pods[pod.UID]
	var sameNode, counted, unchanged, confirm bool
	var prev podSeen
	var value, written, source string
	if known {
		sameNode = ps.node == pod.Spec.NodeName
		counted = sameNode && !ps.assumed
		unchanged = counted && ps.seen == seen
		prev, value, source = ps.seen, ps.value, ps.source
		if w := ps.written.Load(); w != nil {
			written = *w
		}
		// Bound by this scheduler with what it signed: no need to verify.
		confirm = sameNode && ps.assumed && seen.annotated && seen.annotation == written
	}
	c.mu.RUnlock()
	nn := ktypes.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	annotationChanged := seen.annotated != prev.annotated || seen.annotation != prev.annotation
	annotationWrong := !seen.annotated || seen.annotation != value
	switch {
	case !known && !seen.annotated && !seen.recorded:
		return // holds nothing, and nothing to forget
	case unchanged:
		return
	case confirm:
		c.mu.Lock()
		if c.pods[pod.UID] == ps {
			ps.assumed, ps.source, ps.seen, ps.value = false, objects.SourceAnnotation, seen, written
			if seen.recorded && seen.record == written {
				ps.source = objects.SourceRecord
			}
		}
		c.mu.Unlock()
		return
	case counted && seen.recorded && seen.record == value:
		// Recorded with what it was counted with: nothing to verify, and
		// nothing left to record.
		c.takeSeen(pod.UID, ps, seen, objects.SourceRecord)
		c.recorder.Forget(pod.UID)
		if annotationChanged && annotationWrong {
			c.changed(logger, pod, "kept by the scheduler's record")
		}
		return
	case counted && !seen.recorded && value != "" && annotationWrong:
		// The annotation no longer says what the pod holds and nothing
		// records it yet: record it now, whichever replica this is.
		c.recorder.AddUrgent(pod.UID, nn, value)
		c.takeSeen(pod.UID, ps, seen, source)
		c.changed(logger, pod, "recorded now from what the scheduler counted")
		return
	}
	verify := errNoKeys
	switch {
	case c.keys != nil:
		verify = c.keys.Verify
	case c.formOnly:
		verify = nil
	}
	held, err := objects.HeldAllocation(pod, verify)
	if err == nil && held.AnnotationDiffers {
		c.metrics.Rejected(ErrChanged)
		logger.Info("Pod's allocation annotation differs from the scheduler's record: it was changed after binding; counting the pod's devices by the record",
			"pod", klog.KObj(pod), "node", pod.Spec.NodeName)
	}
	if err != nil || (counted && !reflect.DeepEqual(ps.alloc, held.PodAllocation)) {
		if counted {
			// Its containers hold the devices it was counted with.
			c.metrics.Rejected(ErrChanged)
			logger.Info("Allocation of a bound pod was changed or removed; keeping the devices it was counted with",
				"pod", klog.KObj(pod), "node", pod.Spec.NodeName, "err", err)
			c.mu.Lock()
			if c.pods[pod.UID] == ps {
				ps.seen = seen
			}
			c.mu.Unlock()
			return
		}
		c.Forget(logger, pod.UID)
		if !errors.Is(err, kubeinterface.ErrNoAllocation) {
			c.metrics.Rejected(err)
			if known || klog.V(2).Enabled() {
				logger.Info("Pod's allocation is not valid; it holds no devices", "pod", klog.KObj(pod), "node", pod.Spec.NodeName, "err", err)
			}
		}
		return
	}
	if held.Source == objects.SourceAnnotation {
		// Bound by a scheduler that died before recording it, or by an
		// older version: record it now (only the leader writes).
		c.recorder.Add(pod.UID, nn, held.Value)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ps, ok := c.pods[pod.UID]; ok && ps.node == held.Node && reflect.DeepEqual(ps.alloc, held.PodAllocation) {
		ps.assumed, ps.source, ps.seen, ps.value = false, held.Source, seen, held.Value
		return
	}
	c.forgetLocked(pod.UID)
	ps = &podState{pod: ktypes.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, node: held.Node, alloc: held.PodAllocation,
		source: held.Source, seen: seen, value: held.Value}
	c.pods[pod.UID] = ps
	c.node(held.Node).pods[pod.UID] = struct{}{}
	c.apply(logger, pod.UID, ps)
}

// ErrChanged counts allocations changed after the pod was counted.
var ErrChanged = errors.New("allocation changed after binding")

// takeSeen records what a counted pod says now.
func (c *Cache) takeSeen(uid ktypes.UID, ps *podState, seen podSeen, source string) {
	c.mu.Lock()
	if c.pods[uid] == ps {
		ps.seen, ps.source = seen, source
	}
	c.mu.Unlock()
}

// changed reports a counted pod whose annotation no longer says what it
// holds.
func (c *Cache) changed(logger klog.Logger, pod *corev1.Pod, what string) {
	c.metrics.Rejected(ErrChanged)
	logger.Info("Pod's allocation annotation was changed or removed after binding; its devices are "+what,
		"pod", klog.KObj(pod), "node", pod.Spec.NodeName)
}

// apply counts ps on its node, if the node is known; must hold c.mu.
func (c *Cache) apply(logger klog.Logger, uid ktypes.UID, ps *podState) {
	ns, ok := c.nodes[ps.node]
	if !ok || ns.devices == nil || ps.applied {
		return
	}
	err := ns.devices.Assume(string(uid), ps.alloc, devicescheduler.Host{})
	ns.devicesChanged()
	if err != nil {
		c.metrics.Rejected(err)
		logger.Error(err, "Pod's devices do not match the node's inventory; not counted", "pod", ps.pod, "node", ps.node)
		return
	}
	ps.applied = true
}

// Forget releases a pod's devices, and wakes the pods waiting for devices
// if it held any.
func (c *Cache) Forget(_ klog.Logger, uid ktypes.UID) {
	c.learnMu.Lock()
	if c.learnState == learning {
		// LearnPods may be observing it from its list: forgotten again
		// once it is done.
		c.gone[uid] = struct{}{}
	}
	c.learnMu.Unlock()
	c.engine.ForgetPod(string(uid))
	c.mu.Lock()
	freed := c.forgetLocked(uid)
	c.mu.Unlock()
	c.NotWaiting(uid)
	c.recorder.Forget(uid)
	if freed {
		c.wake(c.deviceWaiters)
	}
}

// forgetLocked releases a pod's devices, and its node once nothing
// refers to it (see dropIfGoneLocked); it reports whether the pod held any
// devices. Must hold c.mu.
func (c *Cache) forgetLocked(uid ktypes.UID) bool {
	ps, ok := c.pods[uid]
	if !ok {
		return false
	}
	freed := false
	if ns, ok := c.nodes[ps.node]; ok {
		if ps.applied && ns.devices != nil {
			ns.devices.Release(string(uid))
			ns.devicesChanged()
			freed = true
		}
		delete(ns.pods, uid)
	}
	delete(c.pods, uid)
	// Its node may have gone meanwhile (a reason binding fails).
	c.dropIfGoneLocked(ps.node)
	return freed
}

// Holds reports whether the cache counts (or assumes) devices for pod uid.
func (c *Cache) Holds(uid ktypes.UID) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	_, ok := c.pods[uid]
	return ok
}

// SeenRunning reports, once per pod, that a pod the cache counts is seen
// running: true the first time only (for the allocation-to-running metric).
func (c *Cache) SeenRunning(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning {
		return false
	}
	c.mu.RLock()
	ps, ok := c.pods[pod.UID]
	first := ok && ps.running.CompareAndSwap(false, true)
	c.mu.RUnlock()
	return first
}

// errNoKeys verifies nothing: a cache given no keys, and not told to check
// allocations' form only, counts no allocation.
func errNoKeys(kubeinterface.Allocation) error {
	return fmt.Errorf("%w: the device cache has no keys to verify allocations with", kubeinterface.ErrBadSignature)
}
