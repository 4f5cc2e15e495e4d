// Command schedbench measures scheduling throughput of kubegpu-scheduler
// against the stock kube-scheduler on the same simulated cluster: a real
// etcd and kube-apiserver on loopback, NODES Node objects of 8 GPUs each
// published as kubegpu-crishim publishes them, and PODS whole-GPU pods
// (1, 2 or 4 GPUs) that both schedulers can place. For each scheduler the
// pods are created first, the scheduler is started, and pods/s is measured
// from the first binding to the last; then the scheduler's live heap is
// read. It prints a table, the ratio and the heap per node beyond the
// stock scheduler's.
//
//	go run ./test/schedbench --bin-dir _output/bin --plugin-dir _output/plugins --nodes 1000
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/crishim/advertiser"
	"github.com/kubegpu/kubegpu/internal/keyfiles"
	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/plugins/simgpu"
)

type options struct {
	binDir, pluginDir, preset string
	nodes, pods, rounds       int
	adversarial               int
	keep                      bool
}

func main() {
	var o options
	flag.StringVar(&o.binDir, "bin-dir", "_output/bin", "directory with kube-apiserver, kube-scheduler and kubegpu-scheduler")
	flag.StringVar(&o.pluginDir, "plugin-dir", "_output/plugins", "directory with simgpu.so")
	flag.StringVar(&o.preset, "preset", "dgx1", "simgpu preset of every node")
	flag.IntVar(&o.nodes, "nodes", 1000, "number of nodes")
	flag.IntVar(&o.pods, "pods", 0, "number of pods per run (default: enough for 70% of the GPUs, so that every pod fits)")
	flag.IntVar(&o.rounds, "rounds", 2, "runs per scheduler, alternating")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory and logs")
	flag.IntVar(&o.adversarial, "adversarial-pods", 0, "instead of throughput, measure kubegpu-scheduler's heap across creating and deleting this many adversarial pods")
	flag.Parse()
	if o.pods == 0 {
		// The pods ask for 2 GPUs on average.
		o.pods = o.nodes * 8 * 7 / 10 / 2
	}
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "schedbench:", err)
		os.Exit(1)
	}
}

type result struct {
	scheduler string
	round     int
	bound     int
	elapsed   time.Duration
	// CPU time of the scheduler and of kube-apiserver during the run.
	schedCPU, apiCPU time.Duration
	// heapMiB is the scheduler's live heap (after a forced GC) once the
	// pods are bound: every node and pod in its caches.
	heapMiB float64
}

func run(ctx context.Context, o options) error {
	dir, err := os.MkdirTemp("", "kubegpu-schedbench-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Fprintln(os.Stderr, "schedbench: work directory", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	c, err := localcluster.Start(ctx, localcluster.Options{Dir: dir, APIServer: filepath.Join(o.binDir, "kube-apiserver")})
	if err != nil {
		return err
	}
	defer c.Stop()
	keyFile, _, err := keyfiles.WriteEd25519(dir)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "schedbench: creating %d %s nodes\n", o.nodes, o.preset)
	names, err := createNodes(ctx, c, o)
	if err != nil {
		return err
	}
	// The nodes' Leases are renewed every 10 s throughout, as kubelets
	// renew them: kubegpu-scheduler counts a node live only while it sees
	// renewals, and both schedulers run under the same API load.
	renewCtx, stopRenewing := context.WithCancel(ctx)
	defer stopRenewing()
	go c.RenewLeases(renewCtx, names)
	if o.adversarial > 0 {
		return runMemory(ctx, c, o, dir, keyFile)
	}
	var results []result
	for round := 1; round <= o.rounds; round++ {
		for _, sched := range []string{"kube-scheduler", "kubegpu-scheduler"} {
			fmt.Fprintf(os.Stderr, "schedbench: round %d, %s, %d pods\n", round, sched, o.pods)
			r, err := runOnce(ctx, c, o, dir, keyFile, sched)
			if err != nil {
				return fmt.Errorf("%s: %w", sched, err)
			}
			r.round = round
			results = append(results, r)
		}
	}
	report(o, results)
	return nil
}

