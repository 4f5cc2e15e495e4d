// Package metrics holds kubegpu-crishim's metrics and serves them in the
// Prometheus text exposition format (version 0.0.4).
//
// The shim runs on every node under a memory budget, and a Prometheus
// client library costs it about 6 MB of resident memory for a dozen
// series, so the few counters and gauges it has are kept here with atomic
// operations and written out by hand; the tests read the output with the
// Prometheus parser. All methods are safe for concurrent use, and on a nil
// *Counter, *Gauge or *Vec they do nothing, so that packages can
// take an optional *Shim.
package metrics

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

// Vec is a metric (*Counter or *Gauge) per value of one label.
type Vec[M any] struct {
	label  string
	mu     sync.Mutex
	values map[string]*M
}

// CounterVec is a counter per value of one label.
type CounterVec = Vec[Counter]

// GaugeVec is a gauge per value of one label.
type GaugeVec = Vec[Gauge]

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
	// Publishes counts writes of the inventory or the capacity to the Node
	// by result: "ok" or "error".
	Publishes CounterVec
	// Syncs counts the advertiser's rounds (read the Node, write what
	// differs) by result.
	Syncs CounterVec
	// Restores counts the times the Node's inventory was found changed by
	// someone else and written back.
	Restores Counter
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
	// container holds their devices.
	LedgerRefusals Counter
	// Modules is the number of device modules serving.
	Modules Gauge
	// ModulesFailed is 1 for each device module that did not load or
	// start, by its file (e.g. nvidia.so), or by the plugin directory when
	// no module could be loaded from it.
	ModulesFailed GaugeVec
}

// New returns the shim's metrics, all at zero.
func New() *Shim {
	return &Shim{
		CreateContainer: newVec[Counter]("result"),
		Publishes:       newVec[Counter]("result"),
		Syncs:           newVec[Counter]("result"),
		Allowlisted:     newVec[Counter]("namespace"),
		ModulesFailed:   newVec[Gauge]("module"),
	}
}

// WriteText writes every metric in the Prometheus text format.
func (s *Shim) WriteText(w io.Writer) error {
	b := bufio.NewWriter(w)
	gauge(b, "kubegpu_crishim_connections", "Open CRI client connections.", s.Connections.Value())
	counter(b, "kubegpu_crishim_connections_total", "CRI client connections accepted.", s.ConnectionsTotal.Value())
	counter(b, "kubegpu_crishim_runtime_unreachable_total", "CRI client connections closed at once because the container runtime could not be reached.", s.RuntimeUnreachable.Value())
	vec(b, "kubegpu_crishim_create_container_total", "CreateContainer calls by result: rewritten, or the gRPC code the shim refused them with.", &s.CreateContainer)
	vec(b, "kubegpu_crishim_inventory_publishes_total", "Writes of the device inventory or capacity to the Node by result.", &s.Publishes)
	vec(b, "kubegpu_crishim_node_syncs_total", "Rounds of the advertiser (read the Node, write what differs) by result.", &s.Syncs)
	counter(b, "kubegpu_crishim_inventory_restores_total", "Times the Node's inventory was found changed by someone else and written back.", s.Restores.Value())
	gauge(b, "kubegpu_crishim_devices", "Devices found by the last discovery.", s.Devices.Value())
	vec(b, "kubegpu_crishim_allowlisted_containers_total", "Containers that kept the devices they asked for because their pod is on the node's GPU allowlist, by namespace.", &s.Allowlisted)
	counter(b, "kubegpu_crishim_stripped_containers_total", "Containers whose config brought GPU device nodes, mounts or CDI devices of its own, which the shim removed.", s.Stripped.Value())
	counter(b, "kubegpu_crishim_ledger_refusals_total", "Containers refused because another pod's live container holds their devices.", s.LedgerRefusals.Value())
	gauge(b, "kubegpu_crishim_modules", "Device modules serving.", s.Modules.Value())
	gaugeVec(b, "kubegpu_crishim_modules_failed", "1 for each device module that did not load or start, by file (or by plugin directory when none could be loaded); containers are refused the devices it would serve.", &s.ModulesFailed)
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
