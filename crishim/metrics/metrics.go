// Package metrics holds kubegpu-crishim's metrics and serves them in the
// Prometheus text exposition format (version 0.0.4).
//
// The shim runs on every node under a memory budget, and a Prometheus
// client library costs it about 6 MB of resident memory for a dozen
// series, so the few counters and gauges it has are kept here with atomic
// operations and written out by hand; the tests read the output with the
// Prometheus parser. All methods are safe for concurrent use, and on a nil
// *Counter, *Gauge, *Histogram or *Vec they do nothing, so that packages
// can take an optional *Shim.
package metrics

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Counter only goes up.
type Counter struct{ v atomic.Uint64 }

// Inc adds one.
func (c *Counter) Inc() {
	if c != nil {
		c.v.Add(1)
	}
}

// Value is the count so far.
func (c *Counter) Value() uint64 {
	if c == nil {
		return 0
	}
	return c.v.Load()
}

// Gauge goes up and down.
type Gauge struct{ v atomic.Int64 }

// Set sets the value.
func (g *Gauge) Set(v int64) {
	if g != nil {
		g.v.Store(v)
	}
}

// Add adds d (which may be negative).
func (g *Gauge) Add(d int64) {
	if g != nil {
		g.v.Add(d)
	}
}

// Value is the current value.
func (g *Gauge) Value() int64 {
	if g == nil {
		return 0
	}
	return g.v.Load()
}

// buckets are the upper bounds of every Histogram's buckets, for 100µs to
// 10s; a last bucket, +Inf, takes what is longer.
var buckets = [...]time.Duration{
	100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond,
	10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
}

// Histogram counts durations in fixed buckets (100µs, 250µs, 500µs, 1ms,
// ... 5s, 10s, +Inf), written as a Prometheus histogram in seconds.
type Histogram struct {
	// counts are the observations per bucket, not cumulative; the last
	// is +Inf's. Their total is the count, so that a scrape never sees a
	// count other than its +Inf bucket.
	counts [len(buckets) + 1]atomic.Uint64
	sum    atomic.Int64 // nanoseconds
}

// Observe counts one duration (a negative one as 0).
func (h *Histogram) Observe(d time.Duration) {
	if h == nil {
		return
	}
	d = max(d, 0)
	i, _ := slices.BinarySearch(buckets[:], d) // the first bound >= d; le is inclusive
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
}

// Count is the number of durations observed.
func (h *Histogram) Count() uint64 {
	if h == nil {
		return 0
	}
	var n uint64
	for i := range h.counts {
		n += h.counts[i].Load()
	}
	return n
}

// Sum is the total of the durations observed.
func (h *Histogram) Sum() time.Duration {
	if h == nil {
		return 0
	}
	return time.Duration(h.sum.Load())
}

// Vec is a metric (*Counter, *Gauge or *Histogram) per value of one
// label.
type Vec[M any] struct {
	label  string
	mu     sync.Mutex
	values map[string]*M
}

// CounterVec is a counter per value of one label.
type CounterVec = Vec[Counter]

// GaugeVec is a gauge per value of one label.
type GaugeVec = Vec[Gauge]

// HistogramVec is a histogram per value of one label.
type HistogramVec = Vec[Histogram]

func newVec[M any](label string) Vec[M] { return Vec[M]{label: label, values: map[string]*M{}} }

