package app

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kubegpu/kubegpu/cli/ui"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// uiNode is what the page shows of a node.
type uiNode struct {
	Name string `json:"name"`
	// Problem is why the node takes no GPU pods as far as its objects
	// say (no usable inventory, not Ready), or empty.
	Problem string       `json:"problem,omitempty"`
	GPUs    []GPU        `json:"gpus"`
	Links   []types.Link `json:"links,omitempty"`
	// OtherPods counts the node's bound pods that hold no kubegpu GPU.
	OtherPods int `json:"otherPods"`
}

// uiSummary is the rest of the page: totals, pending GPU pods, quotas and
// what could not be read.
type uiSummary struct {
	Scope string `json:"scope"`
	// Explain says whether the page may ask why a pod waits.
	Explain bool `json:"explain"`
	// Totals counts the GPUs of the nodes that take GPU pods.
	Totals  kubeinterface.Capacity `json:"totals"`
	Pending []uiPending            `json:"pending"`
	Quotas  []uiQuota              `json:"quotas"`
	Notes   []string               `json:"notes,omitempty"`
}

// uiPending is a GPU pod not bound yet.
type uiPending struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	Asks      string    `json:"asks"`
	Created   time.Time `json:"created"`
	// Nominated is the node preemption nominated it to, if any; Message
	// what the scheduler's last attempt said.
	Nominated string `json:"nominated,omitempty"`
	Message   string `json:"message,omitempty"`
}

// uiQuota is a ResourceQuota that caps a kubegpu resource.
type uiQuota struct {
	Namespace string            `json:"namespace"`
	Name      string            `json:"name"`
	Resources []uiQuotaResource `json:"resources"`
}

type uiQuotaResource struct {
	Name string `json:"name"`
	Used string `json:"used"`
	Hard string `json:"hard"`
}

// maxPending bounds the pending pods the page lists (the oldest first);
// the count of the others is a note.
const maxPending = 500

// uiView builds the page's view of the cluster: s, the pending pods among
// pods and the quotas.
func uiView(s *clusterState, pods []*corev1.Pod, quotas []*corev1.ResourceQuota) ui.View {
	rows := gpus(s)
	markDRA(s, rows)
	sum := uiSummary{Scope: "cluster", Explain: true, Pending: []uiPending{}, Quotas: []uiQuota{}}
	byNode := map[string][]GPU{}
	parents := map[[2]string]bool{} // GPUs in MIG mode: their instances count
	for _, g := range rows {
		if g.Parent != "" {
			parents[[2]string{g.Node, g.Parent}] = true
		}
	}
	for _, g := range rows {
		node := g.Node
		g.Node = ""
		byNode[node] = append(byNode[node], g)
	}
	v := ui.View{}
	for _, n := range s.nodes {
		un := uiNode{Name: n.name, GPUs: byNode[n.name], OtherPods: len(s.withoutDevices[n.name])}
		if un.GPUs == nil {
			un.GPUs = []GPU{}
		}
		switch {
		case !n.hasInventory():
			un.Problem = n.invErr.Error()
		default:
			un.Links = n.inv.Links
			if un.Problem = notReady(n.node); un.Problem != "" {
				break
			}
			sum.Totals.Nodes++
			for _, g := range un.GPUs {
				if !parents[[2]string{n.name, g.ID}] {
					sum.Totals.Add(g.Model, g.Resource, kubeinterface.GPUUse{Healthy: g.Health == string(types.Healthy),
						Used: len(g.Pods) > 0, Exclusive: g.Exclusive, FreeMiB: g.MemoryMiB - g.UsedMiB, FreeMilli: 1000 - 10*int64(g.UsedCores)})
				}
			}
		}
		v.Nodes = append(v.Nodes, ui.NamedNode{Name: n.name, Data: un})
	}
	sum.Totals.Bound()
	var more int
	sum.Pending, more = pendingPods(pods)
	if more > 0 {
		sum.Notes = append(sum.Notes, fmt.Sprintf("Only the %d oldest pending GPU pods are listed, of %d.", maxPending, maxPending+more))
	}
	sum.Quotas = gpuQuotas(quotas)
	if s.draUnread != "" {
		sum.Notes = append(sum.Notes, s.draUnread)
	}
	if len(s.unverified) > 0 {
		sum.Notes = append(sum.Notes, fmt.Sprintf("%d bound GPU pod(s) whose allocation does not verify hold no GPUs (kubegpu gpus lists them).", len(s.unverified)))
	}
	if s.unverifiedClaims > 0 {
		sum.Notes = append(sum.Notes, fmt.Sprintf("%d allocated ResourceClaim(s) whose signed allocation does not verify hold no GPUs.", s.unverifiedClaims))
	}
	v.Summary = sum
	return v
}

