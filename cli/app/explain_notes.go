package app

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// What explain says beside the engine's verdicts: what the scheduler's
// other filters and its last attempt say, and models no node has.

// nodeExcludes says why the scheduler's node filters other than KubeGPU's
// leave node out for pod (its nodeSelector and required node affinity, the
// node's NoSchedule and NoExecute taints), or returns "".
func nodeExcludes(affinity nodeaffinity.RequiredNodeAffinity, pod *corev1.Pod, node *corev1.Node) string {
	if ok, err := affinity.Match(node); err != nil || !ok {
		return "the pod's nodeSelector or required node affinity excludes the node"
	}
	taint, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, pod.Spec.Tolerations, func(t *corev1.Taint) bool {
		return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
	}, true)
	if untolerated {
		return "the pod does not tolerate the node's taint " + taint.ToString()
	}
	return ""
}

// maxSchedulerWords bounds how many characters of the scheduler's message
// explain prints.
const maxSchedulerWords = 1024

// schedulerSays is the message of a pending pod's PodScheduled condition:
// why the scheduler's last attempt did not place it (for reasons the
// nodes below cannot show, such as a pod group the scheduler does not
// place whole), sanitized and bounded; empty if it says nothing.
func schedulerSays(pod *corev1.Pod) string {
	if pod.Spec.NodeName != "" {
		return ""
	}
	for _, c := range pod.Status.Conditions {
		if c.Type != corev1.PodScheduled || c.Status != corev1.ConditionFalse || c.Message == "" {
			continue
		}
		msg := []rune(sanitize(c.Message))
		if len(msg) > maxSchedulerWords {
			return string(msg[:maxSchedulerWords]) + "..."
		}
		return string(msg)
	}
	return ""
}

// acceptsAnyKey reports whether a node whose inventory is inv verifies
// allocations signed with one of the keys of IDs ids, as it says
// (types.Inventory.AcceptsKey: the scheduler's rule).
func acceptsAnyKey(inv types.Inventory, ids []string) bool {
	return slices.ContainsFunc(ids, inv.AcceptsKey)
}

// maxModelsListed bounds the models unknownModels lists.
const maxModelsListed = 16

// unknownModels says which models the pod's kubegpu.io/gpu-model-include
// names that no node has (compared as the scheduler does, ignoring case),
// and lists the models the nodes have; empty if every named model exists.
func unknownModels(req types.PodRequest, nodes []nodeState) string {
	have := map[string]bool{}
	var models []string
	for _, n := range nodes {
		for _, d := range n.inv.Devices {
			if l := strings.ToLower(d.Model); !have[l] {
				have[l] = true
				models = append(models, d.Model)
			}
		}
	}
	var unknown []string
	for _, list := range [][]types.ContainerRequest{req.InitContainers, req.Containers} {
		for _, c := range list {
			for _, m := range c.Selector.IncludeModels {
				if !have[strings.ToLower(m)] && !slices.Contains(unknown, m) {
					unknown = append(unknown, m)
				}
			}
		}
	}
	if len(unknown) == 0 {
		return ""
	}
	slices.Sort(models)
	listed := models
	more := ""
	if len(listed) > maxModelsListed {
		listed, more = listed[:maxModelsListed], fmt.Sprintf(" and %d more", len(models)-maxModelsListed)
	}
	quote := func(l []string) string {
		q := make([]string, len(l))
		for i, m := range l {
			q[i] = kubeinterface.Quote(m)
		}
		return strings.Join(q, ", ")
	}
	return fmt.Sprintf("No node has a GPU of model %s (%s names models exactly, ignoring case). The nodes' models: %s%s.",
		quote(unknown), kubeinterface.AnnotationModelInclude, quote(listed), more)
}

// enforcementPolicy is the policy the scheduler places the pod's slices
// under, as its namespace's label and def (the args') decide, with a
// sentence that says so; "" with the reason when the label is invalid (the
// scheduler keeps the pod out). A namespace that cannot be read is said,
// and def assumed.
func enforcementPolicy(ctx context.Context, c kubernetes.Interface, ns string, def types.EnforcementPolicy) (types.EnforcementPolicy, string) {
	namespace, err := c.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		return def, fmt.Sprintf("Its slices are judged under enforcement %s, the scheduler's default: its namespace's %s label could not be read (%s).",
			def, kubeinterface.LabelEnforcement, sanitize(err.Error()))
	}
	p, err := objects.EnforcementPolicy(namespace, def)
	if err != nil {
		return "", sanitize(err.Error())
	}
	if _, labeled := namespace.Labels[kubeinterface.LabelEnforcement]; labeled {
		return p, fmt.Sprintf("Its slices are placed under enforcement %s (its namespace's %s label)%s.", p, kubeinterface.LabelEnforcement, policyMeaning(p))
	}
	return p, fmt.Sprintf("Its slices are placed under enforcement %s (the scheduler's default)%s.", p, policyMeaning(p))
}