// With returns the metric of one label value (created at 0).
func (v *Vec[M]) With(value string) *M {
	if v == nil {
		return nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	m, ok := v.values[value]
	if !ok {
		m = new(M)
		v.values[value] = m
	}
	return m
}

// sorted returns the label values in order and their metrics.
func (v *Vec[M]) sorted() ([]string, []*M) {
	v.mu.Lock()
	defer v.mu.Unlock()
	values := slices.Sorted(maps.Keys(v.values))
	ms := make([]*M, len(values))
	for i, k := range values {
		ms[i] = v.values[k]
	}
	return values, ms
}

// Reason is why the shim refused a container: the reason label of
// kubegpu_crishim_create_container_refusals_total. The shim uses only the
// values below, so that the label stays bounded.
type Reason string

// Reasons for refusing a container.
const (
	// ReasonBadRequest: the request is not a CRI v1 CreateContainer the
	// shim can read (not a protobuf CreateContainerRequest, over 16 MiB,
	// with request trailers, a :path without its leading slash, CRI
	// v1alpha2).
	ReasonBadRequest Reason = "bad_request"
	// ReasonShuttingDown: the shim was stopping.
	ReasonShuttingDown Reason = "shutting_down"
	// ReasonInvalidAllocation: the pod's allocation annotation is
	// malformed, or names more devices than a container can hold.
	ReasonInvalidAllocation Reason = "invalid_allocation"
	// ReasonBadSignature: the allocation is not signed by a key the node
	// holds (not signed, malformed, unknown key ID, no match).
	ReasonBadSignature Reason = "bad_signature"
	// ReasonOtherPod: the pod carries another pod's allocation.
	ReasonOtherPod Reason = "other_pod"
	// ReasonOtherNode: the allocation is for another node (or the
	// shim's --node-name is not the Node's name).
	ReasonOtherNode Reason = "other_node"
	// ReasonPrivileged: a privileged container outside the GPU allowlist
	// has devices allocated.
	ReasonPrivileged Reason = "privileged"
	// ReasonDevicesHeld: another pod's live container holds the devices
	// (the ledger).
	ReasonDevicesHeld Reason = "devices_held"
	// ReasonLedgerUnavailable: the runtime could not be asked what its
	// containers hold.
	ReasonLedgerUnavailable Reason = "ledger_unavailable"
	// ReasonUnknownDevice: the allocation names a device no device module
	// serves on this node, and every module loaded.
	ReasonUnknownDevice Reason = "unknown_device"
	// ReasonModuleFailed: the allocation names a device no module serves
	// while a device module did not load or start (modules_failed).
	ReasonModuleFailed Reason = "module_failed"
	// ReasonModuleError: a device module failed to make the container's
	// edits.
	ReasonModuleError Reason = "module_error"
	// ReasonCDIOff: the container's devices are CDI devices and the
	// runtime has CDI off.
	ReasonCDIOff Reason = "cdi_off"
	// ReasonDRAHeld: a prepared ResourceClaim of another DRA driver holds
	// a GPU of the container's allocation.
	ReasonDRAHeld Reason = "dra_held"
	// ReasonDRAUnknown: another DRA driver publishes the node's GPUs and
	// the shim cannot tell what its claims hold (kubelet's PodResources
	// API does not answer).
	ReasonDRAUnknown Reason = "dra_unknown"
	// ReasonOther: an error the shim does not classify.
	ReasonOther Reason = "other"
)

// Reasons are all the Reason values, in the order the README lists them.
var Reasons = []Reason{ReasonBadRequest, ReasonShuttingDown, ReasonInvalidAllocation, ReasonBadSignature,
	ReasonOtherPod, ReasonOtherNode, ReasonPrivileged, ReasonDevicesHeld, ReasonLedgerUnavailable,
	ReasonUnknownDevice, ReasonModuleFailed, ReasonModuleError, ReasonCDIOff, ReasonDRAHeld, ReasonDRAUnknown, ReasonOther}

// Shim is every metric of kubegpu-crishim.
type Shim struct {
	// Connections is the number of open CRI client connections.
	Connections Gauge
	// ConnectionsTotal counts CRI client connections accepted.
	ConnectionsTotal Counter
	// RuntimeUnreachable counts client connections closed at once because
	// the container runtime could not be reached.
	RuntimeUnreachable Counter
	// CreateContainer counts CreateContainer calls by result: "rewritten",
	// or the gRPC code of the refusal.
	CreateContainer CounterVec
	// RewriteDuration is how long the shim held each CreateContainer it
	// answered, by the same result as CreateContainer: from the whole
	// request received to the rewritten request sent to the runtime or the
	// refusal sent to the client. The runtime's own time is not in it
	// (kubelet's kubelet_runtime_operations_duration_seconds has the
	// whole call).
	RewriteDuration HistogramVec
	// Refusals counts the CreateContainer calls the shim refused, by
	// Reason; every reason is written, from 0.
	Refusals CounterVec
	// Publishes counts writes of the inventory or the capacity to the Node
	// by result: "ok" or "error".
	Publishes CounterVec
	// Syncs counts the advertiser's rounds (read the Node, write what
	// differs) by result.
	Syncs CounterVec
	// Restores counts the times the Node's inventory was found changed by
	// someone else and written back.
	Restores Counter
	// SliceErrors counts the failures to publish the node's
	// ResourceSlices (each retried).
	SliceErrors Counter
	// Devices is the number of devices in the last discovery.
	Devices Gauge
	// Allowlisted counts containers that kept the devices they asked for
	// because their pod is on the GPU allowlist, by namespace (the
	// allowlist's, so the label's values are bounded).
	Allowlisted CounterVec
	// Stripped counts containers whose config brought GPU access of its
	// own (device nodes, mounts, CDI devices) that the shim removed.
	Stripped Counter
	// LedgerRefusals counts containers refused because another pod's live
	// container holds their devices (as Refusals does by
	// ReasonDevicesHeld, but also those whose client gave up before the
	// refusal reached it).
	LedgerRefusals Counter
	// Modules is the number of device modules serving.
	Modules Gauge
	// ModulesFailed is 1 for each device module that did not load or
	// start, by its file (e.g. nvidia.so), or by the plugin directory when
	// no module could be loaded from it.
	ModulesFailed GaugeVec
	// Slices is the running containers with GPU slices at the last
	// enforcement check, by state: enforced, mismatch, unproven,
	// unenforced (every state written, from 0).
	Slices GaugeVec
	// EnforcementMismatches counts the checks that found a container's
	// applied limits other than its grant.
	EnforcementMismatches Counter
	// EnforcementStops counts the containers the shim stopped for their
	// enforcement under policy Required.
	EnforcementStops Counter
}

// SliceStates are the values of Slices' state label.
var SliceStates = []string{"enforced", "mismatch", "unproven", "unenforced"}

// New returns the shim's metrics, all at zero.
func New() *Shim {
	s := &Shim{
		CreateContainer: newVec[Counter]("result"),
		RewriteDuration: newVec[Histogram]("result"),
		Refusals:        newVec[Counter]("reason"),
		Publishes:       newVec[Counter]("result"),
		Syncs:           newVec[Counter]("result"),
		Allowlisted:     newVec[Counter]("namespace"),
		ModulesFailed:   newVec[Gauge]("module"),
		Slices:          newVec[Gauge]("state"),
	}
	for _, r := range Reasons {
		s.Refusals.With(string(r))
	}
	for _, st := range SliceStates {
		s.Slices.With(st)
	}
	return s
}

// refusalsHelp lists the reasons in the help text.
var refusalsHelp = func() string {
	names := make([]string, len(Reasons))
	for i, r := range Reasons {
		names[i] = string(r)
	}
	return "CreateContainer calls the shim refused, by reason: " + strings.Join(names, ", ") + " (see kubegpu-crishim's README)."
}()

// WriteText writes every metric in the Prometheus text format.
func (s *Shim) WriteText(w io.Writer) error {
	b := bufio.NewWriter(w)
	gauge(b, "kubegpu_crishim_connections", "Open CRI client connections.", s.Connections.Value())
	counter(b, "kubegpu_crishim_connections_total", "CRI client connections accepted.", s.ConnectionsTotal.Value())
	counter(b, "kubegpu_crishim_runtime_unreachable_total", "CRI client connections closed at once because the container runtime could not be reached.", s.RuntimeUnreachable.Value())
	vec(b, "kubegpu_crishim_create_container_total", "CreateContainer calls by result: rewritten, or the gRPC code the shim refused them with.", &s.CreateContainer)
	histogramVec(b, "kubegpu_crishim_create_container_rewrite_duration_seconds", "Time the shim held a CreateContainer, by result as in create_container_total: from the whole request received to the rewritten request sent to the runtime or the refusal sent to the client; the runtime's own time is not in it.", &s.RewriteDuration)
	vec(b, "kubegpu_crishim_create_container_refusals_total", refusalsHelp, &s.Refusals)
	vec(b, "kubegpu_crishim_inventory_publishes_total", "Writes of the device inventory or capacity to the Node by result.", &s.Publishes)
	vec(b, "kubegpu_crishim_node_syncs_total", "Rounds of the advertiser (read the Node, write what differs) by result.", &s.Syncs)
	counter(b, "kubegpu_crishim_inventory_restores_total", "Times the Node's inventory was found changed by someone else and written back.", s.Restores.Value())
	counter(b, "kubegpu_crishim_resourceslice_errors_total", "Failures to publish the node's devices as ResourceSlices (each retried).", s.SliceErrors.Value())
	gauge(b, "kubegpu_crishim_devices", "Devices found by the last discovery.", s.Devices.Value())
	vec(b, "kubegpu_crishim_allowlisted_containers_total", "Containers that kept the devices they asked for because their pod is on the node's GPU allowlist, by namespace.", &s.Allowlisted)
	counter(b, "kubegpu_crishim_stripped_containers_total", "Containers whose config brought GPU device nodes, mounts or CDI devices of its own, which the shim removed.", s.Stripped.Value())
	counter(b, "kubegpu_crishim_ledger_refusals_total", "Containers refused because another pod's live container holds their devices.", s.LedgerRefusals.Value())
	gauge(b, "kubegpu_crishim_modules", "Device modules serving.", s.Modules.Value())
	gaugeVec(b, "kubegpu_crishim_modules_failed", "1 for each device module that did not load or start, by file (or by plugin directory when none could be loaded); containers are refused the devices it would serve.", &s.ModulesFailed)
	gaugeVec(b, "kubegpu_crishim_gpu_slices", "Running containers with GPU slices at the last enforcement check, by state: enforced (limits read back equal the grant), mismatch, unproven (the enforcer did not answer), unenforced (no enforcer).", &s.Slices)
	counter(b, "kubegpu_crishim_enforcement_mismatches_total", "Enforcement checks that found a container's applied GPU limits other than its grant.", s.EnforcementMismatches.Value())
	counter(b, "kubegpu_crishim_enforcement_stops_total", "Containers stopped because their GPU slice was not enforced as granted under enforcement Required.", s.EnforcementStops.Value())
	gauge(b, "go_goroutines", "Number of goroutines that currently exist.", int64(runtime.NumGoroutine()))
	if rss, ok := residentBytes(); ok {
		gauge(b, "process_resident_memory_bytes", "Resident memory size in bytes.", rss)
	}
	return b.Flush()
}

func counter(b *bufio.Writer, name, help string, v uint64) {
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, helpEscaper.Replace(help), name, name, v)
}

