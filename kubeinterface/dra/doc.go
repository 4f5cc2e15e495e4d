// Package dra describes a node's kubegpu devices in Kubernetes' Dynamic
// Resource Allocation API (resource.k8s.io/v1): the devices of a
// types.Inventory as the ResourceSlice devices of driver DriverName, with
// standard attributes (PCI bus ID, PCIe root, NUMA node), kubegpu's own
// (model, UUID, link group, ...), capacity (consumable on whole GPUs), the
// shared counters of GPUs in MIG mode and their partitions' consumption
// (CounterSets), and taints (devices.go).
//
// Every device carries the taint TaintManaged: kubegpu-scheduler allocates
// these devices through its signed pod annotations, and DRA's allocator
// must not hand them to ResourceClaims behind its back. Unhealthy devices
// carry TaintUnhealthy as well.
//
// It also holds the rules by which kubegpu tells what another DRA driver
// may hand out too (foreign.go): the kubegpu devices that another driver's
// ResourceSlice publishes (same UUID or PCI bus ID), and the DeviceClasses
// that map a resource kubegpu reads (extendedResourceName). The scheduler,
// the CLI and the node's DRA guard all apply them.
//
// The package is pure: the node agent supplies what only the node knows
// (the PCIe root of a bus ID) through Options.
package dra
