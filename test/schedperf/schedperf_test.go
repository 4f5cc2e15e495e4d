//go:build schedperf

// Package schedperf runs kubegpu-scheduler's plugin in upstream's
// scheduler_perf harness (k8s.io/kubernetes/test/integration/scheduler_perf:
// an in-process API server on etcd, fake nodes, SchedulingThroughput),
// registered out of tree, beside the stock plugin set on the same
// workloads: DGX-1 nodes (8 GPUs, with their inventory, capacity and
// Leases renewed: see publish for the capacity each scheduler sees), and
// pods of one whole GPU, of 4 GPUs that need an NVLink quad, of 25% GPU
// slices, and without GPUs; and upstream's DRA test cases at 500 nodes,
// with ResourceClaims of kubegpu's devices (claims_test.go).
//
//	make bench-schedperf                      # 5,000 nodes
//	make bench-schedperf SCHEDPERF_BENCH='.*/500Nodes' SCHEDPERF_FILTER=short
//	make bench-schedperf-duet                 # side by side, half the CPUs each
//
// It builds only with the tag schedperf, so that `go test ./...` does not
// compile the in-process API server for a benchmark it would skip.
//
// It needs etcd on PATH and KUBEGPU_PLUGIN_DIR (the device modules of the
// same build); without them it skips. KUBEGPU_SCHEDPERF_PROFILE_DIR names a
// directory for a CPU profile of each workload; KUBEGPU_SCHEDPERF_STOCK_FIRST=1
// runs the stock plugins before kubegpu's on each workload (make
// bench-schedperf alternates the order between rounds);
// KUBEGPU_SCHEDPERF_GPU_METRICS=PerGPU gives kubegpu-scheduler its default
// per-GPU metrics instead of PerModel, and KUBEGPU_SCHEDPERF_NODE_POLICY
// another nodePolicy than the default kubegpu,
// KUBEGPU_SCHEDPERF_PODS_WITHOUT_DEVICES=Ignore podsWithoutDevices: Ignore;
// KUBEGPU_SCHEDPERF_STOCK_BINPACK=1 adds the stock plugins set to bin-pack
// GPUs (see writeConfig), and KUBEGPU_SCHEDPERF_CONTROL=1 the stock plugins
// once more as Control_* (for hack/schedperf-duet.sh). Each test case
// prints to stderr what it cost (see processState), which
// hack/schedperf-summary.sh tabulates. The
// Benchmark lines carry each histogram once, whatever its labels; the data
// items that -data-items-dir writes keep every label combination.
package schedperf

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubegpu/kubegpu/kube-scheduler/apis/config"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/kubernetes/pkg/scheduler"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	perf "k8s.io/kubernetes/test/integration/scheduler_perf"
	"k8s.io/kubernetes/test/utils/client-go/ktesting"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/crishim/advertiser"
	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/internal/keyfiles"
	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/kube-scheduler/plugin"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/plugins/simgpu"
)

