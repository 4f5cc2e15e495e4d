package plugin

import (
	"errors"
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// cacheMetrics are the plugin's metrics, served on the scheduler's /metrics
// with every upstream one.
type cacheMetrics struct {
	nodes   *metrics.GaugeVec
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
		m := &cacheMetrics{
			nodes: metrics.NewGaugeVec(&metrics.GaugeOpts{
				Namespace: "kubegpu", Subsystem: "scheduler", Name: "nodes",
				Help:           "Nodes known to the device cache, by the state of their device inventory (ok, missing, invalid).",
				StabilityLevel: metrics.ALPHA,
			}, []string{"inventory"}),
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
		legacyregistry.MustRegister(m.nodes, m.rejects, m.writes, m.records)
		// Every series from the start, at 0, so that increase() and
		// alerts see the first event.
		for _, r := range []string{"bad_signature", "mismatch", "invalid", "conflict", "changed_after_binding"} {
			m.rejects.WithLabelValues(r).Add(0)
		}
		for _, r := range []string{"signed", "error", "missing"} {
			m.writes.WithLabelValues(r).Add(0)
		}
		for _, r := range []string{"written", "gone", "retry", "error"} {
			m.records.WithLabelValues(r).Add(0)
		}
		theMetrics = m
	})
	return theMetrics
}

func (m *cacheMetrics) setNodes(nodes map[string]*nodeState) {
	if m == nil {
		return
	}
	counts := map[string]float64{"ok": 0, "missing": 0, "invalid": 0}
	for _, ns := range nodes {
		if !ns.built {
			continue // only a Lease seen: no Node (yet)
		}
		switch {
		case ns.devices != nil:
			counts["ok"]++
		case errors.Is(ns.err, errNoInventory):
			counts["missing"]++
		default:
			counts["invalid"]++
		}
	}
	for k, v := range counts {
		m.nodes.WithLabelValues(k).Set(v)
	}
}

func (m *cacheMetrics) rejected(err error) {
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
	case errors.Is(err, errChanged):
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