// createNodes makes the nodes: cpu, memory and pods for the stock plugins,
// nvidia.com/gpu = 8 so that the stock scheduler counts whole GPUs, and the
// inventory annotation and Lease that kubegpu-scheduler reads. There is no
// controller-manager: nothing marks these nodes without kubelets
// unreachable.
func createNodes(ctx context.Context, c *localcluster.Cluster, o options) ([]string, error) {
	topo, err := simgpu.Preset(o.preset)
	if err != nil {
		return nil, err
	}
	names := make([]string, o.nodes)
	nodes := make([]localcluster.DeviceNode, o.nodes)
	for i := range nodes {
		names[i] = fmt.Sprintf("node-%04d", i)
		inv := simgpu.Inventory(topo, names[i])
		nodes[i] = localcluster.DeviceNode{Name: names[i], Host: localcluster.NodeCapacity("96", "768Gi", 110),
			Inventory: inv, Capacity: advertiser.Capacity(inv, o.slicesPerGPU())}
	}
	return names, c.AddDeviceNodes(ctx, nodes)
}

func (o options) slicesPerGPU() int {
	if o.adversarial > 0 {
		return 100
	}
	return 1
}

func pod(i int) *corev1.Pod {
	gpus := []int64{1, 1, 2, 4}[i%4]
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%05d", i)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox",
			Resources: corev1.ResourceRequirements{
				Limits:   corev1.ResourceList{kubeinterface.ResourceGPU: *resource.NewQuantity(gpus, resource.DecimalSI)},
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("1Gi")},
			}}}},
	}
}

func runOnce(ctx context.Context, c *localcluster.Cluster, o options, dir, keyFile, sched string) (result, error) {
	ns := fmt.Sprintf("bench-%s-%d", sched, time.Now().UnixNano())
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		return result{}, err
	}
	defer func() {
		_ = c.Client.CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
		_ = c.Client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
		_ = wait.PollUntilContextTimeout(context.Background(), time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1})
			return err == nil && len(l.Items) == 0, nil
		})
	}()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	var createErr error
	var mu sync.Mutex
	for i := 0; i < o.pods; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod(i), metav1.CreateOptions{}); err != nil {
				mu.Lock()
				createErr = err
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	if createErr != nil {
		return result{}, createErr
	}

	// Record when each pod is first seen bound.
	var (
		mu2         sync.Mutex
		boundAt     = map[string]time.Time{}
		first, last time.Time
	)
	factory := informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{UpdateFunc: func(_, obj any) {
		pd, ok := obj.(*corev1.Pod)
		if !ok || pd.Spec.NodeName == "" {
			return
		}
		now := time.Now()
		mu2.Lock()
		defer mu2.Unlock()
		if _, seen := boundAt[pd.Name]; seen {
			return
		}
		boundAt[pd.Name] = now
		if first.IsZero() {
			first = now
		}
		last = now
	}}); err != nil {
		return result{}, err
	}
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	factory.WaitForCacheSync(stop)

	apiStart, err := c.APIServer().CPUTime()
	if err != nil {
		return result{}, err
	}
	p, err := startScheduler(ctx, c, o, dir, keyFile, sched)
	if err != nil {
		return result{}, err
	}
	defer func() { _ = p.Stop() }()

	// Done when every pod is bound, or when none was bound for 20 s.
	lastCount, lastChange := 0, time.Now()
	for {
		time.Sleep(200 * time.Millisecond)
		mu2.Lock()
		n, elapsed := len(boundAt), last.Sub(first)
		mu2.Unlock()
		if n != lastCount {
			lastCount, lastChange = n, time.Now()
		}
		if n == o.pods || time.Since(lastChange) > 20*time.Second {
			if p.Exited() {
				return result{}, fmt.Errorf("%s exited; see %s", sched, p.Log)
			}
			schedCPU, err1 := p.CPUTime()
			apiEnd, err2 := c.APIServer().CPUTime()
			heap, err3 := schedulerHeap(ctx, schedulerPort, "")
			if err := errors.Join(err1, err2, err3); err != nil {
				return result{}, err
			}
			return result{scheduler: sched, bound: n, elapsed: elapsed, schedCPU: schedCPU, apiCPU: apiEnd - apiStart, heapMiB: heap}, nil
		}
	}
}

