// Package draclaims tells kubegpu-crishim which of the node's kubegpu
// devices Dynamic Resource Allocation holds, so that no GPU is given to
// two containers: one through kubegpu's signed allocation, one through a
// ResourceClaim that another DRA driver prepared for the same GPU.
//
// A Guard watches the other drivers' ResourceSlices of its node (with the
// node's own credentials, which the Node authorizer lets list a node's
// slices) and recognises the kubegpu devices they publish by UUID or PCI
// bus ID (kubeinterface/dra). Kubelet's PodResources API says which
// devices the prepared claims of each pod hold (driver, pool, device);
// the Guard maps those to kubegpu device IDs.
//
// While no other driver publishes a kubegpu device of the node, the Guard
// asks kubelet nothing: it costs a node without another DRA driver
// nothing, and works without kubelet's PodResources socket.
package draclaims