func TestMain(m *testing.M) {
	if err := perf.InitTests(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// workloads are the pods measured, by their template, and how many at 500
// and at 5,000 nodes: upstream's SchedulingBasic sizes (500 nodes: 500
// pods, then 1,000 measured; 5,000 nodes: 1,000, then 10,000 measured),
// except for 4-GPU pods, which get at most 90% of the nodes' NVLink quads.
var workloads = []struct {
	name, template string
	small, large   [2]int // initPods, measurePods
}{
	{"WholeGPU", "pod-gpu-1.yaml", [2]int{500, 1000}, [2]int{1000, 10000}},
	{"Topology4GPU", "pod-gpu-4-topology.yaml", [2]int{200, 700}, [2]int{1000, 8000}},
	{"Slices", "pod-gpu-slice.yaml", [2]int{500, 1000}, [2]int{1000, 10000}},
	{"NoGPU", "pod-cpu.yaml", [2]int{500, 1000}, [2]int{1000, 10000}},
}

func BenchmarkPerfScheduling(b *testing.B) {
	pluginDir := os.Getenv("KUBEGPU_PLUGIN_DIR")
	if pluginDir == "" {
		b.Skip("needs KUBEGPU_PLUGIN_DIR with the device modules of this build (make bench-schedperf)")
	}
	dir := b.TempDir()
	keyFile, _, err := keyfiles.WriteEd25519(dir)
	if err != nil {
		b.Fatal(err)
	}
	config, err := writeConfig(dir, pluginDir, keyFile)
	if err != nil {
		b.Fatal(err)
	}
	var r renewer
	perf.RunBenchmarkPerfScheduling(b, config, "kubegpu", frameworkruntime.Registry{plugin.Name: plugin.NewFactory().New, plugin.FacadeName: plugin.NewFacade},
		perf.WithNodeUpdateFn(r.publish), perf.WithPreRunFn(r.start))
}

// writeConfig writes the harness's configuration: per workload a test case
// with kubegpu-scheduler's profile and one with the stock scheduler's (and
// one with the stock scheduler bin-packing, on request). Test cases of the
// stock plugins are named Stock* or Control_*: see stockCase.
func writeConfig(dir, pluginDir, keyFile string) (string, error) {
	templates, err := filepath.Abs("templates")
	if err != nil {
		return "", err
	}
	pluginDir, err = filepath.Abs(pluginDir)
	if err != nil {
		return "", err
	}
	schedConfig := filepath.Join(dir, "kubegpu-scheduler.yaml")
	// The shipped profile (kube-scheduler/config/kubegpu-scheduler.yaml):
	// KubeGPU at weight 10, filtering after the filters that read only the
	// node object, binding first; the stock DynamicResources plugin behind
	// DynamicResourcesFacade. heartbeatStaleness of an hour:
	// the Leases are renewed every 30 s, which is slower than kubelets'.
	// gpuMetrics PerModel unless KUBEGPU_SCHEDPERF_GPU_METRICS says
	// PerGPU: the harness gathers the scheduler's whole registry every
	// second to count scheduling attempts, and with PerGPU that gather
	// carries 200,000 per-GPU series at 5,000 nodes, which Prometheus
	// would scrape every 15 to 60 s, not every second.
	gpuMetrics, err := envChoice("KUBEGPU_SCHEDPERF_GPU_METRICS", config.GPUMetricsPerModel, config.GPUMetricsPerGPU)
	if err != nil {
		return "", err
	}
	// nodePolicy kubegpu (the shipped default) unless
	// KUBEGPU_SCHEDPERF_NODE_POLICY says otherwise: the kubegpu policy
	// places each pod where it fragments the least, and among equal nodes
	// fills one node after another; spread shows the plugin's cost under
	// another placement (the summary's nodes evaluated per pod say how
	// many full nodes each scheduler's Filter passed over).
	nodePolicy, err := envChoice("KUBEGPU_SCHEDPERF_NODE_POLICY", devicescheduler.PolicyKubegpu, devicescheduler.Policies()...)
	if err != nil {
		return "", err
	}
	// podsWithoutDevices Score (the shipped default) unless
	// KUBEGPU_SCHEDPERF_PODS_WITHOUT_DEVICES says Ignore: with Ignore a
	// pod without devices skips the plugin, and what it still costs is
	// the plugin's mere presence (informers, device cache, memory).
	withoutDevices, err := envChoice("KUBEGPU_SCHEDPERF_PODS_WITHOUT_DEVICES", config.PodsWithoutDevicesScore, config.PodsWithoutDevicesIgnore)
	if err != nil {
		return "", err
	}
	// For hack/schedperf-summary.sh.
	fmt.Printf("# kubegpu-scheduler gpuMetrics: %s\n", gpuMetrics)
	fmt.Printf("# kubegpu-scheduler nodePolicy: %s\n", nodePolicy)
	fmt.Printf("# kubegpu-scheduler podsWithoutDevices: %s\n", withoutDevices)
	if err := os.WriteFile(schedConfig, fmt.Appendf(nil, `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
  plugins:
    multiPoint:
      enabled:
      - name: KubeGPU
        weight: 10
      - name: DynamicResourcesFacade
        weight: 2
      disabled:
      - name: DynamicResources
    filter:
      enabled:
      - name: NodeName
      - name: NodeUnschedulable
      - name: TaintToleration
      - name: NodeAffinity
      - name: KubeGPU
    bind:
      enabled:
      - name: KubeGPU
  pluginConfig:
  - name: KubeGPU
    args:
      pluginDir: %s
      signingKeyFile: %s
      heartbeatStaleness: 1h
      gpuMetrics: %s
      nodePolicy: %s
      podsWithoutDevices: %s
`, pluginDir, keyFile, gpuMetrics, nodePolicy, withoutDevices), 0o600); err != nil {
		return "", err
	}
	// KUBEGPU_SCHEDPERF_STOCK_BINPACK=1 adds the stock plugins set to bin-pack
	// (NodeResourcesFit's MostAllocated, GPUs weighing most), as clusters
	// that want whole nodes free for large jobs run them: packing leaves
	// full nodes that every later cycle's Filter passes over, whoever packs.
	binpackConfig := filepath.Join(dir, "stock-binpack.yaml")
	var b strings.Builder
	order := []string{"KubeGPU", "Stock"}
	if os.Getenv("KUBEGPU_SCHEDPERF_STOCK_FIRST") == "1" {
		order = []string{"Stock", "KubeGPU"}
	}
	if os.Getenv("KUBEGPU_SCHEDPERF_STOCK_BINPACK") == "1" {
		if err := os.WriteFile(binpackConfig, []byte(stockBinpack), 0o600); err != nil {
			return "", err
		}
		order = append(order, "StockBinpack")
	}
	// KUBEGPU_SCHEDPERF_CONTROL=1 adds the stock plugins once more, as
	// Control: a duet of Control and Stock (hack/schedperf-duet.sh -a
	// Control) measures how far two runs of the same scheduler differ.
	if os.Getenv("KUBEGPU_SCHEDPERF_CONTROL") == "1" {
		order = append(order, "Control")
	}
	header := func(sched, name string) {
		fmt.Fprintf(&b, "- name: %s_%s\n", sched, name)
		switch sched {
		case "KubeGPU":
			fmt.Fprintf(&b, "  schedulerConfigPath: %s\n", schedConfig)
		case "StockBinpack":
			fmt.Fprintf(&b, "  schedulerConfigPath: %s\n", binpackConfig)
		}
		// The histograms reported beside throughput: the harness
		// gathers the whole registry once per histogram and label
		// combination after each workload, and its default list
		// (every plugin at every extension point, some 200) takes
		// minutes at 5,000 nodes with kubegpu-scheduler's per-GPU
		// series in the registry. Outside the measured window either
		// way, the same for both schedulers.
		b.WriteString(metricsConfig)
	}
	for _, w := range workloads {
		for _, sched := range order {
			header(sched, w.name)
			fmt.Fprintf(&b, `  defaultPodTemplatePath: %[1]s/%[2]s
  workloadTemplate:
  - opcode: createNodes
    countParam: $nodes
    nodeTemplatePath: %[1]s/node.yaml
  - opcode: createPods
    countParam: $initPods
  - opcode: createPods
    countParam: $measurePods
    collectMetrics: true
  workloads:
  - name: 500Nodes
    labels: [performance, short]
    params: {nodes: 500, initPods: %[3]d, measurePods: %[4]d}
  - name: 5000Nodes
    labels: [performance]
    params: {nodes: 5000, initPods: %[5]d, measurePods: %[6]d}
`, templates, w.template, w.small[0], w.small[1], w.large[0], w.large[1])
		}
	}
	for _, w := range claimWorkloads {
		for _, sched := range order {
			header(sched, w.name)
			if err := writeClaimCase(&b, templates, sched != "KubeGPU", w.body); err != nil {
				return "", err
			}
		}
	}
	path := filepath.Join(dir, "performance-config.yaml")
	return path, os.WriteFile(path, []byte(b.String()), 0o600)
}

// envChoice is the environment variable name's value, def where unset,
// which must be def or one of others.
func envChoice(name, def string, others ...string) (string, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	if v != def && !slices.Contains(others, v) {
		want := append([]string{def}, slices.DeleteFunc(slices.Clone(others), func(o string) bool { return o == def })...)
		return "", fmt.Errorf("%s=%q: want one of %v", name, v, want)
	}
	return v, nil
}

// stockBinpack is the stock plugin set bin-packing GPUs (see writeConfig).
const stockBinpack = `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
        resources:
        - {name: cpu, weight: 1}
        - {name: memory, weight: 1}
        - {name: nvidia.com/gpu, weight: 10}
        - {name: kubegpu.io/gpu-cores, weight: 10}
`

// metricsConfig is each test case's metricsCollectorConfig: the
// scheduling attempt's, the algorithm's and the pod's scheduling latency,
// every plugin's time at each extension point, and the KubeGPU and
// NodeResourcesFit plugins' own.
const metricsConfig = `  metricsCollectorConfig:
    metrics:
      scheduler_scheduling_attempt_duration_seconds:
      - label: result
        values: [scheduled]
      scheduler_pod_scheduling_sli_duration_seconds:
      scheduler_scheduling_algorithm_duration_seconds:
      scheduler_framework_extension_point_duration_seconds:
      - label: extension_point
        values: [PreFilter, Filter, PreScore, Score, Reserve, Permit, PreBind, Bind]
      scheduler_plugin_execution_duration_seconds:
      - label: plugin
        values: [KubeGPU, NodeResourcesFit, DynamicResources, DynamicResourcesFacade]
      - label: extension_point
        values: [PreFilter, Filter, PreScore, Score, Reserve, Bind]
`

// renewer publishes the nodes' devices as kubegpu-crishim does, and renews
// their Leases every 30 s while a workload runs.
type renewer struct {
	mu     sync.Mutex
	client kubernetes.Interface
	nodes  []string
}

// publish is the harness's node hook: a DGX-1's inventory and capacity and
// a Lease for every new node. For kubegpu-scheduler the capacity is what
// kubegpu-crishim publishes (nvidia.com/gpu: 100 slices per GPU, so that
// slices pass the kubelet's admission); for the stock scheduler it is what
// the NVIDIA device plugin advertises, nvidia.com/gpu: 8, the GPUs it
// counts. With 800 the stock scheduler would never find a node full, and
// would pass over none of the nodes that kubegpu-scheduler, which counts
// each GPU, finds full. The stock nodes keep the inventory annotation and
// kubegpu's other resources, unread by the stock plugins; a slice pod
// (nvidia.com/gpu: 1, kubegpu.io/gpu-cores: 25) takes one of a stock node's
// 8 GPUs, as it would without GPU sharing. Spreading, the stock scheduler
// fills no node in any workload here but the 4-GPU one. In the claim test
// cases (claimWorkloads) the GPUs are published as ResourceSlices too.
func (r *renewer) publish(tCtx ktesting.TContext, _ *scheduler.Scheduler, _ *perf.Workload, nodes *corev1.NodeList) error {
	topo, err := simgpu.Preset("dgx1")
	if err != nil {
		return err
	}
	slicesPerGPU := 100
	if stockCase(tCtx.Name()) {
		slicesPerGPU = 1
	}
	claims := claimCase(tCtx.Name())
	client := tCtx.Client()
	ac, err := advertiser.NewClient(tCtx.RESTConfig())
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Namespaces().Create(tCtx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kubeinterface.LeaseNamespace}}, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
		return err
	}
	r.mu.Lock()
	r.client = client
	r.mu.Unlock()
	var wg sync.WaitGroup
	errs := make(chan error, len(nodes.Items))
	sem := make(chan struct{}, 32)
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if _, ok := n.Annotations[kubeinterface.AnnotationInventory]; ok {
			continue
		}
		r.mu.Lock()
		r.nodes = append(r.nodes, n.Name)
		r.mu.Unlock()
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			inv := simgpu.Inventory(topo, n.Name)
			if err := advertiser.PublishInventory(tCtx, ac, n.Name, inv, advertiser.Capacity(inv, slicesPerGPU)); err != nil {
				errs <- err
				return
			}
			if claims {
				if err := localcluster.PublishSlices(tCtx, client, n.Name, inv); err != nil {
					errs <- err
					return
				}
			}
			now := metav1.NewMicroTime(time.Now())
			_, err := client.CoordinationV1().Leases(kubeinterface.LeaseNamespace).Create(tCtx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: n.Name, Namespace: kubeinterface.LeaseNamespace},
				Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(n.Name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
			}, metav1.CreateOptions{})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// stockCase reports whether the test case named name (the benchmark's