func gauge(b *bufio.Writer, name, help string, v int64) {
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s gauge\n%s %d\n", name, helpEscaper.Replace(help), name, name, v)
}

func vec(b *bufio.Writer, name, help string, v *CounterVec) {
	values, counters := v.sorted()
	writeVec(b, name, help, "counter", v.label, values, func(i int) string { return fmt.Sprint(counters[i].Value()) })
}

func gaugeVec(b *bufio.Writer, name, help string, v *GaugeVec) {
	values, gauges := v.sorted()
	writeVec(b, name, help, "gauge", v.label, values, func(i int) string { return fmt.Sprint(gauges[i].Value()) })
}

// histogramVec writes a histogram family: per label value its cumulative
// buckets, sum and count.
func histogramVec(b *bufio.Writer, name, help string, v *HistogramVec) {
	values, hs := v.sorted()
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, helpEscaper.Replace(help), name)
	for i, k := range values {
		label := v.label + `="` + labelEscaper.Replace(k) + `"`
		var n uint64
		for j := range hs[i].counts {
			n += hs[i].counts[j].Load()
			le := "+Inf"
			if j < len(buckets) {
				le = seconds(buckets[j])
			}
			fmt.Fprintf(b, "%s_bucket{%s,le=\"%s\"} %d\n", name, label, le, n)
		}
		fmt.Fprintf(b, "%s_sum{%s} %s\n%s_count{%s} %d\n", name, label, seconds(hs[i].Sum()), name, label, n)
	}
}

