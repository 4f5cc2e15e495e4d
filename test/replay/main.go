// Command replay replays a GPU cluster trace (the openb format of
// kubegpu-sim) through the real kubegpu-scheduler and compares the result
// with the simulator's for the same experiment.
//
// It starts etcd and kube-apiserver on loopback, publishes the trace's GPU
// nodes as kubegpu-crishim publishes them (inventory, capacity, a Lease
// renewed every 10 s; host CPU and memory from the trace), and starts
// kubegpu-scheduler with the shipped configuration
// (kube-scheduler/config/kubegpu-scheduler.yaml). Then it creates the
// experiment's pods (the simulator's order for the seed, inflated to 130%
// of the GPU capacity) one at a time, each waiting for its outcome, bound
// or unschedulable, before the next, as the simulator assumes; an
// unschedulable pod is deleted. It reports, as kubegpu-sim does, the
// allocated GPU share when 100% of the capacity had arrived and the
// unallocated share at 130%, beside the simulator's kubegpu-online policy
// (the engine learning the mix online, as the scheduler does) on the same
// experiment, and the stock kube-scheduler on the same nodes and pods, with
// GPUs as users give them to it today: an extended resource counted per
// node (alibabacloud.com/gpu-milli, 1000 per GPU, as the trace's own
// tooling names it; a pod asks num_gpu × gpu_milli) and the model as a
// node label (nvidia.com/gpu.product, as GPU feature discovery sets it)
// that pods with a gpu_spec select. The stock scheduler checks only the
// node's total, so its figures count placements no single GPU could hold:
// they are an upper bound. With -schedulers kubegpu-claims,stock-claims
// the same pods ask for their GPUs as ResourceClaims instead (the nodes'
// GPUs published as ResourceSlices of gpu.kubegpu.io; whole GPUs by count,
// slices as the capacity request cores, models as a CEL selector),
// allocated once by kubegpu-scheduler (DeviceClass gpu.kubegpu.io) and
// once by the stock kube-scheduler's DynamicResources plugin (a class over
// the same devices): both check each GPU, so their figures compare.
//
//	go run ./test/replay --bin-dir _output/bin --plugin-dir _output/plugins --openb ../shared/data/openb
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/crishim/advertiser"
	"github.com/kubegpu/kubegpu/device-scheduler/sim"
	"github.com/kubegpu/kubegpu/internal/keyfiles"
	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/internal/tracegpus"
)

type options struct {
	binDir, pluginDir, nodes, pods string
	seed                           int64
	inflate                        float64
	// percentage overrides the configuration's percentageOfNodesToScore
	// (0: the shipped configuration's).
	percentage int
	// schedulers to replay: kubegpu, stock.
	schedulers []string
	keep       bool
	out        io.Writer
}

func main() {
	var o options
	openb := flag.String("openb", "../shared/data/openb", "directory of the openb trace")
	flag.StringVar(&o.binDir, "bin-dir", "_output/bin", "directory with kube-apiserver and kubegpu-scheduler")
	flag.StringVar(&o.pluginDir, "plugin-dir", "_output/plugins", "directory with the device modules")
	flag.StringVar(&o.nodes, "nodes", "", "node list (default: OPENB/openb_node_list_gpu_node.csv)")
	flag.StringVar(&o.pods, "pods", "openb_pod_list_default.csv", "pod list, in OPENB unless a path")
	flag.Int64Var(&o.seed, "seed", 1, "the experiment's seed (the simulator's --seeds start at 1)")
	flag.Float64Var(&o.inflate, "inflate", 1.3, "pods arrive until their GPU request passes this × the capacity")
	flag.IntVar(&o.percentage, "percentage-of-nodes-to-score", 0, "override the configuration's percentageOfNodesToScore (0: as shipped)")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory and logs")
	schedulers := flag.String("schedulers", "kubegpu,stock", "schedulers to replay: kubegpu (kubegpu-scheduler), stock (kube-scheduler, GPUs as node totals), kubegpu-claims and stock-claims (the same, pods with ResourceClaims)")
	flag.Parse()
	o.schedulers = strings.Split(*schedulers, ",")
	if o.nodes == "" {
		o.nodes = filepath.Join(*openb, "openb_node_list_gpu_node.csv")
	}
	if !strings.Contains(o.pods, "/") {
		o.pods = filepath.Join(*openb, o.pods)
	}
	o.out = os.Stdout
	if _, err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "replay:", err)
		os.Exit(1)
	}
}

