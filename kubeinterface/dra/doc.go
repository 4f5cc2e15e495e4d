// Package dra describes a node's kubegpu devices in Kubernetes' Dynamic
// Resource Allocation API (resource.k8s.io/v1): the devices of a
// types.Inventory as the ResourceSlice devices of driver DriverName, with
// standard attributes (PCI bus ID, PCIe root, NUMA node), kubegpu's own
// (model, UUID, link group, ...), capacity, and taints.
//
// Every device carries the taint TaintManaged: kubegpu-scheduler allocates
// these devices through its signed pod annotations, and DRA's allocator
// must not hand them to ResourceClaims behind its back. Unhealthy devices
// carry TaintUnhealthy as well.
//
// The package is pure: the node agent supplies what only the node knows
// (the PCIe root of a bus ID) through Options.
package dra