// notReady says why the node is not Ready, or is empty.
func notReady(n *corev1.Node) string {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			msg := []rune(c.Message)
			if len(msg) > 256 {
				msg = append(msg[:256], '…')
			}
			return strings.TrimSpace(fmt.Sprintf("not Ready (%s) %s", c.Reason, string(msg)))
		}
	}
	return ""
}

// pendingPods lists the GPU pods of pods that wait for a node, oldest
// first, at most maxPending, and counts the others.
func pendingPods(pods []*corev1.Pod) ([]uiPending, int) {
	var waiting []*corev1.Pod
	for _, p := range pods {
		if p.Spec.NodeName != "" || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if objects.WantsDevices(p) || len(p.Spec.ResourceClaims) > 0 {
			waiting = append(waiting, p)
		}
	}
	slices.SortFunc(waiting, func(a, b *corev1.Pod) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	out := []uiPending{}
	for _, p := range waiting[:min(len(waiting), maxPending)] {
		out = append(out, uiPending{Namespace: p.Namespace, Name: p.Name, Asks: asks(p), Created: p.CreationTimestamp.Time,
			Nominated: p.Status.NominatedNodeName, Message: schedulerSays(p)})
	}
	return out, len(waiting) - len(out)
}

// asks sums what the pod's containers ask of kubegpu's resources, as
// "nvidia.com/gpu: 2", and names its ResourceClaims.
func asks(p *corev1.Pod) string {
	totals := map[corev1.ResourceName]int64{}
	for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range list {
			for _, name := range objects.RequestResources {
				q, ok := list[i].Resources.Limits[name]
				if !ok {
					q = list[i].Resources.Requests[name]
				}
				totals[name] += q.Value()
			}
		}
	}
	var parts []string
	for _, name := range objects.RequestResources {
		if totals[name] != 0 {
			parts = append(parts, fmt.Sprintf("%s: %d", name, totals[name]))
		}
	}
	if n := len(p.Spec.ResourceClaims); n > 0 {
		parts = append(parts, fmt.Sprintf("%d ResourceClaim(s)", n))
	}
	return strings.Join(parts, ", ")
}

// gpuQuotas are the quotas that cap one of kubegpu's resources (or
// kubegpu's DeviceClass's devices), by namespace and name.
func gpuQuotas(quotas []*corev1.ResourceQuota) []uiQuota {
	out := []uiQuota{}
	for _, q := range quotas {
		var res []uiQuotaResource
		for name, hard := range q.Status.Hard {
			if !gpuResource(string(name)) {
				continue
			}
			used := q.Status.Used[name]
			res = append(res, uiQuotaResource{Name: string(name), Used: quantityText(used), Hard: quantityText(hard)})
		}
		if len(res) == 0 {
			continue
		}
		slices.SortFunc(res, func(a, b uiQuotaResource) int { return cmp.Compare(a.Name, b.Name) })
		out = append(out, uiQuota{Namespace: q.Namespace, Name: q.Name, Resources: res})
	}
	slices.SortFunc(out, func(a, b uiQuota) int { return cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name) })
	return out
}

// gpuResource reports whether a quota's resource name counts kubegpu's
// resources: a device resource, kubegpu.io/*, or kubegpu's DeviceClass.
func gpuResource(name string) bool {
	name = strings.TrimPrefix(strings.TrimPrefix(name, "requests."), "limits.")
	if strings.HasPrefix(name, kubeinterface.Domain) || strings.Contains(name, ".deviceclass.resource.k8s.io/") && strings.HasPrefix(name, "gpu.kubegpu.io") {
		return true
	}
	return slices.Contains(types.DeviceResources(), name)
}

// quantityText is q as a whole number where it is one ("4000", not "4k"),
// else as Kubernetes writes it.
func quantityText(q resource.Quantity) string {
	if v, ok := q.AsInt64(); ok {
		return strconv.FormatInt(v, 10)
	}
	return q.String()
}
