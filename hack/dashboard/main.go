// Command dashboard writes kubegpu's Grafana dashboard
// (deploy/grafana/kubegpu.json), built with the Grafana Foundation SDK:
//
//	go run . -out ../../deploy/grafana/kubegpu.json
//
// Its test checks that the committed file is what this program builds.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

func main() {
	out := flag.String("out", "", "file to write (default: stdout)")
	flag.Parse()
	b, err := build()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
	if *out == "" {
		_, _ = os.Stdout.Write(b)
		return
	}
	if err := os.WriteFile(*out, b, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
}

// ds is the dashboard's Prometheus, chosen with its variable.
var ds = common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}

func query(expr, legend string) cog.Builder[variants.Dataquery] {
	return prometheus.NewDataqueryBuilder().Expr(expr).LegendFormat(legend)
}

func statPanel(title, desc, expr, unit string) *stat.PanelBuilder {
	return stat.NewPanelBuilder().Title(title).Description(desc).Datasource(ds).Unit(unit).Height(4).Span(6).
		WithTarget(query(expr, title))
}

func series(title, desc, unit string, targets ...cog.Builder[variants.Dataquery]) *timeseries.PanelBuilder {
	p := timeseries.NewPanelBuilder().Title(title).Description(desc).Datasource(ds).Unit(unit).Min(0).Height(8).Span(12)
	for _, t := range targets {
		p.WithTarget(t)
	}
	return p
}

// Every selector names its job (the variables scheduler_job and
// crishim_job, kubegpu-scheduler and kubegpu-crishim by default, as the
// alert rules), so that another scraped pod exporting series of these names
// does not show on the dashboard.
const (
	sched = `job="$scheduler_job"`
	shim  = `job="$crishim_job"`
)

// The scheduler's replicas all report their device cache: take the max.
const (
	gpus      = `sum(max by (model) (kubegpu_scheduler_gpus{` + sched + `}))`
	allocGPUs = `sum(max by (model) (kubegpu_scheduler_allocated_gpus{` + sched + `}))`
	idle      = `sum(max by (model) (kubegpu_scheduler_idle_gpus{` + sched + `}))`
	stranded  = `sum(max by (model) (kubegpu_scheduler_stranded_gpus{` + sched + `}))`
	allocated = `max by (node, device) (kubegpu_scheduler_gpu_allocated_cores_percent{` + sched + `}) / 100`
)

// jobVariable is a text box holding a job's name, value by default.
func jobVariable(name, label, value string) *dashboard.TextBoxVariableBuilder {
	opt := dashboard.VariableOption{Text: dashboard.StringOrArrayOfString{String: cog.ToPtr(value)},
		Value: dashboard.StringOrArrayOfString{String: cog.ToPtr(value)}}
	return dashboard.NewTextBoxVariableBuilder(name).Label(label).
		DefaultValue(dashboard.StringOrMap{String: cog.ToPtr(value)}).Current(opt)
}