// seconds writes d in seconds, as short as it reads back exactly.
func seconds(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'g', -1, 64) }

// writeVec writes one labelled metric family: value(i) is the sample of
// label value values[i].
func writeVec(b *bufio.Writer, name, help, kind, label string, values []string, value func(i int) string) {
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, helpEscaper.Replace(help), name, kind)
	for i, k := range values {
		fmt.Fprintf(b, "%s{%s=\"%s\"} %s\n", name, label, labelEscaper.Replace(k), value(i))
	}
}

// Escaping of the text format: label values escape backslash, double
// quote and line feed; help texts backslash and line feed.
var (
	labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
)

// residentBytes reads the process's resident set size.
func residentBytes() (int64, bool) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, false
	}
	var size, resident int64
	if _, err := fmt.Sscan(string(b), &size, &resident); err != nil {
		return 0, false
	}
	return resident * int64(os.Getpagesize()), true
}

// Handler serves /metrics and /healthz. /healthz answers 200 "ok" while
// health returns nil (health may be nil: always), and 503 with health's
// error otherwise: the process serves CRI either way, so this is for
// people and alerts, not for a liveness probe that would restart it.
func (s *Shim) Handler(health func() error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_ = s.WriteText(w)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if health != nil {
			if err := health(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = io.WriteString(w, err.Error()+"\n")
				return
			}
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	return mux
}
