package metrics

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
)

// gpuCollector reports, at each scrape (from a computation at most
// GPUScrapeMaxAge old), the devices of the cache: per GPU
// what pods hold of it, per model the idle and the stranded GPUs of live
// nodes, the nodes that are not live, and the pending GPU pods by reason.
// Every replica reports its own cache (they follow the same API objects);
// the pending pods are the ones the replica tried, so the leader's.
type gpuCollector struct {
	k8smetrics.BaseStableCollector
	target atomic.Pointer[collectorTarget]
	models modelLabels
	// mu serialises scrapes, which share the per-GPU series' labels.
	mu     sync.Mutex
	series gpuSeries
	scrape uint64
	// last is the last scrape computed (see GPUScrapeMaxAge).
	last *gpuScrape
}

// collectorTarget is the cache a collector reports and how: perModel is
// gpuMetrics: PerModel, no per-GPU series but the unhealthy GPUs'.
type collectorTarget struct {
	cache    *devicecache.Cache
	pending  *PendingPods
	perModel bool
	// maxAge is how long a computation's values are sent again.
	maxAge time.Duration
}

// maxModels bounds the values of the model label over the scheduler's
// life. Nodes publish their GPUs' model names: a node that republished its
// inventory with ever new names would otherwise add series without end.
const maxModels = 64

// otherModel is the model label of GPUs whose model came after the first
// maxModels.
const otherModel = "other"

// modelLabels hands out model label values: the first maxModels models
// seen keep their names, for as long as the process runs; later ones are
// otherModel.
type modelLabels struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

func (m *modelLabels) label(model string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.seen[model]; ok {
		return model
	}
	if len(m.seen) >= maxModels {
		return otherModel
	}
	if m.seen == nil {
		m.seen = map[string]struct{}{}
	}
	m.seen[model] = struct{}{}
	return model
}

var (
	// The dense per-GPU gauges carry only the node and the device; model
	// and UUID, which a node may change, are on the info series alone.
	gpuLabels          = []string{"node", "device"}
	infoLabels         = []string{"node", "device", "index", "model", "uuid"}
	descAllocatedCores = k8smetrics.NewDesc("kubegpu_scheduler_gpu_allocated_cores_percent",
		"Per cent of the GPU's compute that pods hold (100 when one holds it whole).", gpuLabels, nil, k8smetrics.ALPHA, "")
	descAllocatedMemory = k8smetrics.NewDesc("kubegpu_scheduler_gpu_allocated_memory_bytes",
		"GPU memory that pods hold (all of it when one holds the GPU whole).", gpuLabels, nil, k8smetrics.ALPHA, "")
	descMemory = k8smetrics.NewDesc("kubegpu_scheduler_gpu_memory_bytes",
		"The GPU's memory.", gpuLabels, nil, k8smetrics.ALPHA, "")
	descGPUPods = k8smetrics.NewDesc("kubegpu_scheduler_gpu_pods",
		"Pods holding a share of the GPU.", gpuLabels, nil, k8smetrics.ALPHA, "")
	descInfo = k8smetrics.NewDesc("kubegpu_scheduler_gpu_info",
		"1 for each allocatable GPU (or MIG instance), with its index, model and UUID as its node publishes them (model: the first 64 models the scheduler saw keep their names, later ones are other).", infoLabels, nil, k8smetrics.ALPHA, "")
	descUnhealthy = k8smetrics.NewDesc("kubegpu_scheduler_gpu_unhealthy",
		"1 for each GPU (or MIG instance) its node publishes as not healthy; no series for healthy ones.", infoLabels, nil, k8smetrics.ALPHA, "")
	descGPUs = k8smetrics.NewDesc("kubegpu_scheduler_gpus",
		"Allocatable GPUs (and MIG instances) of live nodes with a usable inventory, by model.", []string{"model"}, nil, k8smetrics.ALPHA, "")
	descAllocatedGPUs = k8smetrics.NewDesc("kubegpu_scheduler_allocated_gpus",
		"GPUs' worth of compute that pods hold on live nodes with a usable inventory, by model (a whole GPU counts 1, a 25% slice 0.25).", []string{"model"}, nil, k8smetrics.ALPHA, "")
	descIdle = k8smetrics.NewDesc("kubegpu_scheduler_idle_gpus",
		"Allocatable GPUs of live nodes that no pod holds any share of, by model.", []string{"model"}, nil, k8smetrics.ALPHA, "")
	descStranded = k8smetrics.NewDesc("kubegpu_scheduler_stranded_gpus",
		"Free GPU share of live nodes, in GPUs, that the learned workload mix cannot use where it lies (fragmentation, the measure the kubegpu policy keeps low), by the nodes' GPU model (mixed for nodes of several).",
		[]string{"model"}, nil, k8smetrics.ALPHA, "")
	descNodes = k8smetrics.NewDesc("kubegpu_scheduler_nodes",
		"Nodes known to the device cache, by the state of their device inventory: ok, invalid, missing (the node's capacity has GPUs but it publishes no inventory), none (no GPUs and no inventory: CPU-only and control-plane nodes).",
		[]string{"inventory"}, nil, k8smetrics.ALPHA, "")
	descNotLive = k8smetrics.NewDesc("kubegpu_scheduler_nodes_not_live",
		"Nodes with a device inventory that get no GPU pods because they are not live: NotReady, or their Lease not seen renewed within heartbeatStaleness.", nil, nil, k8smetrics.ALPHA, "")
	descPending     = k8smetrics.NewDesc("kubegpu_scheduler_pending_gpu_pods", pendingHelp, []string{"reason"}, nil, k8smetrics.ALPHA, "")
	descUnallocated = k8smetrics.NewDesc("kubegpu_scheduler_gpu_pods_without_allocation",
		"Bound GPU pods that have not finished and hold no allocation the scheduler counts: bound by another scheduler "+
			"(a stock kube-scheduler holding the Lease in mode only), created with spec.nodeName, or whose allocation was refused. "+
			"Their containers get no GPUs.", nil, nil, k8smetrics.ALPHA, "")
)