func build() ([]byte, error) {
	b := dashboard.NewDashboardBuilder("kubegpu").
		Uid("kubegpu").
		Description("GPUs, allocation and fragmentation, pending GPU pods and node shims of a kubegpu cluster.").
		Tags([]string{"kubegpu", "gpu", "scheduler"}).
		Refresh("1m").
		Time("now-6h", "now").
		Timezone(common.TimeZoneBrowser).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Prometheus").Type("prometheus")).
		WithVariable(jobVariable("scheduler_job", "Scheduler job", "kubegpu-scheduler")).
		WithVariable(jobVariable("crishim_job", "Shim job", "kubegpu-crishim")).
		WithRow(dashboard.NewRowBuilder("GPUs")).
		WithPanel(statPanel("GPUs", "Allocatable GPUs (and MIG instances) of nodes with a usable inventory.", gpus, "none")).
		WithPanel(statPanel("Idle GPUs", "GPUs no pod holds any share of.", idle, "none")).
		WithPanel(statPanel("Stranded GPUs", "Free GPU share, in GPUs, that the workload mix cannot use where it lies (fragmentation).", stranded, "none")).
		WithPanel(statPanel("Unhealthy GPUs", "GPUs their nodes publish as not healthy.",
			`count(max by (node, device) (kubegpu_scheduler_gpu_unhealthy{`+sched+`})) or vector(0)`, "none")).
		WithPanel(series("GPUs by model", "Allocatable and idle GPUs per model.", "none",
			query(`max by (model) (kubegpu_scheduler_gpus{`+sched+`})`, "{{model}}"),
			query(`max by (model) (kubegpu_scheduler_idle_gpus{`+sched+`})`, "{{model}} idle"))).
		WithPanel(series("GPUs allocated by node", "GPUs' worth of compute that pods hold, per node.", "none",
			query(`sum by (node) (`+allocated+`)`, "{{node}}"))).
		WithRow(dashboard.NewRowBuilder("Allocation and fragmentation")).
		WithPanel(series("Allocation", "Share of the cluster's GPU compute that pods hold.", "percentunit",
			query(allocGPUs+` / `+gpus, "allocated"))).
		WithPanel(series("Fragmentation", "Stranded GPUs as a share of all GPUs, overall and per model (alert: KubeGPUFragmentationHigh).", "percentunit",
			query(stranded+` / `+gpus, "all"),
			query(`max by (model) (kubegpu_scheduler_stranded_gpus{`+sched+`}) / max by (model) (kubegpu_scheduler_gpus{`+sched+`})`, "{{model}}"))).
		WithPanel(series("GPU memory allocated by node", "GPU memory that pods hold, per node.", "bytes",
			query(`sum by (node) (max by (node, device) (kubegpu_scheduler_gpu_allocated_memory_bytes{`+sched+`}))`, "{{node}}"))).
		WithPanel(series("Pods per GPU", "Pods sharing each GPU (slices), the busiest 10.", "none",
			query(`topk(10, max by (node, device) (kubegpu_scheduler_gpu_pods{`+sched+`}))`, "{{node}} {{device}}"))).
		WithRow(dashboard.NewRowBuilder("GPU pods")).
		WithPanel(series("Pending GPU pods by reason", "GPU pods the leader tried and has not placed, by the reason most nodes gave.", "none",
			query(`max by (reason) (kubegpu_scheduler_pending_gpu_pods{`+sched+`})`, "{{reason}}"))).
		WithPanel(series("Bound GPU pods without an allocation", "GPU pods bound by another scheduler, or with spec.nodeName, whose containers run without GPUs (alert: KubeGPUPodsWithoutAllocation); and whether a kubegpu-scheduler replica leads (alert: KubeGPUSchedulerNotLeading).", "none",
			query(`max(kubegpu_scheduler_gpu_pods_without_allocation{`+sched+`})`, "pods without allocation"),
			query(`max(leader_election_master_status{`+sched+`})`, "a replica leads"))).
		WithPanel(series("Allocation to running", "From a GPU pod's binding to the scheduler seeing it running.", "s",
			query(`histogram_quantile(0.5, sum by (le) (rate(kubegpu_scheduler_allocation_to_running_seconds_bucket{`+sched+`}[$__rate_interval])))`, "p50"),
			query(`histogram_quantile(0.9, sum by (le) (rate(kubegpu_scheduler_allocation_to_running_seconds_bucket{`+sched+`}[$__rate_interval])))`, "p90"))).
		WithPanel(series("Allocations written", "Signed allocations written with bindings, by result.", "ops",
			query(`sum by (result) (rate(kubegpu_scheduler_allocations_written_total{`+sched+`}[$__rate_interval]))`, "{{result}}"))).
		WithPanel(series("Rejected allocations", "Allocations on bound pods the scheduler did not count, by reason (alert: KubeGPURejectedAllocations).", "none",
			query(`max by (reason) (increase(kubegpu_scheduler_rejected_allocations_total{`+sched+`}[$__rate_interval]))`, "{{reason}}"))).
		WithRow(dashboard.NewRowBuilder("Nodes (kubegpu-crishim)")).
		WithPanel(statPanel("Shims up", "kubegpu-crishim instances answering scrapes.", `sum(up{`+shim+`})`, "none")).
		WithPanel(statPanel("Shims down", "kubegpu-crishim instances not answering (alert: KubeGPUShimDown).", `count(up{`+shim+`} == 0) or vector(0)`, "none")).
		WithPanel(statPanel("Failed device modules", "Device modules that did not load or start, over all nodes.", `sum(kubegpu_crishim_modules_failed{`+shim+`}) or vector(0)`, "none")).
		WithPanel(statPanel("Nodes without a usable inventory", "Nodes the scheduler gives no GPU pods for want of an inventory.",
			`sum(max by (inventory) (kubegpu_scheduler_nodes{`+sched+`, inventory=~"missing|invalid"}))`, "none")).
		WithPanel(statPanel("Nodes not live", "Nodes with GPUs that get no pods: NotReady, or their Lease not renewed (alert: KubeGPUNodesNotLive).",
			`max(kubegpu_scheduler_nodes_not_live{`+sched+`})`, "none")).
		WithPanel(series("CreateContainer by result", "Containers the shims started with their devices (rewritten) or refused (gRPC code).", "ops",
			query(`sum by (result) (rate(kubegpu_crishim_create_container_total{`+shim+`}[$__rate_interval]))`, "{{result}}"))).
		WithPanel(series("CreateContainer rewrite latency", "Time the shims take to rewrite a container's config from its allocation.", "s",
			query(`histogram_quantile(0.99, sum by (le) (rate(kubegpu_crishim_create_container_rewrite_duration_seconds_bucket{`+shim+`}[$__rate_interval])))`, "p99"),
			query(`histogram_quantile(0.5, sum by (le) (rate(kubegpu_crishim_create_container_rewrite_duration_seconds_bucket{`+shim+`}[$__rate_interval])))`, "p50"))).
		WithPanel(series("Refusals by reason", "Containers the shims refused, by why.", "ops",
			query(`sum by (reason) (rate(kubegpu_crishim_create_container_refusals_total{`+shim+`}[$__rate_interval]))`, "{{reason}}"))).
		WithPanel(series("Module failures by node", "Device modules failed, by node and module.", "none",
			query(`max by (instance, module) (kubegpu_crishim_modules_failed{`+shim+`})`, "{{instance}} {{module}}"))).
		WithPanel(series("GPU slices by enforcement", "Running containers with GPU slices, by what their node read back from the enforcer: enforced, mismatch, unproven, unenforced (no enforcer; BestEffort only).", "none",
			query(`sum by (state) (kubegpu_crishim_gpu_slices{`+shim+`})`, "{{state}}"))).
		WithPanel(series("Slice enforcement mismatches and stops", "Checks that found a slice's limits other than its grant (alert: KubeGPUSliceEnforcementMismatch), and containers stopped for it under enforcement Required, by node.", "none",
			query(`sum by (instance) (increase(kubegpu_crishim_enforcement_mismatches_total{`+shim+`}[$__rate_interval]))`, "{{instance}} mismatches"),
			query(`sum by (instance) (increase(kubegpu_crishim_enforcement_stops_total{`+shim+`}[$__rate_interval]))`, "{{instance}} stopped")))
	d, err := b.Build()
	if err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}
