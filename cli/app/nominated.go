package app

import (
	"context"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// nominee is a pod nominated to a node, as the scheduler counts it there
// before the pod explained: its CPU and memory, and its devices. request
// is nil when it asks for none, or when its request or its namespace's
// label is invalid: the scheduler then places none for it.
type nominee struct {
	pod                *corev1.Pod
	cpuMilli, memBytes int64
	request            *devicescheduler.Request
}

// nominees are pods, nominated to node, as the scheduler's AddPod counts
// them: their devices compiled with their namespaces' policies (policies;
// a namespace missing there has none the scheduler could read), unless the
// cache holds them there already.
func nominees(c *devicecache.Cache, e *devicescheduler.Engine, policies map[string]types.EnforcementPolicy, node string, pods []*corev1.Pod) []nominee {
	var out []nominee
	for _, p := range pods {
		n := nominee{pod: p}
		n.cpuMilli, n.memBytes = objects.HostRequestBytes(p)
		if policy, ok := policies[p.Namespace]; ok && objects.WantsDevices(p) && !c.HoldsOn(p.UID, node) {
			if r, _, err := devicecache.CompileRequest(e, p, devicescheduler.Host{}, policy); err == nil {
				n.request = r
			}
		}
		out = append(out, n)
	}
	return out
}

// nominatedSuffix names the nominated pods a refusal counted.
func nominatedSuffix(nominated []nominee) string {
	names := make([]string, 0, len(nominated))
	for _, n := range nominated {
		names = append(names, n.pod.Namespace+"/"+n.pod.Name)
	}
	return ", counting first the pods that preemption nominated to this node (" + strings.Join(names, ", ") + ")"
}

// namespacePolicies is the enforcement policy of each namespace of pods,
// as the scheduler reads it: a namespace's label, or def. A namespace that
// does not exist, or whose label is invalid, is left out (the scheduler
// places no devices for its pods); one that cannot be read gets def.
func namespacePolicies(ctx context.Context, c kubernetes.Interface, pods []*corev1.Pod, def types.EnforcementPolicy) map[string]types.EnforcementPolicy {
	out := map[string]types.EnforcementPolicy{}
	tried := map[string]bool{}
	for _, p := range pods {
		if tried[p.Namespace] {
			continue
		}
		tried[p.Namespace] = true
		ns, err := c.CoreV1().Namespaces().Get(ctx, p.Namespace, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			out[p.Namespace] = def
			continue
		}
		if policy, err := objects.EnforcementPolicy(ns, def); err == nil {
			out[p.Namespace] = policy
		}
	}
	return out
}