// result is one replay's figures.
type result struct {
	name                string
	allocAt100, unalloc float64
	placed, failed      int
	elapsed             time.Duration
	perPod              time.Duration
}

func summarize(name string, x *sim.Experiment, r sim.Run, elapsed time.Duration) result {
	a := min(130, len(r.Curve)-1)
	res := result{name: name, allocAt100: r.AllocAt(100), unalloc: 100 - r.AllocAt(a), placed: r.Placed, failed: r.Failed, elapsed: elapsed}
	if n := len(x.Pods); n > 0 {
		res.perPod = elapsed / time.Duration(n)
	}
	return res
}

func run(ctx context.Context, o options) ([]result, error) {
	nodes, err := sim.ReadNodes(o.nodes)
	if err != nil {
		return nil, err
	}
	pods, err := sim.ReadPods(o.pods)
	if err != nil {
		return nil, err
	}
	x, err := sim.NewExperiment(nodes, pods, o.seed, o.inflate)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "replay: %d GPU nodes (%d GPUs), %d pods, seed %d\n", len(x.Nodes), x.TotalGPUs, len(x.Pods), o.seed)

	// The simulator on the same experiment.
	start := time.Now()
	plugins, err := tracegpus.Plugins()
	if err != nil {
		return nil, err
	}
	s, err := sim.NewScheduler(x, sim.PolicyKubegpuOnline, sim.Devices{Plugins: plugins, Inventory: tracegpus.Inventory})
	if err != nil {
		return nil, err
	}
	simulated := summarize("kubegpu-sim ("+sim.PolicyKubegpuOnline+")", x, sim.Replay(x, sim.PolicyKubegpuOnline, s, nil), time.Since(start))

	dir, err := os.MkdirTemp("", "kubegpu-replay-")
	if err != nil {
		return nil, err
	}
	if o.keep {
		fmt.Fprintln(os.Stderr, "replay: work directory", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	c, err := localcluster.Start(ctx, localcluster.Options{Dir: dir, APIServer: filepath.Join(o.binDir, "kube-apiserver")})
	if err != nil {
		return nil, err
	}
	defer c.Stop()
	var rps []replayer
	withClaims := false
	for _, name := range o.schedulers {
		rp, ok := replayers[name]
		if !ok {
			return nil, fmt.Errorf("unknown scheduler %q (kubegpu, stock, kubegpu-claims, stock-claims)", name)
		}
		rps = append(rps, rp)
		withClaims = withClaims || rp.mode.claims()
	}
	names, err := publishNodes(ctx, c, x, withClaims)
	if err != nil {
		return nil, err
	}
	if withClaims {
		if err := createClasses(ctx, c); err != nil {
			return nil, err
		}
	}
	renewCtx, stopRenewing := context.WithCancel(ctx)
	defer stopRenewing()
	go c.RenewLeases(renewCtx, names)
	keyFile, _, err := keyfiles.WriteEd25519(dir)
	if err != nil {
		return nil, err
	}
	cs, err := newClusterScheduler(ctx, c.Client)
	if err != nil {
		return nil, err
	}
	defer cs.stop()
	var results []result
	for _, rp := range rps {
		r, err := replayWith(ctx, c, o, x, cs, rp, keyFile)
		if err == nil {
			fmt.Fprintf(os.Stderr, "replay: %s: allocated %.2f%% at 100%% arrived, unallocated %.2f%% at 130%%, %d placed, %d failed, %s\n",
				r.name, r.allocAt100, r.unalloc, r.placed, r.failed, r.elapsed.Round(time.Second))
		}
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	results = append(results, simulated)
	report(o.out, x, results)
	return results, nil
}

// replayWith replays x with rp's scheduler (kubegpu-scheduler with the
// shipped configuration, or kube-scheduler with its defaults) on the
// cluster's nodes, its pods asking for GPUs in rp's mode, then deletes the
// pods and claims.
func replayWith(ctx context.Context, c *localcluster.Cluster, o options, x *sim.Experiment, cs *clusterScheduler, rp replayer, keyFile string) (result, error) {
	binary := rp.binary
	config := fmt.Sprintf("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nclientConnection:\n  kubeconfig: %s\n  qps: 5000\n  burst: 5000\nleaderElection:\n  leaderElect: false\n", c.Kubeconfig)
	cs.mode = rp.mode
	if binary == "kubegpu-scheduler" {
		var err error
		config, err = c.ShippedSchedulerConfig(filepath.Join(repoRoot(), "kube-scheduler/config/kubegpu-scheduler.yaml"), c.Kubeconfig, mustAbs(o.pluginDir), keyFile, 5000)
		if err != nil {
			return result{}, err
		}
	}
	if o.percentage > 0 {
		config += fmt.Sprintf("percentageOfNodesToScore: %d\n", o.percentage)
	}
	sched, err := c.StartScheduler(ctx, filepath.Join(o.binDir, binary), config, binary, "--v=1")
	if err != nil {
		return result{}, err
	}
	defer func() { _ = sched.Stop() }()
	fmt.Fprintf(os.Stderr, "replay: %s\n", rp.name)
	// kubegpu-scheduler holds GPU pods until it has seen the nodes renew
	// their Leases (at most heartbeatStaleness/4 + 2 s): wait for a pod
	// that fits anywhere to be bound, then take it away.
	if err := cs.warmUp(ctx); err != nil {
		return result{}, fmt.Errorf("%s: %w (log: %s)", rp.name, err, sched.Log)
	}
	start := time.Now()
	done := 0
	run := sim.Replay(x, rp.name, cs, func() {
		if done++; done%1000 == 0 {
			fmt.Fprintf(os.Stderr, "replay: %s %d/%d pods\n", rp.name, done, len(x.Pods))
		}
	})
	if cs.err != nil {
		return result{}, fmt.Errorf("%s: %w (log: %s)", rp.name, cs.err, sched.Log)
	}
	r := summarize(rp.name, x, run, time.Since(start))
	if err := cs.clear(ctx); err != nil {
		return result{}, err
	}
	return r, cs.clearClaims(ctx)
}

// repoRoot is the checkout: this command runs from it (go run ./test/replay)
// or from test/replay (go test).
func repoRoot() string {
	if _, err := os.Stat("kube-scheduler/config"); err == nil {
		return "."
	}
	return "../.."
}

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		panic(err)
	}
	return a
}