const pendingHelp = "GPU pods this scheduler tried and has not placed, by the reason most nodes gave in the pod's last cycle: " +
	"not_enough_free_gpus, topology, selectors, unhealthy_gpus, host_resources, too_many_shares, unenforced, no_inventory, node_not_live, invalid_request, warming_up, dra, pod_groups_off, device_resource, other (refused by no node for its GPUs)."

var theCollector = &gpuCollector{}

// DescribeWithStability sends the collector's descriptors.
func (g *gpuCollector) DescribeWithStability(ch chan<- *k8smetrics.Desc) {
	for _, d := range []*k8smetrics.Desc{descAllocatedCores, descAllocatedMemory, descMemory, descGPUPods, descInfo, descUnhealthy, descGPUs, descAllocatedGPUs, descIdle, descStranded, descNodes, descNotLive, descPending, descUnallocated} {
		ch <- d
	}
}

// gpuScrape is what one scrape computed, for the scrapes within
// the target's maxAge after it to send again.
type gpuScrape struct {
	target *collectorTarget
	at     time.Time
	// values are the per-GPU series' values, for PerGPU only.
	values                          []gpuValues
	unhealthy                       []gauge
	gpus, allocated, idle, stranded map[string]float64
	states                          [devicecache.NumInventoryStates]int
	notLive                         int
	// unallocated counts the bound GPU pods without allocation; only if
	// listed (the pod lister answered).
	unallocated int
	listed      bool
}

// GPUScrapeMaxAge is how long the scheduler sends a scrape's values again
// rather than compute them afresh: computing walks every node (about 30 ms
// at 5,000 nodes), and some scrapers (several Prometheus replicas,
// benchmark harnesses gathering every second) come more often than the
// values matter. Prometheus scrapes every 15 s or less often in common
// setups (kube-prometheus: every 30 s); below that, with room for the
// jitter of its scrapes, each of them is computed afresh. The pending pods
// are counted afresh at every scrape; those deleted before they were
// placed are dropped at each computation.
const GPUScrapeMaxAge = 10 * time.Second

