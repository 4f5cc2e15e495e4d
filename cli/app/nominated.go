package app

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// nominatedBefore lists by node, of pods, those the scheduler counts on
// their nominated node before it places pod there, as its framework's
// nominator and RunFilterPluginsWithNominatedPods pick them: pods that
// preemption nominated to a node and that are not bound yet, of the
// scheduler's profiles (schedulers, or pod's own scheduler name when none
// are known: a scheduler keeps one nominator for all its profiles), other
// than pod, of at least its priority. A scheduler adds a node's nominated
// pods in the order it nominated them, which the API does not show: here
// they are in the order of their creation, then of their names.
func nominatedBefore(pod *corev1.Pod, pods []*corev1.Pod, schedulers []string) map[string][]*corev1.Pod {
	if len(schedulers) == 0 {
		schedulers = []string{pod.Spec.SchedulerName}
	}
	prio := corev1helpers.PodPriority(pod)
	out := map[string][]*corev1.Pod{}
	for _, p := range pods {
		node := p.Status.NominatedNodeName
		if node == "" || p.Spec.NodeName != "" || p.UID == pod.UID || corev1helpers.PodPriority(p) < prio || !slices.Contains(schedulers, p.Spec.SchedulerName) {
			continue
		}
		out[node] = append(out[node], p)
	}
	for _, list := range out {
		slices.SortFunc(list, func(a, b *corev1.Pod) int {
			if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
				return c
			}
			return cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
		})
	}
	return out
}

// nominee is a pod nominated to a node, as the scheduler counts it there
// before the pod explained: its CPU and memory, and its devices (added nil
// when the scheduler places none for it: devicecache.Cache.Nominee).
type nominee struct {
	pod                *corev1.Pod
	cpuMilli, memBytes int64
	added              *devicecache.Added
}

// nominees are pods, nominated to node, as the scheduler counts them, their
// devices compiled with their namespaces' policies (policies; a namespace
// missing there has none the scheduler could read).
func nominees(c *devicecache.Cache, e *devicescheduler.Engine, policies map[string]types.EnforcementPolicy, node string, pods []*corev1.Pod) []nominee {
	compile := func(p *corev1.Pod) (*devicescheduler.Request, bool) {
		policy, ok := policies[p.Namespace]
		if !ok {
			return nil, false
		}
		r, _, err := devicecache.CompileRequest(e, p, devicescheduler.Host{}, policy)
		return r, err == nil
	}
	var out []nominee
	for _, p := range pods {
		n := nominee{pod: p}
		n.cpuMilli, n.memBytes = objects.HostRequestBytes(p)
		if a, ok := c.Nominee(p, node, compile); ok {
			n.added = &a
		}
		out = append(out, n)
	}
	return out
}

// maxNamed bounds the pods a refusal names.
const maxNamed = 5

// nominatedSuffix names the nominated pods a refusal counted.
func nominatedSuffix(nominated []nominee) string {
	names := make([]string, 0, maxNamed)
	for _, n := range nominated[:min(len(nominated), maxNamed)] {
		names = append(names, n.pod.Namespace+"/"+n.pod.Name)
	}
	more := ""
	if len(nominated) > maxNamed {
		more = fmt.Sprintf(" and %d more", len(nominated)-maxNamed)
	}
	return ", counting first the pods that preemption nominated to this node (" + strings.Join(names, ", ") + more + ")"
}

// namespacePolicies is the enforcement policy of each namespace of pods,
// as the scheduler reads it: a namespace's label, or def. A namespace that
// does not exist, or whose label is invalid, is left out: the scheduler
// places no devices for its pods (unlike the pod explained, which it does
// not place at all: see enforcementPolicy). One that cannot be read gets
// def, as in enforcementPolicy.
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