func report(w io.Writer, x *sim.Experiment, results []result) {
	fmt.Fprintf(w, "Replay of %d pods on %d GPU nodes (%d GPUs), seed %d:\n\n", len(x.Pods), len(x.Nodes), x.TotalGPUs, x.Seed)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scheduler\tallocated GPU % at 100% arrived\tunallocated GPU % at 130%\tplaced\tfailed\ttime\tper pod\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%d\t%d\t%s\t%s\t\n", r.name, r.allocAt100, r.unalloc, r.placed, r.failed,
			r.elapsed.Round(time.Second), r.perPod.Round(10*time.Microsecond))
	}
	_ = tw.Flush()
	sim := results[len(results)-1]
	for _, r := range results[:len(results)-1] {
		fmt.Fprintf(w, "\n%s strands %+.2f points of the GPUs at 130%% against the simulator.", r.name, r.unalloc-sim.unalloc)
	}
	byName := map[string]result{}
	for _, r := range results {
		byName[r.name] = r
	}
	annotations, ok1 := byName[replayers["kubegpu"].name]
	claims, ok2 := byName[replayers["kubegpu-claims"].name]
	if ok1 && ok2 {
		fmt.Fprintf(w, "\nWith ResourceClaims kubegpu-scheduler strands %+.2f points against its own resources.", claims.unalloc-annotations.unalloc)
	}
	fmt.Fprintln(w)
}

// nodeLabel marks the replay's nodes; its pods select them.
const nodeLabel = "kubegpu.io/replay"

// publishNodes registers the experiment's nodes as kubegpu-crishim would
// publish them (the trace's CPU and memory, its GPUs as a simulated
// inventory of its model, a Lease, and, with slices, ResourceSlices), with
// the stock scheduler's extended resource and model label beside.
func publishNodes(ctx context.Context, c *localcluster.Cluster, x *sim.Experiment, slices bool) ([]string, error) {
	names := make([]string, len(x.Nodes))
	nodes := make([]localcluster.DeviceNode, len(x.Nodes))
	for i, spec := range x.Nodes {
		inv := tracegpus.Inventory(spec.Name, spec.Model, spec.GPUs)
		capacity := advertiser.Capacity(inv, 100)
		capacity[stockGPUMilli] = *resource.NewQuantity(int64(spec.GPUs)*1000, resource.DecimalSI)
		names[i] = spec.Name
		nodes[i] = localcluster.DeviceNode{
			Name: spec.Name,
			Host: corev1.ResourceList{
				corev1.ResourceCPU:    *resource.NewMilliQuantity(spec.CPUMilli, resource.DecimalSI),
				corev1.ResourceMemory: *resource.NewQuantity(spec.MemoryMiB<<20, resource.BinarySI),
				corev1.ResourcePods:   *resource.NewQuantity(1000, resource.DecimalSI),
			},
			Labels:    map[string]string{nodeLabel: "true", stockModel: spec.Model},
			Inventory: inv, Capacity: capacity, ResourceSlices: slices,
		}
	}
	return names, c.AddDeviceNodes(ctx, nodes)
}