func policyMeaning(p types.EnforcementPolicy) string {
	if p == types.EnforcementRequired {
		return ": only on GPUs whose node enforces their memory and compute limits, and stopped if what the node applied differs"
	}
	return ": on any GPU with room; the node records whether their limits were applied"
}

// enforcementNote says what the pod's node recorded of its slices'
// enforcement.
func enforcementNote(pod *corev1.Pod) string {
	e := objects.PodEnforcement(pod)
	if e.State == "" {
		return "Its node has not recorded its slices' enforcement (condition " + kubeinterface.ConditionEnforced + ") yet."
	}
	return fmt.Sprintf("Its node recorded its slices' enforcement: %s: %s.", sanitize(e.State), sanitize(e.Message))
}

// nominationNote says what a pod nominated to a node by preemption waits
// for: the pods the scheduler is evicting there (for it, or for another
// preemptor), or nothing.
func nominationNote(s *clusterState, pod *corev1.Pod) string {
	node := pod.Status.NominatedNodeName
	var leaving []string
	check := func(p *corev1.Pod) {
		if objects.PreemptedByScheduler(p) {
			leaving = append(leaving, p.Namespace+"/"+p.Name)
		}
	}
	for _, pa := range s.pods[node] {
		check(pa.pod)
	}
	for _, p := range s.withoutDevices[node] {
		check(p)
	}
	for _, u := range s.unverified {
		if u.pod.Spec.NodeName == node {
			check(u.pod)
		}
	}
	if len(leaving) == 0 {
		return fmt.Sprintf("It is nominated to %s by preemption; no pod evicted there is left: it is placed at its next attempt.", sanitize(node))
	}
	slices.Sort(leaving)
	const shown = 5
	more := ""
	if len(leaving) > shown {
		more = fmt.Sprintf(" and %d more", len(leaving)-shown)
		leaving = leaving[:shown]
	}
	return fmt.Sprintf("It is nominated to %s by preemption and waits for the pods evicted there to leave: %s%s.", sanitize(node), sanitize(strings.Join(leaving, ", ")), more)
}

// borrowing says whether pod borrows: it runs at the borrowers'
// PriorityClass, which the admission policy kubegpu-budget gives a pod over
// its namespace's GPU budget (or the tenant asked for).
func borrowing(pod *corev1.Pod) bool {
	return pod.Spec.PriorityClassName == kubeinterface.PriorityClassBorrowed
}

// budgetNote says whether borrower pod's namespace budget has room for it
// now. Whether a pod borrows is decided at its creation, and a pod created
// while the one it replaces still counted (a rolling update, a restarted
// Job pod) borrows for life although its namespace is within budget.
func budgetNote(ctx context.Context, c kubernetes.Interface, pod *corev1.Pod) string {
	q, err := c.CoreV1().ResourceQuotas(pod.Namespace).Get(ctx, kubeinterface.BudgetQuota, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "Its namespace has no GPU budget (no ResourceQuota " + kubeinterface.BudgetQuota + "): the pod asked for the class itself."
	case err != nil:
		return "Its namespace's GPU budget cannot be read: " + sanitize(err.Error())
	}
	key := corev1.ResourceName("requests." + kubeinterface.ResourceGPUShare)
	hard, used := q.Status.Hard[key], q.Status.Used[key]
	share := objects.PodShare(pod)
	if free := hard.Value() - used.Value(); free >= share {
		return fmt.Sprintf("Its namespace's budget has room for it now (%d of %d per cent of a GPU used, the pod is worth %d): deleted and re-created (e.g. by its controller), it would run within budget.",
			used.Value(), hard.Value(), share)
	}
	return fmt.Sprintf("Its namespace's budget has no room for it now (%d of %d per cent of a GPU used, the pod is worth %d).", used.Value(), hard.Value(), share)
}
