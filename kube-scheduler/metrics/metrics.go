package metrics

import (
	"errors"
	"sync"

	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// Metrics are the plugin's metrics, served on the scheduler's /metrics
// with every upstream one.
type Metrics struct {
	rejects *k8smetrics.CounterVec
	writes  *k8smetrics.CounterVec
	records *k8smetrics.CounterVec
}

var (
	metricsOnce sync.Once
	theMetrics  *Metrics
)

// Register registers the metrics once per process.
func Register() *Metrics {
	metricsOnce.Do(func() {
		m := newMetrics()
		m.register(legacyregistry.Register)
		theMetrics = m
	})
	return theMetrics
}

// newMetrics makes the metrics, not yet registered (until then they
// record nothing).
func newMetrics() *Metrics {
	return &Metrics{
		rejects: k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
			Namespace: "kubegpu", Subsystem: "scheduler", Name: "rejected_allocations_total",
			Help:           "Allocations on bound pods that the device cache did not count, by reason (bad_signature, mismatch, invalid, conflict, changed_after_binding: kept as first verified).",
			StabilityLevel: k8smetrics.ALPHA,
		}, []string{"reason"}),
		writes: k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
			Namespace: "kubegpu", Subsystem: "scheduler", Name: "allocations_written_total",
			Help:           "Signed allocations written onto pods (with the binding, or in PreBind), by result (signed, error, missing: bound by another bind plugin first).",
			StabilityLevel: k8smetrics.ALPHA,
		}, []string{"result"}),
		records: k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
			Namespace: "kubegpu", Subsystem: "scheduler", Name: "allocation_records_total",
			Help:           "Writes of the scheduler's record of an allocation into the pod's status, by result (written, gone: the pod was deleted, retry, error: left to the next leader).",
			StabilityLevel: k8smetrics.ALPHA,
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
func (m *Metrics) register(register func(k8smetrics.Registerable) error) {
	for _, c := range []k8smetrics.Registerable{m.rejects, m.writes, m.records} {
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
func (m *Metrics) Rejected(err error) {
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

// Recorded counts a record written, by result.
func (m *Metrics) Recorded(result string) {
	if m != nil {
		m.records.WithLabelValues(result).Inc()
	}
}

// Written counts a signed allocation written onto a pod, by result.
func (m *Metrics) Written(result string) {
	if m != nil {
		m.writes.WithLabelValues(result).Inc()
	}
}
