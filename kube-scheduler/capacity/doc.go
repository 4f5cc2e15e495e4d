// Package capacity keeps the cluster's GPU capacity in aggregate
// (kubeinterface.Capacity: per model, GPUs idle, full, stranded and
// unhealthy) in a ConfigMap, computed from the scheduler's device cache:
// what a tenant who may not read nodes sees of the GPUs outside its
// namespace.
//
// Every replica of the scheduler writes it from its own cache, only when
// what it computes differs from what the ConfigMap holds; replicas follow
// the same API objects, so they agree but for the moments their caches
// differ.
package capacity
