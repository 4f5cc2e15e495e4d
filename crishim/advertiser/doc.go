// Package advertiser publishes a node's devices on the Kubernetes API: the
// inventory annotation, the extended-resource capacity (through the node's
// status subresource) and the heartbeat Lease that the scheduler checks for
// staleness.
package advertiser
