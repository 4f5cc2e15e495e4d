package app

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubegpu/kubegpu/cli/ui"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// A tenant's view: what the built-in view or edit role in one namespace
// may read (its pods and quotas), and the cluster's GPU capacity in
// aggregate from the ConfigMap kubegpu-scheduler publishes for every
// authenticated user.

// defaultCapacity is where the shipped configurations have the scheduler
// publish the capacity.
const defaultCapacity = "kube-system/" + kubeinterface.CapacityConfigMap

// TenantPod is one GPU pod of the namespace, as `kubegpu pods` lists it.
type TenantPod struct {
	Name  string `json:"name"`
	Node  string `json:"node,omitempty"`
	Phase string `json:"phase"`
	// Allocation is what its verified allocation gives its containers.
	Allocation *types.PodAllocation `json:"allocation,omitempty"`
	// Problem is why its allocation does not verify (it holds no GPUs),
	// Waiting what the scheduler said of it while it waits.
	Problem string `json:"problem,omitempty"`
	Waiting string `json:"waiting,omitempty"`
}

// tenantPods lists the GPU pods of pods that have not finished, by name.
func tenantPods(pods []*corev1.Pod, verify func(kubeinterface.Allocation) error) []TenantPod {
	out := []TenantPod{}
	for _, p := range pods {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed ||
			!objects.WantsDevices(p) && len(p.Spec.ResourceClaims) == 0 {
			continue
		}
		tp := TenantPod{Name: p.Name, Node: p.Spec.NodeName, Phase: string(p.Status.Phase)}
		if p.Spec.NodeName == "" {
			tp.Waiting = schedulerSays(p)
		} else if h, err := objects.HeldAllocation(p, verify); err != nil {
			tp.Problem = sanitize(err.Error())
		} else {
			tp.Allocation = &h.PodAllocation
		}
		out = append(out, tp)
	}
	slices.SortFunc(out, func(a, b TenantPod) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// readCapacity reads the published capacity at ref (NAMESPACE/NAME); when
// it cannot, the capacity is empty and the note says why.
func readCapacity(ctx context.Context, c kubernetes.Interface, ref string) (kubeinterface.Capacity, string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ns, name, _ := strings.Cut(ref, "/")
	cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return kubeinterface.Capacity{}, fmt.Sprintf("The cluster's GPU capacity is not shown: %v (kubegpu-scheduler publishes it where its capacityConfigMap says, readable by every authenticated user with kube-scheduler/deploy/capacity.yaml).", err)
	}
	data, ok := cm.Data[kubeinterface.CapacityKey]
	if !ok {
		return kubeinterface.Capacity{}, fmt.Sprintf("The cluster's GPU capacity is not shown: ConfigMap %s holds none yet (kubegpu-scheduler writes it when its capacityConfigMap names it).", ref)
	}
	capa, err := kubeinterface.DecodeCapacity(data)
	if err != nil {
		return kubeinterface.Capacity{}, fmt.Sprintf("The cluster's GPU capacity is not shown: ConfigMap %s: %v", ref, err)
	}
	if age := time.Since(capa.Updated); age > 2*kubeinterface.CapacityRefresh {
		return capa, fmt.Sprintf("The cluster's GPU capacity is %s old: kubegpu-scheduler has not written it since (is it running?).", age.Round(time.Second))
	}
	return capa, ""
}

func newPodsCommand(client func() (kubernetes.Interface, error), namespace func() string, key func() (*kubeinterface.KeySet, error)) *cobra.Command {
	var output, capacityRef string
	cmd := &cobra.Command{
		Use:   "pods",
		Short: "List a namespace's GPU pods, their GPUs and why they wait, and the cluster's free GPUs (a tenant's view)",
		Long: `pods needs only what the built-in view or edit role of the namespace grants,
and the cluster's GPU capacity that kubegpu-scheduler publishes for every
authenticated user: the namespace's GPU pods with the devices their
allocation names (or why the scheduler has not placed them), then the GPUs
of the whole cluster in aggregate.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "" && output != "json" {
				return fmt.Errorf("--output must be json, got %q", output)
			}
			c, err := client()
			if err != nil {
				return err
			}
			k, err := key()
			if err != nil {
				return err
			}
			ns := namespace()
			list, err := c.CoreV1().Pods(ns).List(cmd.Context(), metav1.ListOptions{})
			if err != nil {
				return fmt.Errorf("list the pods of namespace %s: %w", ns, err)
			}
			pods := make([]*corev1.Pod, len(list.Items))
			for i := range list.Items {
				pods[i] = &list.Items[i]
			}
			rows := tenantPods(pods, verifier(k))
			capa, note := readCapacity(cmd.Context(), c, capacityRef)
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if note != "" {
					fmt.Fprintln(cmd.ErrOrStderr(), note)
				}
				return enc.Encode(struct {
					Pods     []TenantPod            `json:"pods"`
					Capacity kubeinterface.Capacity `json:"capacity"`
				}{rows, capa})
			}
			return printTenant(cmd.OutOrStdout(), ns, rows, capa, note)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: json")
	cmd.Flags().StringVar(&capacityRef, "capacity-configmap", defaultCapacity, "the ConfigMap (NAMESPACE/NAME) kubegpu-scheduler publishes the cluster's GPU capacity in")
	return cmd
}

func printTenant(w io.Writer, ns string, rows []TenantPod, capa kubeinterface.Capacity, note string) error {
	if len(rows) == 0 {
		fmt.Fprintf(w, "No GPU pods in namespace %s.\n", ns)
	} else {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "POD\tNODE\tGPUS\tSTATUS")
		for _, p := range rows {
			node, gpus, status := p.Node, "", p.Phase
			switch {
			case node == "":
				node, gpus, status = "-", "-", "waiting: "+p.Waiting
				if p.Waiting == "" {
					status = "waiting for the scheduler"
				}
			case p.Problem != "":
				gpus = "none: " + p.Problem
			case p.Allocation != nil:
				gpus = allocationDevices(*p.Allocation)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Name, node, sanitize(gpus), status)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	if note != "" {
		_, err := fmt.Fprintln(w, note)
		return err
	}
	t := capa.Total()
	fmt.Fprintf(w, "The cluster: %d GPU nodes, %d GPUs: %d idle, %d full, %d stranded (%d MiB free on them), %d unhealthy.\n",
		capa.Nodes, t.GPUs, t.Idle, t.Full, t.Stranded, t.StrandedMiB, t.Unhealthy)
	for _, m := range capa.Models {
		fmt.Fprintf(w, "  %s (%s): %d of %d idle\n", sanitize(m.Model), sanitize(m.Resource), m.Idle, m.GPUs)
	}
	return nil
}

// tenantView is the page of a tenant: the nodes its pods are on, with the
// GPUs they hold; the cluster's capacity as totals; its pending pods and
// quotas.
func tenantView(ns string, pods []*corev1.Pod, quotas []*corev1.ResourceQuota, capa kubeinterface.Capacity, capaNote string,
	verify func(kubeinterface.Allocation) error) ui.View {
	sum := uiSummary{Scope: "namespace " + ns, Totals: capa, Quotas: gpuQuotas(quotas)}
	byNode := map[string]*uiNode{}
	var order []string
	for _, tp := range tenantPods(pods, verify) {
		if tp.Node == "" {
			continue
		}
		n := byNode[tp.Node]
		if n == nil {
			n = &uiNode{Name: tp.Node, GPUs: []GPU{}}
			byNode[tp.Node] = n
			order = append(order, tp.Node)
		}
		if tp.Problem != "" {
			n.Problem = ns + "/" + tp.Name + " holds no GPUs: " + tp.Problem
		}
		var shares []types.DeviceShare
		if tp.Allocation != nil {
			for _, c := range append(append([]types.ContainerAllocation{}, tp.Allocation.InitContainers...), tp.Allocation.Containers...) {
				shares = append(shares, c.Devices...)
			}
		}
		for _, s := range shares {
			i := slices.IndexFunc(n.GPUs, func(g GPU) bool { return g.ID == s.ID })
			if i < 0 {
				n.GPUs = append(n.GPUs, GPU{ID: s.ID, UUID: s.UUID, Index: indexOf(s.ID), Pods: []string{}})
				i = len(n.GPUs) - 1
			}
			g := &n.GPUs[i]
			if s.Exclusive {
				g.Exclusive, g.MemoryMiB, g.UsedMiB, g.UsedCores = true, s.MemoryMiB, s.MemoryMiB, 100
			} else {
				g.UsedMiB += s.MemoryMiB
				g.UsedCores += s.ComputePercent
			}
			if name := ns + "/" + tp.Name; !slices.Contains(g.Pods, name) {
				g.Pods = append(g.Pods, name)
			}
		}
	}
	for _, p := range pods {
		if n := byNode[p.Spec.NodeName]; n != nil && !objects.WantsDevices(p) && len(p.Spec.ResourceClaims) == 0 {
			n.OtherPods++
		}
	}
	slices.Sort(order)
	v := ui.View{}
	for _, name := range order {
		v.Nodes = append(v.Nodes, ui.NamedNode{Name: name, Data: *byNode[name]})
	}
	var more int
	if sum.Pending, more = pendingPods(pods); more > 0 {
		sum.Notes = append(sum.Notes, fmt.Sprintf("Only the %d oldest pending GPU pods are listed, of %d.", maxPending, maxPending+more))
	}
	sum.Notes = append(sum.Notes, "The namespace's view: the nodes its pods are on and the GPUs they hold; the totals are the whole cluster's, as kubegpu-scheduler publishes them.")
	if capaNote != "" {
		sum.Notes = append(sum.Notes, capaNote)
	}
	v.Summary = sum
	return v
}

// indexOf is the number an ID ends with (gpu3: 3), or -1.
func indexOf(id string) int {
	i := len(id)
	for i > 0 && id[i-1] >= '0' && id[i-1] <= '9' {
		i--
	}
	n, err := strconv.Atoi(id[i:])
	if err != nil {
		return -1
	}
	return n
}
