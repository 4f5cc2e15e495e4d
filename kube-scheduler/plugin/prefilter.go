package plugin

import (
	"context"
	"fmt"
	"slices"

	"github.com/kubegpu/kubegpu/kube-scheduler/apis/config"

	corev1 "k8s.io/api/core/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// PreFilter decodes the pod's device request. Pods that ask for no devices
// skip Filter (and, with podsWithoutDevices: Ignore, the whole plugin); a
// malformed request makes the pod unschedulable until the user fixes it,
// with a message that says what to fix.
func (p *Plugin) PreFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	// Only the leader schedules: it alone writes the allocation records.
	p.recorder.Start(p.ctx)
	cc, variants, status := p.podClaims(ctx, pod)
	if status != nil {
		reason := devicecache.ReasonOther // waiting for a claim
		if status.Code() == fwk.UnschedulableAndUnresolvable {
			reason = devicecache.ReasonInvalidRequest
		}
		p.pending.Refuse(pod.UID, reason)
		return nil, status
	}
	if cc == nil && !objects.WantsDevices(pod) {
		if p.args.PodsWithoutDevices == config.PodsWithoutDevicesScore && p.mayLandOnDevices(pod) {
			p.writeHostOnly(cs, pod)
		}
		return nil, fwk.NewStatus(fwk.Skip)
	}
	policy, status := p.enforcement(pod)
	if status != nil {
		return nil, status
	}
	r, req, compiled, err := devicecache.CompileVariants(p.engine, pod, podHost(pod), policy, variants)
	if err != nil {
		p.pending.Refuse(pod.UID, devicecache.ReasonInvalidRequest)
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, fmt.Sprintf("invalid GPU request: %v", err))
	}
	// Any scheduling group, named by whatever field: fails closed.
	if g := pod.Spec.SchedulingGroup; g != nil && !p.placesGroups() {
		group := ""
		if g.PodGroupName != nil {
			group = *g.PodGroupName
		}
		p.pending.Refuse(pod.UID, devicecache.ReasonGroupsOff)
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, fmt.Sprintf(
			"GPUs: the pod belongs to pod group %q, and this scheduler does not place pod groups (%s), so its group could run partly: "+
				"remove spec.schedulingGroup, or run kubegpu-scheduler with --feature-gates=GenericWorkload=true "+
				"and the GangScheduling plugin in its profile", group, errGroupsOff))
	}
	warm, err := p.waitForSync(ctx)
	if err != nil {
		return nil, fwk.AsStatus(err)
	}
	if !warm {
		// Remembered first, checked again after: WarmUp may have woken
		// the waiting pods in between.
		p.cache.WaitForHeartbeat(pod)
		if !p.cache.Warmed() {
			p.pending.Refuse(pod.UID, devicecache.ReasonWarmingUp)
			return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "GPUs: "+devicecache.ErrWarmingUp.Error())
		}
		p.cache.NotWaiting(pod.UID)
	}
	others := make([]variant, len(compiled))
	for i, o := range compiled {
		others[i].request = o
	}
	s := &cycleState{request: r, others: others, pending: p.pending.Start(pod.UID), claims: cc}
	if cc != nil && cc.unallocated {
		s.eval = p.cache.InputOnce(r) // Filter checks the devices chosen on each node: no memo
	} else {
		s.eval = p.cache.Input(devicecache.RequestShape(req, r.Host, r.Enforcement), r)
	}
	p.cache.ForPod(&s.eval, pod)
	for i := range s.others {
		v := &s.others[i]
		v.eval = p.cache.InputOnce(v.request)
		p.cache.ForPod(&v.eval, pod)
	}
	s.scores.reset(len(nodes))
	cs.Write(stateKey, s)
	return nil, nil
}

// enforcement is the policy the pod's slices are placed under: its
// namespace's label, or the args' default. A namespace the scheduler has
// not seen yet is an error (the pod is retried): the default could be
// laxer than the namespace's label.
func (p *Plugin) enforcement(pod *corev1.Pod) (types.EnforcementPolicy, *fwk.Status) {
	ns, err := p.namespaces.Get(pod.Namespace)
	if err != nil {
		return "", fwk.AsStatus(fmt.Errorf("GPUs: the pod's namespace for its enforcement policy: %w", err))
	}
	policy, err := objects.EnforcementPolicy(ns, p.args.Enforcement)
	if err != nil {
		p.pending.Refuse(pod.UID, devicecache.ReasonInvalidRequest)
		return "", fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "GPUs: "+err.Error())
	}
	return policy, nil
}

