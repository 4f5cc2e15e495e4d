// Package advertiser publishes a node's devices on the Kubernetes API: the
// inventory annotation and the extended-resource capacity (through the
// node's status subresource), kept equal to what the node's device modules
// discover. It writes only the node's own Node object, which is all that
// kubelet-style node credentials may write there.
package advertiser
