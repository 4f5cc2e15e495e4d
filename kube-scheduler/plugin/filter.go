package plugin

import (
	"context"
	"errors"
	"strings"

	corev1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
)

// Filter checks, through the engine, whether the pod's devices fit on the
// node; the status names the reason when they do not.
func (p *Plugin) Filter(_ context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) *fwk.Status {
	s := getState(cs)
	if s == nil {
		return nil
	}
	name := ni.Node().Name
	var pl devicescheduler.Placement
	err := p.cache.evaluate(name, s.request, &pl)
	switch {
	case err == nil:
		s.setScore(name, pl.Score())
		return nil
	case errors.Is(err, devicescheduler.ErrDoesNotFit):
		return fwk.NewStatus(fwk.Unschedulable, "GPUs: "+reason(err))
	case errors.Is(err, errNoInventory):
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "GPUs: "+err.Error())
	case errors.Is(err, errStale):
		p.cache.waitForHeartbeat(pod)
		return fwk.NewStatus(fwk.Unschedulable, "GPUs: "+reason(err))
	default:
		return fwk.NewStatus(fwk.Unschedulable, "GPUs: "+err.Error())
	}
}

// reason strips the sentinel from a does-not-fit or stale-heartbeat error.
func reason(err error) string {
	msg := err.Error()
	for _, sentinel := range []error{devicescheduler.ErrDoesNotFit, errStale} {
		if rest, ok := strings.CutPrefix(msg, sentinel.Error()+": "); ok {
			return rest
		}
	}
	return msg
}