// clusterScheduler is sim.Scheduler through the API server: Schedule
// creates the pod and waits for its outcome.
type clusterScheduler struct {
	ctx    context.Context
	client kubernetes.Interface
	stopCh chan struct{}

	// mode is how pods ask for GPUs.
	mode mode

	mu      sync.Mutex
	waiting map[string]chan bool
	// err is the first failure to create or follow a pod; the replay's
	// figures are void then.
	err error
}

const namespace = "default"

func newClusterScheduler(ctx context.Context, client kubernetes.Interface) (*clusterScheduler, error) {
	cs := &clusterScheduler{ctx: ctx, client: client, stopCh: make(chan struct{}), waiting: map[string]chan bool{}}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace))
	inf := factory.Core().V1().Pods().Informer()
	handle := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		outcome, known := podOutcome(p)
		if !known {
			return
		}
		cs.mu.Lock()
		ch := cs.waiting[p.Name]
		delete(cs.waiting, p.Name)
		cs.mu.Unlock()
		if ch != nil {
			ch <- outcome
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: handle, UpdateFunc: func(_, obj any) { handle(obj) },
	}); err != nil {
		return nil, err
	}
	factory.Start(cs.stopCh)
	factory.WaitForCacheSync(cs.stopCh)
	return cs, nil
}

func (cs *clusterScheduler) stop() { close(cs.stopCh) }

// podOutcome says whether the scheduler has decided about p, and how.
func podOutcome(p *corev1.Pod) (bound, known bool) {
	if p.Spec.NodeName != "" {
		return true, true
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			// The scheduler saw the pod before its claim, created just
			// before it: it tries again once it sees the claim.
			if len(p.Spec.ResourceClaims) > 0 && strings.Contains(c.Message, "not found") {
				return false, false
			}
			return false, true
		}
	}
	return false, false
}

// Schedule creates p's pod and waits for its outcome; an unschedulable pod
// is deleted, as the simulator drops it.
func (cs *clusterScheduler) Schedule(p *sim.PodSpec) bool {
	if cs.err != nil {
		return false
	}
	bound, err := cs.place(podOf(p, cs.mode))
	if err != nil {
		cs.err = fmt.Errorf("pod %s: %w", p.Name, err)
	}
	return bound
}

// place creates claim (if any) and pod and waits for the pod's outcome;
// an unschedulable pod is deleted with its claim.
func (cs *clusterScheduler) place(pod *corev1.Pod, claim *resourceapi.ResourceClaim) (bool, error) {
	ch := make(chan bool, 1)
	cs.mu.Lock()
	cs.waiting[pod.Name] = ch
	cs.mu.Unlock()
	if claim != nil {
		if _, err := cs.client.ResourceV1().ResourceClaims(namespace).Create(cs.ctx, claim, metav1.CreateOptions{}); err != nil {
			return false, err
		}
	}
	if _, err := cs.client.CoreV1().Pods(namespace).Create(cs.ctx, pod, metav1.CreateOptions{}); err != nil {
		return false, err
	}
	select {
	case bound := <-ch:
		if !bound {
			if err := cs.client.CoreV1().Pods(namespace).Delete(cs.ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
				return false, err
			}
			if claim != nil {
				if err := cs.client.ResourceV1().ResourceClaims(namespace).Delete(cs.ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
					return false, err
				}
			}
		}
		return bound, nil
	case <-time.After(time.Minute):
		return false, errors.New("no outcome within a minute")
	}
}

// warmUp waits until the scheduler binds a probe pod (one GPU slice of 1%,
// which fits on any GPU node), then deletes it.
func (cs *clusterScheduler) warmUp(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for i := 0; time.Now().Before(deadline); i++ {
		probe, claim := podOf(&sim.PodSpec{Name: fmt.Sprintf("warm-up-%d", i), NumGPU: 1, GPUMilli: 10}, cs.mode)
		bound, err := cs.place(probe, claim)
		if err != nil {
			return err
		}
		if bound {
			if err := cs.client.CoreV1().Pods(namespace).Delete(ctx, probe.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
				return err
			}
			return cs.clearClaims(ctx)
		}
		time.Sleep(time.Second)
	}
	return errors.New("the scheduler placed no probe pod within 2 minutes")
}
