// Package devicescheduler is kubegpu's allocation engine: it decides whether
// a pod's device request fits on a node, how good the node is for it, and
// exactly which devices (or slices of devices) each container gets.
//
// It is a pure library over the types package. It holds no globals, talks to
// no API server and loads no plugins: the caller hands it the scheduler side
// of each device module (types.SchedulerPlugin), builds a Node from each
// node's inventory, tells each Node what its pods hold (Assume / Release),
// and persists the Placement it picks.
//
// # Units
//
// Compute shares are per mille of one device (1000 = the whole device);
// the API's percent is multiplied by 10. Memory is MiB. Host CPU is
// millicores.
//
// # Host resources
//
// A node's host CPU and memory count (for fit, and for the kubegpu policy's
// measure of the idle devices they cannot feed) when the Node tracks them,
// given to NewNode, or when the caller gives them per evaluation with
// EvaluateHost, as kube-scheduler, which tracks every pod's requests, does.
//
// # State
//
// What a node has taken is derived from the allocations assumed on it,
// nothing else: Assume adds a pod's allocation, Release removes it, and the
// same allocations in any order give the same state.
//
// # Concurrency
//
// An Engine is immutable after New and safe for concurrent use. A Node is
// safe for concurrent Evaluate calls; Assume and Release must not run
// concurrently with anything else on the same Node (the caller's cache
// serialises them). Evaluate and EvaluateHost do not allocate once a Node
// has seen the current Workload.
//
// # Errors
//
// Evaluate returns an error wrapping ErrDoesNotFit, with a reason a user can
// read, when the pod does not fit on the node: that is an ordinary outcome.
// New, NewNode and Assume return other errors for bad configuration or
// inconsistent data; those are the caller's bugs or broken input.
package devicescheduler