// sub-test, e.g. BenchmarkPerfScheduling/Stock_WholeGPU/5000Nodes) runs the
// stock plugins (Stock*, and Control, the stock plugins again).
func stockCase(name string) bool {
	_, rest, _ := strings.Cut(name, "/")
	return strings.HasPrefix(rest, "Stock") || strings.HasPrefix(rest, "Control_")
}

// start is the harness's pre-run hook: Leases are renewed every 30 s
// until the workload ends.
func (r *renewer) start(tCtx ktesting.TContext, _ *perf.Workload) (func(), error) {
	stopProfile, err := profile(tCtx)
	if err != nil {
		return nil, err
	}
	before := snapshot()
	fmt.Fprintf(os.Stderr, "%s: before: %s\n", tCtx.Name(), before)
	ctx, cancel := context.WithCancel(tCtx)
	go func() {
		tick := time.NewTicker(30 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			r.mu.Lock()
			client, nodes := r.client, append([]string(nil), r.nodes...)
			r.mu.Unlock()
			if client == nil {
				continue
			}
			for _, name := range nodes {
				patch := fmt.Appendf(nil, `{"spec":{"renewTime":%q}}`, metav1.NewMicroTime(time.Now()).Format(metav1.RFC3339Micro))
				_, _ = client.CoordinationV1().Leases(kubeinterface.LeaseNamespace).Patch(ctx, name, ktypes.MergePatchType, patch, metav1.PatchOptions{})
			}
		}
	}()
	return func() {
		stopProfile()
		after := snapshot()
		fmt.Fprintf(os.Stderr, "%s: after: %s; this case: %s\n", tCtx.Name(), after, after.since(before))
		cancel()
		r.mu.Lock()
		r.client, r.nodes = nil, nil
		r.mu.Unlock()
	}, nil
}
