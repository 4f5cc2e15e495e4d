// Package devicecache is kubegpu-scheduler's view of every node's devices
// and of the devices pods hold, and the one place that decides whether a
// GPU pod fits on a node, why not, and how well.
//
// The cache is fed by informer events only (UpdateNode, UpdatePod,
// UpdateLease and their deletes): node inventories and Ready conditions,
// the nodes' Leases, pods' verified allocations (the scheduler's record
// first), so a restarted scheduler rebuilds the same state from the API
// server. Its handlers never write to the API: the records it asks for go
// to a Recorder, its rejections to Metrics.
//
// Evaluate (with EvaluateWith for preemption's dry run and nominated pods,
// EvaluateHostOnly for pods without devices) is the decision on one node;
// Classify turns its error into a Refusal: the framework plugin's status,
// the pending reason, and the details `kubegpu explain` prints. Reserve
// chooses and assumes a pod's devices in one step under the write lock.
//
// The package knows nothing of the scheduler framework. Files by job:
// cache.go (the Cache and its configuration), node.go and nodekeys.go (node
// states, and nodes refusing the scheduler's key),
// pod.go (pods' allocations), claims.go (the devices ResourceClaims of
// kubegpu's DeviceClass hold, under the claim's UID), liveness.go (Leases and Ready), taints.go
// (the device nodes counted by their hard taints, so that a pod without
// devices that could land on none of them is not scored), learn.go (the
// workload mix learned at start), memo.go and shape.go (Filter results
// remembered per node version and request shape), decide.go and reasons.go
// (the decision and its classification), overlay.go (pods removed or added
// for one evaluation), reserve.go, wait.go (pods woken when what refused
// them ends) and view.go (snapshots for metrics and tests).
package devicecache