// CollectWithStability sends the GPU metrics, computed afresh when the last
// computation is older than the target's maxAge (see compute).
func (g *gpuCollector) CollectWithStability(ch chan<- k8smetrics.Metric) {
	t := g.target.Load()
	if t == nil {
		return
	}
	now := t.cache.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if l := g.last; l == nil || l.target != t || now.Sub(l.at) >= t.maxAge || now.Before(l.at) {
		g.last = g.compute(t, now)
	}
	g.send(ch, t, g.last)
}

// compute copies the nodes' device states under the cache's read lock,
// about a kilobyte per node, and computes the metrics after releasing it,
// so that a scrape does not hold up scheduling. Must hold g.mu.
func (g *gpuCollector) compute(t *collectorTarget, now time.Time) *gpuScrape {
	c := t.cache
	out := &gpuScrape{target: t, at: now}
	// The nodes with devices, in place: a view holds a copy of the
	// node's device state, copied once under the cache's lock.
	views := c.Nodes(now, !t.perModel)
	nodes := views[:0]
	for _, v := range views {
		if v.Inventory != devicecache.StateUnbuilt {
			out.states[v.Inventory]++
		}
		if v.Devices != nil {
			nodes = append(nodes, v)
		}
	}

	g.scrape++
	// The nodes' label pairs first, so that the GPUs' places in the
	// series are known when their values are.
	series := make([]*nodeSeries, len(nodes))
	for i := range nodes {
		series[i] = g.series.update(&nodes[i], g.scrape, &g.models)
	}
	g.series.prune(g.scrape)
	if !t.perModel {
		out.values = make([]gpuValues, len(g.series.byDevice))
	}
	out.gpus, out.allocated, out.idle, out.stranded = map[string]float64{}, map[string]float64{}, map[string]float64{}, map[string]float64{}
	for i := range nodes {
		nc, ns := &nodes[i], series[i]
		n, st := nc.Devices, &nc.State
		if !nc.Live {
			out.notLive++
		}
		alloc := n.Allocatable()
		model := ""
		for d := range ns.gpu {
			if alloc&(1<<d) == 0 {
				continue // unhealthy, or a GPU in MIG mode (its instances count)
			}
			devModel := ns.model[d]
			if model == "" {
				model = devModel
			} else if model != devModel {
				model = "mixed"
			}
			memCap := n.MemoryMiB(d) << 20
			cores, mem := float64(1000-st.MilliFree[d])/10, float64(memCap-st.MemFree[d]<<20)
			if st.Exclusive&(1<<d) != 0 {
				cores, mem = 100, float64(memCap)
			}
			if out.values != nil {
				out.values[ns.devicePos[d]] = gpuValues{cores: cores, memory: mem, memoryCap: float64(memCap), pods: float64(nc.Pods[d])}
			}
			if nc.Live {
				out.gpus[devModel]++
				out.allocated[devModel] += cores / 100
				if st.Used&(1<<d) == 0 {
					out.idle[devModel]++
				}
			}
		}
		if model != "" && nc.Live {
			out.stranded[model] += c.Engine().Stranded(n, st)
		}
	}
	out.unhealthy = g.series.unhealthy()
	// One pass over the informer's pods, as for the pending pods: no
	// state kept between computations.
	if pods, err := c.ListPods(); err == nil {
		t.pending.prune(pods)
		out.unallocated, out.listed = c.UnallocatedGPUPods(pods), true
	}
	return out
}

