package plugin

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/apis/config"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/types"
)

// Reserve chooses the pod's devices on the chosen node afresh and assumes
// them in the device cache, in one step, so that no later cycle can hand out
// the same devices before the pod is bound or unreserved.
func (p *Plugin) Reserve(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) *fwk.Status {
	// Placing pods: the background records wait (see package record). Cycles
	// that place nothing (pods that fit nowhere, retried) do not count.
	p.recorder.Cycle()
	s := getState(cs)
	if s == nil {
		p.observeHostOnly(ctx, cs, pod, nodeName)
		return nil
	}
	if dropped := s.scores.release(); dropped > 0 { // Score is done
		klog.FromContext(ctx).V(4).Info("Filter scored more nodes than the cycle had slots for; Score evaluated them again", "pod", klog.KObj(pod), "dropped", dropped)
	}
	node, capacity, free := p.reserveHost(ctx, nodeName)
	served := p.cache.ServedByDRAOn(nodeName, &s.eval)
	if node != nil {
		served = devicecache.ServedByDRA(node, &s.eval)
	}
	if served != nil {
		// The DynamicResources plugin allocates the pod's devices here.
		s.dra = true
		p.pending.Remove(pod.UID)
		klog.FromContext(ctx).V(4).Info("DRA serves the pod's request on the node; kubegpu reserves nothing", "pod", klog.KObj(pod), "node", nodeName)
		return nil
	}
	// The first variant that fits the node now, as DRA takes the first
	// alternative that does; the first one's refusal when none does.
	var alloc types.PodAllocation
	var refusal *fwk.Status
	request := s.request
	for i := range len(s.others) + 1 {
		a, st := p.reserveVariant(ctx, s, pod, node, nodeName, capacity, free, i)
		if st == nil {
			alloc, request, refusal = a, s.requestOf(i), nil
			break
		}
		if refusal == nil || st.Code() != fwk.Unschedulable {
			refusal = st
		}
		if st.Code() != fwk.Unschedulable {
			break
		}
	}
	if refusal != nil {
		return refusal
	}
	p.engine.ObservePod(string(pod.UID), request, pod.CreationTimestamp.Time)
	p.pending.Remove(pod.UID)
	s.alloc = alloc
	if logger := klog.FromContext(ctx).V(4); logger.Enabled() {
		logger.Info("Reserved devices", "pod", klog.KObj(pod), "node", nodeName, "devices", devicesOf(alloc))
	}
	return nil
}

// observeHostOnly adds a pod without devices that lands on a device node
// to the workload mix the engine learns: it takes the CPU and memory that
// idle devices need. With podsWithoutDevices: Score only, whether or not
// the plugin scored the pod (see mayLandOnDevices).
func (p *Plugin) observeHostOnly(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) {
	if p.args.PodsWithoutDevices != config.PodsWithoutDevicesScore || !p.cache.HasDevices(nodeName) {
		return
	}
	if h := getHostOnly(cs); h != nil {
		p.engine.ObservePod(string(pod.UID), h.eval.Request(), pod.CreationTimestamp.Time)
		return
	}
	klog.FromContext(ctx).V(4).Info("A pod the plugin did not score, as no device node seemed to take it, landed on a device node", "pod", klog.KObj(pod), "node", nodeName)
	if r, _, err := p.hostOnlyRequest(pod); err == nil {
		p.engine.ObservePod(string(pod.UID), r, pod.CreationTimestamp.Time)
	}
}

// nominated are the pods nominated to node (preemptors waiting for their
// victims to go) that come before pod, as the scheduler ranks them: of
// at least pod's priority. Their devices are held for them: pod's are
// chosen from what they leave.
func (p *Plugin) nominated(pod *corev1.Pod, node string) []devicecache.Added {
	if p.handle == nil {
		return nil
	}
	var out []devicecache.Added
	prio := corev1helpers.PodPriority(pod)
	for _, pi := range p.handle.NominatedPodsForNode(node) {
		np := pi.GetPod()
		if np.UID == pod.UID || corev1helpers.PodPriority(np) < prio {
			continue
		}
		if a, ok := p.cache.Nominee(np, node, p.compileNominee); ok {
			out = append(out, a)
		}
	}
	return out
}

// reserveHost is the node in this cycle's snapshot and its host
// resources, as Filter and Score saw them; no node and untracked (zero)
// resources without a snapshot.
func (p *Plugin) reserveHost(ctx context.Context, nodeName string) (node *corev1.Node, capacity, free devicescheduler.Host) {
	if p.handle == nil {
		return nil, capacity, free
	}
	ni, err := p.handle.SnapshotSharedLister().NodeInfos().Get(nodeName)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Node not in the scheduling snapshot; choosing devices without its CPU and memory", "node", nodeName)
		return nil, capacity, free
	}
	capacity, free = nodeHost(ni)
	return ni.Node(), capacity, free
}

// Unreserve gives back the devices Reserve assumed.
func (p *Plugin) Unreserve(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) {
	p.engine.ForgetPod(string(pod.UID))
	s := getState(cs)
	if s == nil || s.dra {
		return
	}
	if s.claims != nil {
		p.unreserveClaims(ctx, pod, s.claims)
	}
	p.cache.Unreserve(pod.UID)
	klog.FromContext(ctx).V(4).Info("Unreserved devices", "pod", klog.KObj(pod), "node", nodeName)
}
