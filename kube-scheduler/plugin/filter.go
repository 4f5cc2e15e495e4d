package plugin

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"

	corev1 "k8s.io/api/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/claims"
)

// Filter checks, through the engine, whether the pod's devices fit on the
// node; the status names the reason when they do not.
func (p *Plugin) Filter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) *fwk.Status {
	s := getState(cs)
	if s == nil {
		return nil
	}
	node := ni.Node()
	if c := s.claims; c != nil && c.node != "" && c.node != node.Name {
		s.claimsElsewhere.Store(true)
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, fmt.Sprintf("GPUs: the pod's ResourceClaims are allocated on node %s", c.node))
	}
	capacity, free := nodeHost(ni)
	pl := placements.Get().(*devicescheduler.Placement)
	defer placements.Put(pl)
	var err error
	if o := overlayOf(cs, node.Name); !o.Empty() {
		// Preemption's dry run, or pods nominated to the node: not counted
		// among the reasons the pod waits (a dry run shares the state),
		// and not scored: the framework filters such a node a second
		// time, without them, and that call's score is Score's. (Where
		// the nominated pods add no devices the overlay is empty, and both
		// passes put a score: the later one counts, see filterScores.)
		//
		// Not in preemption's dry run: the allocator counts the victims'
		// claims as allocated until they are gone; the devices are checked
		// once they are.
		var st *fwk.Status
		_, _, st, err = p.tryVariants(ctx, s, node, !o.DryRun, pl, func(in *devicecache.Input) (int64, error) {
			return p.cache.EvaluateWith(node, o, in, corev1helpers.PodPriority(pod), capacity, free, pl)
		})
		if st != nil {
			return st
		}
	} else {
		var score int64
		v := 0
		if s.claims == nil {
			// Without the closure: Filter's hot path.
			score, err = p.cache.Evaluate(node, &s.eval, capacity, free, pl)
		} else {
			var st *fwk.Status
			score, v, st, err = p.tryVariants(ctx, s, node, true, pl, func(in *devicecache.Input) (int64, error) {
				return p.cache.Evaluate(node, in, capacity, free, pl)
			})
			if st != nil {
				return st
			}
		}
		switch {
		case isDRAServes(err):
		case err != nil:
			s.pending.Count(devicecache.ReasonOf(err))
		default:
			s.scores.put(node, claims.RankScore(score, v, len(s.others)+1))
		}
	}
	if isDRAServes(err) {
		return nil // the DynamicResources plugin judges the node
	}
	if err != nil && devicecache.ReasonOf(err) == devicecache.ReasonHostResources && !devicecache.Classify(err).Unresolvable && p.fitFilters() && fitCountsHost(cs) {
		// Left to NodeResourcesFit, which the shipped profiles run
		// after this plugin: its reason names the resource, and its
		// queueing hints wake the pod when a pod without GPUs frees CPU
		// or memory. Score ranks the node last; Reserve checks again.
		// Not a node whose GPUs could never hold the pod: refused here
		// as unresolvable, preemption passes it over.
		err = nil
	}
	if err == nil {
		return nil
	}
	return p.filterStatus(pod, s, err)
}

// isDRAServes reports whether err says that DRA, not kubegpu, serves the
// pod on the node (devicecache.ServedByDRA): no refusal. Evaluate returns
// it unwrapped; a type assertion, as errors.As on every refused node of a
// full cluster would cost Filter more than its memo saves.
func isDRAServes(err error) bool {
	_, ok := err.(*devicecache.DRAServes) //nolint:errorlint // returned unwrapped, see above
	return ok
}

// fitPreFilterKey is where NodeResourcesFit's PreFilter leaves its state.
const fitPreFilterKey fwk.StateKey = "PreFilterNodeResourcesFit"

// fitCountsHost reports whether NodeResourcesFit filters this cycle (its
// PreFilter ran: every PreFilter runs before any Filter), and so refuses
// nodes short of the pod's CPU or memory itself.
func fitCountsHost(cs fwk.CycleState) bool {
	_, err := cs.Read(fitPreFilterKey)
	return err == nil
}

// pluginLister is the framework's list of its plugins by extension point
// (the handle the scheduler gives New is the framework itself).
type pluginLister interface {
	ListPlugins() *schedconfig.Plugins
	ProfileName() string
}

// fitFilters reports whether the profile runs NodeResourcesFit's Filter:
// fitCountsHost sees only its PreFilter, and a profile may disable the
// one without the other. Listed once, at the first node short of CPU or
// memory; a handle that cannot list its plugins (unit tests' fakes) is
// taken to run it.
func (p *Plugin) fitFilters() bool {
	p.fitOnce.Do(func() {
		p.fitFilter = true
		l, ok := p.handle.(pluginLister)
		if !ok {
			return
		}
		plugins := l.ListPlugins()
		p.fitFilter = plugins != nil && slices.ContainsFunc(plugins.Filter.Enabled, func(pl schedconfig.Plugin) bool { return pl.Name == names.NodeResourcesFit })
		if !p.fitFilter {
			klog.FromContext(p.ctx).WithName(Name).Info("The profile does not run NodeResourcesFit's Filter: KubeGPU refuses nodes short of a GPU pod's CPU or memory itself", "profile", l.ProfileName())
		}
	})
	return p.fitFilter
}

// filterStatus is Filter's status for a node that refused the pod with err.
// The pods refused for a node not live, or for want of devices, are woken
// when the cache sees the node live again or devices freed.
func (p *Plugin) filterStatus(pod *corev1.Pod, s *cycleState, err error) *fwk.Status {
	r := devicecache.Classify(err)
	switch {
	case r.Reason == devicecache.ReasonNodeNotLive:
		p.cache.WaitForHeartbeat(pod)
	case r.Reason == devicecache.ReasonDRA:
		p.cache.WaitForDRA(pod)
	case r.Waits && s.waitsForDevices.CompareAndSwap(false, true):
		p.cache.WaitForDevices(pod)
	}
	return fwk.NewStatus(statusCode(r), r.Message)
}

// statusCode is the framework's code for a refusal.
func statusCode(r *devicecache.Refusal) fwk.Code {
	if r.Unresolvable {
		return fwk.UnschedulableAndUnresolvable
	}
	return fwk.Unschedulable
}

// placements are reusable Evaluate buffers: a Placement is a few KiB, too
// much to allocate and clear for every node of every cycle.
var placements = sync.Pool{New: func() any { return new(devicescheduler.Placement) }}
