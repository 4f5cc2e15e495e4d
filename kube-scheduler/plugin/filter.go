package plugin

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
)

// Filter checks, through the engine, whether the pod's devices fit on the
// node; the status names the reason when they do not.
func (p *Plugin) Filter(_ context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) *fwk.Status {
	s := getState(cs)
	if s == nil {
		return nil
	}
	node := ni.Node()
	capacity, free := nodeHost(ni)
	pl := placements.Get().(*devicescheduler.Placement)
	var err error
	if o := overlayOf(cs, node.Name); !o.empty() {
		// Preemption's dry run, or pods nominated to the node: not counted
		// among the reasons the pod waits (a dry run shares the state),
		// and not scored: the framework filters such a node a second
		// time, without them, and that call's score is Score's.
		_, err = p.cache.evaluateWith(node, o, &s.eval, corev1helpers.PodPriority(pod), capacity, free, pl)
	} else {
		var score int64
		if score, err = p.cache.evaluate(node, &s.eval, capacity, free, pl); err != nil {
			s.pending.count(filterReason(err))
		} else {
			s.scores.put(node, score)
		}
	}
	placements.Put(pl)
	if err != nil && filterReason(err) == pendingHostResources && !neverFits(err) && p.fitFilters() && fitCountsHost(cs) {
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

// neverFits reports whether err refuses the node whatever pods leave it.
func neverFits(err error) bool {
	r, ok := err.(*refusal) //nolint:errorlint // see filterStatus
	if !ok {
		r = classify(err)
	}
	return r.code == fwk.UnschedulableAndUnresolvable
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
	ListPlugins() *config.Plugins
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
		p.fitFilter = plugins != nil && slices.ContainsFunc(plugins.Filter.Enabled, func(pl config.Plugin) bool { return pl.Name == names.NodeResourcesFit })
		if !p.fitFilter {
			klog.FromContext(p.ctx).WithName(Name).Info("The profile does not run NodeResourcesFit's Filter: KubeGPU refuses nodes short of a GPU pod's CPU or memory itself", "profile", l.ProfileName())
		}
	})
	return p.fitFilter
}

// refusal is an engine refusal classified once, when the device cache's
// memo takes it in: a node refuses every pod of a shape alike until it
// changes, and once a cluster fills, each cycle's Filter passes over
// hundreds of such nodes. It wraps the engine's error.
type refusal struct {
	error
	// reason is the pending reason (filterReason); code and msg Filter's
	// status; waits whether freed devices could let the pod fit.
	reason int
	code   fwk.Code
	msg    string
	waits  bool
}

func (r *refusal) Unwrap() error { return r.error }

// neverFitsSuffix ends the message of a node that could not hold the pod
// even with all its GPUs free: the pod will not fit there by waiting.
const neverFitsSuffix = ", even with every GPU of the node free"

// classify classifies an engine refusal for Filter's status.
func classify(err error) *refusal {
	r := &refusal{error: err, reason: filterReason(err), code: fwk.Unschedulable}
	var nf *devicescheduler.NotFitError
	switch {
	case errors.As(err, &nf) && errors.Is(err, errNeverFits):
		// Evicting pods would not help: preemption skips the node. Said
		// so, or "not enough free GPUs" reads as a wait.
		r.code, r.msg = fwk.UnschedulableAndUnresolvable, "GPUs: "+nf.Reason+neverFitsSuffix
	case errors.As(err, &nf):
		// The constant reason, so that the scheduler's FailedScheduling
		// message counts nodes by reason; `kubegpu explain` gives
		// details (formatted only then). Freed devices may let the pod
		// fit.
		r.msg, r.waits = "GPUs: "+nf.Reason, true
	default:
		r.msg = "GPUs: " + err.Error()
	}
	return r
}

// filterStatus is Filter's status for a node that refused the pod with err.
func (p *Plugin) filterStatus(pod *corev1.Pod, s *cycleState, err error) *fwk.Status {
	r, ok := err.(*refusal) //nolint:errorlint // the memo returns refusals unwrapped; errors.As per refused node is the cost avoided
	if !ok {
		switch {
		case errors.Is(err, errNoInventory), errors.Is(err, errKeyRefused):
			return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "GPUs: "+err.Error())
		case errors.Is(err, errStale):
			p.cache.waitForHeartbeat(pod)
			return fwk.NewStatus(fwk.Unschedulable, "GPUs: "+reason(err))
		}
		r = classify(err) // preemption's dry run and nominated pods
	}
	if r.waits && s.waitsForDevices.CompareAndSwap(false, true) {
		p.cache.waitForDevices(pod)
	}
	return fwk.NewStatus(r.code, r.msg)
}

// placements are reusable Evaluate buffers: a Placement is a few KiB, too
// much to allocate and clear for every node of every cycle.
var placements = sync.Pool{New: func() any { return new(devicescheduler.Placement) }}

// reason strips the sentinel from a node-not-live error.
func reason(err error) string {
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, errStale.Error()+": "); ok {
		return rest
	}
	return msg
}
