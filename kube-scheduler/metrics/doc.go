// Package metrics is kubegpu-scheduler's own metrics, served on its
// /metrics beside every upstream one: allocations rejected, written and
// recorded (Metrics, which the device cache and the recorder count
// through), the GPU collector (per-GPU and per-model series computed from
// a copy of the device cache's nodes at each scrape, RegisterGPU), the
// pending GPU pods by reason (PendingPods, which the plugin's Filter
// counts) and the allocation-to-running histogram (ObserveRunning).
package metrics
