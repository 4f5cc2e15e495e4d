package app

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kube-scheduler/plugin"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/plugins/amd"
	"github.com/kubegpu/kubegpu/plugins/intel"
	"github.com/kubegpu/kubegpu/plugins/nvidia"
	"github.com/kubegpu/kubegpu/plugins/simgpu"
	"github.com/kubegpu/kubegpu/types"
)

type explainOptions struct {
	key             *kubeinterface.KeySet
	namespace       string
	schedulerConfig string
	profile         string
	policy          string
	staleness       time.Duration
	topDevices      int
	// schedulerNames are the profiles of the scheduler's configuration
	// file, when given: the pods it places.
	schedulerNames []string
	// list reads the cluster (default: listFromAPI).
	list func(context.Context) (*listed, error)
}

func newExplainCommand(client func() (kubernetes.Interface, error), namespace func() string, key func() (*kubeinterface.KeySet, error)) *cobra.Command {
	o := explainOptions{}
	cmd := &cobra.Command{
		Use:   "explain POD",
		Short: "Explain, per node, why a pod's GPUs fit there or not",
		Long: `explain evaluates the pod's GPU request on every node with the allocation
engine kubegpu-scheduler uses, against the devices the pods on each node hold
now, and prints per node whether it fits, its rank, the devices it would get
and, where it does not fit, why.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			if o.namespace == "" {
				o.namespace = namespace()
			}
			if o.key, err = key(); err != nil {
				return err
			}
			return o.run(cmd, c, args[0])
		},
	}
	cmd.Flags().StringVar(&o.schedulerConfig, "scheduler-config", "", "kubegpu-scheduler's KubeSchedulerConfiguration file: judge with its KubeGPU args (policies, default topology, heartbeatStaleness, learned mix); default: the plugin's defaults")
	cmd.Flags().StringVar(&o.profile, "profile", "", "with --scheduler-config, the profile (schedulerName) whose KubeGPU args to use; default: the first that has them")
	cmd.Flags().StringVar(&o.policy, "policy", "", "node policy to rank with, overriding the configuration's nodePolicy: "+strings.Join(devicescheduler.Policies(), ", "))
	cmd.Flags().DurationVar(&o.staleness, "heartbeat-staleness", 0, "age of a node's last Lease renewal beyond which it gets no new pods, overriding the configuration's heartbeatStaleness; judged here by the node's clock")
	cmd.Flags().IntVar(&o.topDevices, "top", 3, "show the devices the pod would get on this many best nodes")
	return cmd
}

// explainRow is one node's verdict.
type explainRow struct {
	node    string
	fits    bool
	score   int64
	devices string
	// reason is why not, in full; status is the scheduler's Filter
	// status message for it (constant per reason).
	reason, status string
	// dra is set where DRA, not kubegpu, serves the pod (reason says
	// why): the scheduler passes the node to the DynamicResources plugin.
	dra bool
	// refusal is the cache's refusal, where the devices do not fit.
	refusal error
}

func (o *explainOptions) run(cmd *cobra.Command, c kubernetes.Interface, name string) error {
	e, err := o.explain(cmd.Context(), c, o.namespace, name)
	if err != nil {
		return err
	}
	return e.print(cmd.OutOrStdout())
}

// explanation is what explain says of a pod: lines about the pod and its
// request, then, where it was judged on the nodes, one row per node.
type explanation struct {
	lines []string
	rows  []explainRow
	top   int
}

func (e *explanation) sayf(format string, args ...any) {
	e.lines = append(e.lines, strings.TrimSuffix(fmt.Sprintf(format, args...), "\n"))
}

func (e *explanation) say(line string) { e.lines = append(e.lines, line) }

// print writes the explanation as `kubegpu explain` prints it.
func (e *explanation) print(w io.Writer) error {
	for _, l := range e.lines {
		if _, err := fmt.Fprintln(w, l); err != nil {
			return err
		}
	}
	if e.rows == nil {
		return nil
	}
	fmt.Fprintln(w)
	return printExplain(w, e.rows, e.top)
}

// explain judges pod ns/name as the scheduler would, now.
func (o *explainOptions) explain(ctx context.Context, c kubernetes.Interface, ns, name string) (*explanation, error) {
	e := &explanation{top: o.topDevices}
	pod, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", ns, name, err)
	}
	pc, err := loadPodClaims(ctx, c, pod)
	if err != nil {
		msg, err := claimError(err)
		if err != nil {
			return nil, err
		}
		e.sayf("Pod %s/%s waits for its ResourceClaims:\n  %s\n", ns, name, msg)
		return e, nil
	}
	if pc == nil && !objects.WantsDevices(pod) {
		e.sayf("Pod %s/%s asks for no GPUs: kubegpu-scheduler prefers nodes without GPUs for it, then GPU nodes\n"+
			"by its node policy (podsWithoutDevices: Score), or leaves it to the other scorers (Ignore).\n", ns, name)
		return e, nil
	}
	args, err := o.args()
	if err != nil {
		return nil, err
	}
	engine, err := newEngine(ctx, args)
	if err != nil {
		return nil, err
	}
	policy, policyNote := enforcementPolicy(ctx, c, ns, args.Enforcement)
	if policy == "" {
		e.sayf("Pod %s/%s cannot be scheduled until its namespace's label is fixed:\n  %s\n", ns, name, policyNote)
		return e, nil
	}
	cpu, mem := objects.HostRequest(pod)
	r, req, others, err := pc.compile(engine, pod, devicescheduler.Host{CPUMilli: cpu, MemoryMiB: mem}, policy)
	if err != nil {
		e.sayf("Pod %s/%s cannot be scheduled until its request is fixed:\n  %v\n", ns, name, sanitize(err.Error()))
		return e, nil
	}
	list := o.list
	if list == nil {
		list = func(ctx context.Context) (*listed, error) { return listFromAPI(ctx, c) }
	}
	l, err := list(ctx)
	if err != nil {
		return nil, err
	}
	s := l.state(verifier(o.key))
	e.sayf("Pod %s/%s asks for:\n", ns, name)
	for _, ct := range r.Containers {
		e.sayf("  %s\n", describeContainer(ct))
	}
	if slices.ContainsFunc(r.Containers, func(c devicescheduler.Container) bool { return !c.Exclusive }) {
		e.say(policyNote)
		if pod.Spec.NodeName != "" {
			e.say(enforcementNote(pod))
		}
	}
	if pod.Spec.NodeName != "" {
		if h, err := objects.HeldAllocation(pod, verifier(o.key)); err == nil {
			e.sayf("It is bound to %s with devices %s.\n", pod.Spec.NodeName, sanitize(allocationDevices(h.PodAllocation)))
			if h.AnnotationDiffers {
				e.sayf("Its %s annotation was changed after binding: the scheduler counts the devices above (its record in the pod's status); containers started from now on get what the annotation says, or no GPUs.\n", kubeinterface.AnnotationAllocation)
			}
		} else {
			e.sayf("It is bound to %s without a usable allocation (%s): it runs with no GPUs.\n", pod.Spec.NodeName, sanitize(err.Error()))
		}
	}
	if borrowing(pod) {
		e.sayf("It borrows: it runs at PriorityClass %s (it was over its namespace's GPU budget, ResourceQuota %s, when created, or asked for the class), gets only GPUs no pod within a budget uses, preempts nothing, and is among the first evicted when a pod that may preempt needs its GPUs.\n",
			kubeinterface.PriorityClassBorrowed, kubeinterface.BudgetQuota)
		e.say(budgetNote(ctx, c, pod))
	}
	if pod.Spec.NodeName == "" && pod.Status.NominatedNodeName != "" {
		e.say(nominationNote(s, pod))
	}
	if g := pod.Spec.SchedulingGroup; pod.Spec.NodeName == "" && g != nil && g.PodGroupName != nil {
		e.sayf("It belongs to the pod group %s: it is placed together with the rest of its group, all or none, by a scheduler that places pod groups (the nodes below are judged for this pod alone).\n",
			sanitize(*g.PodGroupName))
	}
	if note := pc.note(); note != "" {
		e.say(sanitize(note))
	}
	if note := unknownModels(req, s.nodes); note != "" {
		e.say(note)
	}
	if s.draUnread != "" {
		e.say(sanitize(s.draUnread))
	}
	if msg := schedulerSays(pod); msg != "" {
		e.sayf("The scheduler's last attempt: %s\n", msg)
	}
	var kept []*corev1.Pod
	for _, list := range nominatedBefore(pod, s.nominated, o.schedulerNames) {
		kept = append(kept, list...)
	}
	s.policies = namespacePolicies(ctx, c, kept, args.Enforcement)
	if pc != nil {
		s.pinned = pc.node
	}
	e.rows = o.evaluate(engine, s, r, pod, time.Now(), others...)
	if e.rows == nil {
		e.rows = []explainRow{} // no nodes
	}
	return e, nil
}

// evaluate judges the pod on every node with the scheduler's own device
// cache and decision (package devicecache), fed with what the scheduler's
// informers would hold: the nodes, their Leases and the bound pods. The
// Leases' renewals are taken as seen when they were written (the node's
// clock), since explain sees each once; the scheduler judges by when it
// saw them change.
//
// The workload mix is learned from the bound pods as a scheduler learns it
// when it starts (devicecache.Cache.LearnPods).
func (o *explainOptions) evaluate(engine *devicescheduler.Engine, s *clusterState, r *devicescheduler.Request, self *corev1.Pod, now time.Time, others ...*devicescheduler.Request) []explainRow {
	clock := now
	cfg := devicecache.Config{Engine: engine, Keys: o.key, FormOnly: o.key == nil, Staleness: o.staleness, Now: func() time.Time { return clock },
		ListPods: func() ([]*corev1.Pod, error) { return s.bound, nil }}
	if o.key != nil && len(o.key.IDs()) == 1 {
		// The key the scheduler signs with: nodes whose shims refuse it
		// are refused as the scheduler refuses them.
		cfg.SigningKey = o.key.IDs()[0]
	}
	c := devicecache.New(cfg)
	logger := logr.Discard() // the cache's complaints are the rows' reasons
	for _, n := range s.nodes {
		c.UpdateNode(logger, n.node)
	}
	for _, sl := range s.slices {
		c.UpdateResourceSlice(logger, sl)
	}
	for _, dc := range s.classes {
		c.UpdateDeviceClass(dc)
	}
	for _, rc := range s.claims {
		c.UpdateClaim(logger, rc)
	}
	for i := range s.leases {
		l := &s.leases[i]
		switch {
		case l.Spec.RenewTime != nil:
			clock = l.Spec.RenewTime.Time
		case l.Spec.AcquireTime != nil:
			clock = l.Spec.AcquireTime.Time
		default:
			clock = now // never renewed: live for heartbeatStaleness from when first seen, as the scheduler counts it
		}
		// A year-old renewal is stale whatever the limit; older ones
		// would overflow the cache's durations.
		if floor := now.AddDate(-1, 0, 0); clock.Before(floor) {
			clock = floor
		}
		c.UpdateLease(l, false)
	}
	clock = now
	for _, p := range s.bound {
		if p.UID != self.UID {
			c.UpdatePod(logger, p)
		}
	}
	c.LearnPods(logger)
	ins := make([]devicecache.Input, 0, 1+len(others))
	for _, r := range append([]*devicescheduler.Request{r}, others...) {
		ins = append(ins, c.InputOnce(r))
		c.ForPod(&ins[len(ins)-1], self)
	}
	nominated := nominatedBefore(self, s.nominated, o.schedulerNames)
	affinity := nodeaffinity.GetRequiredNodeAffinity(self)
	var rows []explainRow
	for _, n := range s.nodes {
		row := explainRow{node: n.name}
		if self.Spec.NodeName == "" {
			row.reason = nodeExcludes(affinity, self, n.node)
		}
		if row.reason == "" && s.pinned != "" && s.pinned != n.name {
			row.reason = "the pod's ResourceClaims are allocated on node " + sanitize(s.pinned)
		}
		if row.reason == "" && o.key != nil && cfg.SigningKey == "" && n.hasInventory() && !acceptsAnyKey(n.inv, o.key.IDs()) {
			// Several keys given (a rotation): which one the scheduler
			// signs with is not known here.
			row.reason = "the node's kubegpu-crishim accepts none of the keys given with --allocation-key: its pods' containers would be refused their GPUs"
		}
		if row.reason == "" {
			row = decideVariants(c, ins, n.node, s.requestedBytes[n.name], self, nominees(c, engine, s.policies, n.name, nominated[n.name]))
		}
		rows = append(rows, row)
	}
	sortRows(rows)
	return rows
}

// sortRows puts fitting nodes first, best first; then the others by name.
func sortRows(rows []explainRow) {
	slices.SortStableFunc(rows, func(a, b explainRow) int {
		switch {
		case a.fits != b.fits:
			if a.fits {
				return -1
			}
			return 1
		case a.fits && a.score != b.score:
			if a.score > b.score {
				return -1
			}
			return 1
		}
		return strings.Compare(a.node, b.node)
	})
}

// decide is the scheduler's decision on node for the input's request:
// fits, score and the devices the pod would get, or why not. Host
// resources are counted as the scheduler counts them: allocatable less what
// the node's bound pods ask for (the pod itself left out where it is
// bound). With pods nominated to the node, the scheduler's framework
// filters the node twice, as decide does: first with their CPU, memory and
// devices counted (their devices placed before the pod's), then without;
// the pod fits only if both pass, and the second pass scores.
func decide(c *devicecache.Cache, in *devicecache.Input, node *corev1.Node, requested [2]int64, self *corev1.Pod, nominated []nominee) explainRow {
	if self.Spec.NodeName == node.Name {
		cpu, mem := objects.HostRequestBytes(self)
		requested[0] -= cpu
		requested[1] -= mem
	}
	a := node.Status.Allocatable
	var pl devicescheduler.Placement
	if len(nominated) > 0 {
		o := &devicecache.Overlay{}
		with := requested
		for _, n := range nominated {
			with[0] += n.cpuMilli
			with[1] += n.memBytes
			if n.added != nil {
				o.Added = append(o.Added, *n.added)
			}
		}
		capacity, free := devicecache.NodeHost(a.Cpu().MilliValue(), a.Memory().Value(), with[0], with[1])
		if _, err := c.EvaluateWith(node, o, in, corev1helpers.PodPriority(self), capacity, free, &pl); err != nil {
			if row, ok := draRow(node, err); ok {
				return row
			}
			refusal := devicecache.Classify(err)
			row := explainRow{node: node.Name, reason: refusal.Detail(), status: refusal.Message, refusal: err}
			capacity, free = devicecache.NodeHost(a.Cpu().MilliValue(), a.Memory().Value(), requested[0], requested[1])
			if _, err := c.Evaluate(node, in, capacity, free, &pl); err == nil {
				row.reason += nominatedSuffix(nominated) // they alone keep the pod out
			}
			return row
		}
	}
	capacity, free := devicecache.NodeHost(a.Cpu().MilliValue(), a.Memory().Value(), requested[0], requested[1])
	score, err := c.Evaluate(node, in, capacity, free, &pl)
	if row, ok := draRow(node, err); ok {
		return row
	}
	if err != nil {
		refusal := devicecache.Classify(err)
		return explainRow{node: node.Name, reason: refusal.Detail(), status: refusal.Message, refusal: err}
	}
	return explainRow{node: node.Name, fits: true, score: score, devices: allocationDevices(pl.Allocation())}
}

func printExplain(w io.Writer, rows []explainRow, top int) error {
	fits, dra := 0, 0
	for _, r := range rows {
		switch {
		case r.fits:
			fits++
		case r.dra:
			dra++
		}
	}
	fmt.Fprintf(w, "Fits on %d of %d nodes.\n", fits, len(rows))
	if dra > 0 {
		fmt.Fprintf(w, "DRA serves the pod's request on %d more: kubegpu-scheduler ranks them after the nodes it fits on.\n", dra)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tFITS\tRANK\tDEVICES / REASON")
	for i, r := range rows {
		switch {
		case r.fits:
			devices := r.devices
			if i >= top {
				devices = "..."
			}
			fmt.Fprintf(tw, "%s\tyes\t%d\t%s\n", r.node, i+1, sanitize(devices))
		case r.dra:
			fmt.Fprintf(tw, "%s\tDRA\t-\t%s\n", r.node, sanitize(r.reason))
		default:
			fmt.Fprintf(tw, "%s\tno\t-\t%s\n", r.node, sanitize(r.reason))
		}
	}
	return tw.Flush()
}

func describeContainer(c devicescheduler.Container) string {
	kind := "init container"
	if !c.Init {
		kind = "container"
	}
	what := fmt.Sprintf("%d whole GPU(s)", c.Count)
	if !c.Exclusive {
		what = fmt.Sprintf("%d GPU slice(s) of %s compute and %d MiB", c.Count, devicescheduler.Percent(int(c.Milli)), c.MemoryMiB)
	}
	return fmt.Sprintf("%s %q: %s, topology %s", kind, c.Name, what, c.Topology)
}

func allocationDevices(a types.PodAllocation) string {
	var parts []string
	for _, list := range [][]types.ContainerAllocation{a.InitContainers, a.Containers} {
		for _, c := range list {
			var ids []string
			for _, d := range c.Devices {
				id := d.ID
				if !d.Exclusive {
					id += fmt.Sprintf("(%d%%,%dMiB)", d.ComputePercent, d.MemoryMiB)
				}
				ids = append(ids, id)
			}
			parts = append(parts, c.Name+"="+strings.Join(ids, ","))
		}
	}
	return strings.Join(parts, " ")
}

// args are the scheduler plugin's arguments explain judges with: from the
// scheduler's configuration file, or the plugin's defaults, with the flags'
// overrides.
func (o *explainOptions) args() (*plugin.Args, error) {
	args := plugin.DefaultArgs()
	if o.schedulerConfig != "" {
		// kube-scheduler's defaulting logs how it merged the profile's
		// plugins, which says nothing here.
		klog.SetLogger(logr.Discard())
		var err error
		args, o.schedulerNames, err = plugin.ReadSchedulerConfig(o.schedulerConfig, o.profile)
		klog.ClearLogger()
		if err != nil {
			return nil, err
		}
	}
	if o.policy != "" {
		args.NodePolicy = o.policy
	}
	if o.staleness != 0 {
		args.HeartbeatStaleness.Duration = o.staleness
	}
	o.staleness = args.HeartbeatStaleness.Duration
	return args, nil
}

// newEngine builds the engine the scheduler plugin runs with args, over
// the scheduler sides of the device modules kubegpu ships, linked into
// this binary.
func newEngine(ctx context.Context, args *plugin.Args) (*devicescheduler.Engine, error) {
	var plugins []types.SchedulerPlugin
	for _, m := range []types.Module{simgpu.NewModule(), nvidia.NewModule(), amd.NewModule(), intel.NewModule()} {
		sp, err := m.SchedulerPlugin(ctx, types.PluginConfig{})
		if err != nil {
			return nil, fmt.Errorf("device module %s: %w", m.Name(), err)
		}
		plugins = append(plugins, sp)
	}
	return devicescheduler.New(args.EngineConfig(plugins))
}