// compileNominee compiles the devices of a pod nominated to a node (see
// devicecache.Cache.Nominee), with its namespace's policy as PreFilter
// compiles the pod's own.
func (p *Plugin) compileNominee(pod *corev1.Pod) (*devicescheduler.Request, bool) {
	policy, status := p.enforcement(pod)
	if status != nil {
		return nil, false
	}
	r, _, err := devicecache.CompileRequest(p.engine, pod, devicescheduler.Host{}, policy)
	return r, err == nil
}

// errGroupsOff is why a profile does not place pod groups.
const errGroupsOff = "feature gate GenericWorkload off, or no GangScheduling plugin in the profile"

// placesGroups reports whether the profile places the pods of a pod group
// together, all or none: the scheduler's feature gate GenericWorkload is on
// and the profile runs the GangScheduling plugin's
// Permit. Otherwise the scheduler would place a group's pods one by one,
// as if alone. Decided once, at the first pod of a group.
func (p *Plugin) placesGroups() bool {
	p.groupsOnce.Do(func() {
		gates := utilfeature.DefaultFeatureGate
		p.groups = gates.Enabled(features.GenericWorkload)
		if l, ok := p.handle.(pluginLister); ok && p.groups {
			plugins := l.ListPlugins()
			p.groups = plugins != nil && slices.ContainsFunc(plugins.Permit.Enabled, func(pl schedconfig.Plugin) bool { return pl.Name == names.GangScheduling })
		}
		if !p.groups {
			klog.FromContext(p.ctx).WithName(Name).Info("This profile does not place pod groups: GPU pods of a group wait, unschedulable", "reason", errGroupsOff)
		}
	})
	return p.groups
}

// writeHostOnly prepares Score for a pod without devices. Nothing waits for
// the cache: until it has synced, nodes without a known inventory simply
// rank first.
func (p *Plugin) writeHostOnly(cs fwk.CycleState, pod *corev1.Pod) {
	if r, host, err := p.hostOnlyRequest(pod); err == nil {
		cs.Write(hostOnlyKey, &hostOnlyState{eval: p.cache.HostOnlyInput(r, host)})
	}
}

// hostOnlyRequest is the engine's request of a pod without devices: its
// CPU and memory alone. An empty request is always valid.
func (p *Plugin) hostOnlyRequest(pod *corev1.Pod) (*devicescheduler.Request, devicescheduler.Host, error) {
	host := podHost(pod)
	r, err := p.engine.NewRequest(types.PodRequest{}, host)
	return r, host, err
}

// mayLandOnDevices reports whether a pod without devices could land on a
// node that publishes devices: whether the cache knows one, and, where the
// profile runs TaintToleration's Filter, whether the pod tolerates the
// hard taints of one. Where it cannot, every node it could get would score
// alike: the plugin skips its Score, and the pod costs what it costs
// without the plugin. The cache and the scheduler's snapshot take node
// updates apart: for the moment between them a node just untainted may go
// unscored (Reserve still counts the pod in the workload mix).
func (p *Plugin) mayLandOnDevices(pod *corev1.Pod) bool {
	if !p.taintFilters() {
		return p.cache.KnowsDevices()
	}
	logger := klog.FromContext(p.ctx)
	comparisons := utilfeature.DefaultFeatureGate.Enabled(features.TaintTolerationComparisonOperators)
	return p.cache.DeviceNodesTolerated(func(taints []corev1.Taint) bool {
		_, untolerated := corev1helpers.FindMatchingUntoleratedTaint(logger, taints, pod.Spec.Tolerations, nil, comparisons)
		return !untolerated
	})
}

// taintFilters reports whether the profile runs TaintToleration's Filter
// (see mayLandOnDevices). Listed once.
func (p *Plugin) taintFilters() bool {
	p.taintOnce.Do(func() {
		if l, ok := p.handle.(pluginLister); ok {
			plugins := l.ListPlugins()
			p.taintFilter = plugins != nil && slices.ContainsFunc(plugins.Filter.Enabled, func(pl schedconfig.Plugin) bool { return pl.Name == names.TaintToleration })
		}
	})
	return p.taintFilter
}

// podHost is the pod's CPU and memory request as the scheduler counts it.
func podHost(pod *corev1.Pod) devicescheduler.Host {
	cpu, mem := objects.HostRequest(pod)
	return devicescheduler.Host{CPUMilli: cpu, MemoryMiB: mem}
}

// nodeHost is the node's allocatable CPU and memory and what of them the
// scheduler counts free (assumed pods included).
func nodeHost(ni fwk.NodeInfo) (capacity, free devicescheduler.Host) {
	a, r := ni.GetAllocatable(), ni.GetRequested()
	return devicecache.NodeHost(a.GetMilliCPU(), a.GetMemory(), r.GetMilliCPU(), r.GetMemory())
}