// send sends scrape s of target t; must hold g.mu.
func (g *gpuCollector) send(ch chan<- k8smetrics.Metric, t *collectorTarget, s *gpuScrape) {
	if !t.perModel {
		g.series.send(ch, s.values)
	}
	for i := range s.unhealthy {
		// A gauge of its own per scrape: Write sets its fields, and
		// scrapes overlap.
		u := &s.unhealthy[i]
		ch <- &gauge{desc: u.desc, labels: u.labels, value: u.value}
	}
	if g.target.Load() == nil {
		// The scheduler stopped during the scrape, after its end had
		// cleared the series (RegisterGPU): keep nothing of it.
		g.series, g.last = gpuSeries{}, nil
	}
	for _, m := range sortedKeys(s.gpus) {
		ch <- k8smetrics.NewLazyConstMetric(descGPUs, k8smetrics.GaugeValue, s.gpus[m], m)
		ch <- k8smetrics.NewLazyConstMetric(descAllocatedGPUs, k8smetrics.GaugeValue, s.allocated[m], m)
		ch <- k8smetrics.NewLazyConstMetric(descIdle, k8smetrics.GaugeValue, s.idle[m], m)
	}
	for _, m := range sortedKeys(s.stranded) {
		ch <- k8smetrics.NewLazyConstMetric(descStranded, k8smetrics.GaugeValue, s.stranded[m], m)
	}
	for st, n := range s.states {
		ch <- k8smetrics.NewLazyConstMetric(descNodes, k8smetrics.GaugeValue, float64(n), devicecache.InventoryState(st).String())
	}
	ch <- k8smetrics.NewLazyConstMetric(descNotLive, k8smetrics.GaugeValue, float64(s.notLive))
	if s.listed {
		ch <- k8smetrics.NewLazyConstMetric(descUnallocated, k8smetrics.GaugeValue, float64(s.unallocated))
	}
	for r, n := range t.pending.byReason() {
		ch <- k8smetrics.NewLazyConstMetric(descPending, k8smetrics.GaugeValue, float64(n), devicecache.Reason(r).String())
	}
}

func sortedKeys(m map[string]float64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// allocationToRunning observes, on the scheduler's clock, how long after
// its binding a GPU pod was seen running.
var allocationToRunning = k8smetrics.NewHistogram(&k8smetrics.HistogramOpts{
	Namespace: "kubegpu", Subsystem: "scheduler", Name: "allocation_to_running_seconds",
	Help: "Time from a GPU pod's binding with its allocation (its PodScheduled condition) to when the scheduler saw it running; " +
		"pods bound before the scheduler started are not counted.",
	Buckets:        []float64{0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600},
	StabilityLevel: k8smetrics.ALPHA,
})

var registerCollectorOnce sync.Once

// RegisterGPU makes c the cache the GPU metrics report (the last
// plugin instance made, in a process with several profiles or tests) until
// ctx, the scheduler's, ends: a scheduler that stopped is neither reported
// nor kept alive by the collector. perGPU says whether the per-GPU series
// are sent (gpuMetrics: PerGPU); maxAge how long the values of one
// computation are sent again (GPUScrapeMaxAge; 0 computes every scrape).
// The channel returned is closed once the end of ctx has been handled.
func RegisterGPU(ctx context.Context, c *devicecache.Cache, pending *PendingPods, perGPU bool, maxAge time.Duration) <-chan struct{} {
	registerCollectorOnce.Do(func() {
		legacyregistry.CustomMustRegister(theCollector)
		legacyregistry.MustRegister(allocationToRunning)
	})
	t := &collectorTarget{cache: c, pending: pending, perModel: !perGPU, maxAge: maxAge}
	theCollector.target.Store(t)
	ended := make(chan struct{})
	context.AfterFunc(ctx, func() {
		defer close(ended)
		if theCollector.target.CompareAndSwap(t, nil) {
			// The per-GPU label pairs hold the cache's nodes.
			theCollector.mu.Lock()
			theCollector.series, theCollector.last = gpuSeries{}, nil
			theCollector.mu.Unlock()
		}
	})
	return ended
}

// ObserveRunning records a bound GPU pod's allocation-to-running time
// once, when the cache first sees it running.
func ObserveRunning(c *devicecache.Cache, pod *corev1.Pod) {
	if !c.SeenRunning(pod) {
		return
	}
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionTrue {
			if at := cond.LastTransitionTime.Time; !at.Before(c.Started()) {
				allocationToRunning.Observe(max(0, c.Now().Sub(at)).Seconds())
			}
			return
		}
	}
}
