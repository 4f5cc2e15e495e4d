package plugin

import (
	"errors"
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// cacheMetrics are the plugin's metrics, served on the scheduler's /metrics
// with every upstream one.
type cacheMetrics struct {
	rejects *metrics.CounterVec
	writes  *metrics.CounterVec
	records *metrics.CounterVec
}

var (
	metricsOnce sync.Once
	theMetrics  *cacheMetrics
)

// registerMetrics registers the metrics once per process.
func registerMetrics() *cacheMetrics {
	metricsOnce.Do(func() {
		m := newCacheMetrics()
		m.register(legacyregistry.Register)
		theMetrics = m
	})
	return theMetrics
}

// newCacheMetrics makes the metrics, not yet registered (until then they
// record nothing).
func newCacheMetrics() *cacheMetrics {
	return &cacheMetrics{
		rejects: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: "kubegpu", Subsystem: "scheduler", Name: "rejected_allocations_total",
			Help:           "Allocations on bound pods that the device cache did not count, by reason (bad_signature, mismatch, invalid, conflict, changed_after_binding: kept as first verified).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"reason"}),
		writes: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: "kubegpu", Subsystem: "scheduler", Name: "allocations_written_total",
			Help:           "Signed allocations written onto pods (with the binding, or in PreBind), by result (signed, error, missing: bound by another bind plugin first).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"result"}),
		records: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: "kubegpu", Subsystem: "scheduler", Name: "allocation_records_total",
			Help:           "Writes of the scheduler's record of an allocation into the pod's status, by result (written, gone: the pod was deleted, retry, error: left to the next leader).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"result"}),
	}
}

// Label values of the plugin's metrics: every series exists from the
// start, at 0, so that increase() and alerts see the first event.
var (
	rejectReasons = []string{"bad_signature", "mismatch", "invalid", "conflict", "changed_after_binding"}
	writeResults  = []string{"signed", "error", "missing"}
	recordResults = []string{"written", "gone", "retry", "error"}
)

// register registers the metrics with register (a registry's Register)
// and creates every series.
func (m *cacheMetrics) register(register func(metrics.Registerable) error) {
	for _, c := range []metrics.Registerable{m.rejects, m.writes, m.records} {
		if err := register(c); err != nil {
			panic(err)
		}
	}
	for _, r := range rejectReasons {
		m.rejects.WithLabelValues(r).Add(0)
	}
	for _, r := range writeResults {
		m.writes.WithLabelValues(r).Add(0)
	}
	for _, r := range recordResults {
		m.records.WithLabelValues(r).Add(0)
	}
}

// Rejected counts an allocation the device cache did not count.
func (m *cacheMetrics) Rejected(err error) {
	if m == nil {
		return
	}
	reason := "invalid"
	switch {
	case errors.Is(err, kubeinterface.ErrBadSignature):
		reason = "bad_signature"
	case errors.Is(err, objects.ErrMismatch):
		reason = "mismatch"
	case errors.Is(err, devicescheduler.ErrConflict):
		reason = "conflict"
	case errors.Is(err, devicecache.ErrChanged):
		reason = "changed_after_binding"
	}
	m.rejects.WithLabelValues(reason).Inc()
}

func (m *cacheMetrics) recorded(result string) {
	if m != nil {
		m.records.WithLabelValues(result).Inc()
	}
}

func (m *cacheMetrics) written(result string) {
	if m != nil {
		m.writes.WithLabelValues(result).Inc()
	}
}