func startScheduler(ctx context.Context, c *localcluster.Cluster, o options, dir, keyFile, sched string) (*localcluster.Process, error) {
	// Both with client QPS 5000 and no leader election; kubegpu-scheduler
	// with the shipped configuration, the stock scheduler with defaults.
	config := fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %s
  qps: 5000
  burst: 5000
leaderElection:
  leaderElect: false
`, c.Kubeconfig)
	if sched == "kubegpu-scheduler" {
		var err error
		config, err = c.ShippedSchedulerConfig("kube-scheduler/config/kubegpu-scheduler.yaml", c.Kubeconfig, mustAbs(o.pluginDir), keyFile, 5000, "heartbeatStaleness: 1h")
		if err != nil {
			return nil, err
		}
	}
	s, err := c.StartScheduler(ctx, filepath.Join(o.binDir, sched), config, sched, "--v=1",
		"--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics,/debug/pprof/*")
	if err != nil {
		return nil, err
	}
	schedulerPort = s.Port
	if os.Getenv("SCHEDBENCH_PROFILE") != "" {
		go profile(dir, sched, s.Port, os.Getenv("SCHEDBENCH_PROFILE"))
	}
	return s.Process, nil
}

// profile saves a CPU profile of the scheduler to dir/NAME.pprof.
func profile(dir, sched string, port int, seconds string) {
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // loopback, self-signed
	resp, err := client.Get(fmt.Sprintf("https://127.0.0.1:%d/debug/pprof/profile?seconds=%s", port, seconds))
	if err != nil {
		fmt.Fprintln(os.Stderr, "schedbench: profile:", err)
		return
	}
	defer resp.Body.Close()
	f, err := os.Create(filepath.Join(dir, sched+".pprof"))
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.ReadFrom(resp.Body)
}

func mustAbs(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

func report(o options, results []result) {
	fmt.Printf("Scheduling throughput: %d nodes (%s, 8 GPUs), %d pods of 1, 1, 2, 4 GPUs each, first to last binding\n\n", o.nodes, o.preset, o.pods)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scheduler\tround\tbound\tseconds\tpods/s\tscheduler CPU ms/pod\tapiserver CPU ms/pod\theap MiB\t")
	sums, heaps := map[string]float64{}, map[string]float64{}
	for _, r := range results {
		rate := float64(r.bound-1) / r.elapsed.Seconds()
		sums[r.scheduler] += rate
		heaps[r.scheduler] += r.heapMiB
		perPod := func(d time.Duration) float64 { return float64(d.Milliseconds()) / float64(r.bound) }
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t%.1f\t%.2f\t%.2f\t%.1f\t\n", r.scheduler, r.round, r.bound, r.elapsed.Seconds(), rate, perPod(r.schedCPU), perPod(r.apiCPU), r.heapMiB)
	}
	tw.Flush()
	rounds := float64(o.rounds)
	stock, ours := sums["kube-scheduler"]/rounds, sums["kubegpu-scheduler"]/rounds
	fmt.Printf("\nmean pods/s: kube-scheduler %.1f, kubegpu-scheduler %.1f, ratio %.2fx\n", stock, ours, ours/stock)
	stockHeap, ourHeap := heaps["kube-scheduler"]/rounds, heaps["kubegpu-scheduler"]/rounds
	fmt.Printf("mean heap with %d nodes and %d pods: kube-scheduler %.1f MiB, kubegpu-scheduler %.1f MiB, %.1f KiB more per node\n",
		o.nodes, o.pods, stockHeap, ourHeap, (ourHeap-stockHeap)*1024/float64(o.nodes))
}
