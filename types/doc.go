// Package types is kubegpu's device model and the contract between the
// system's parts and its device modules.
//
// It holds plain data only: a Device, a node's Inventory (devices plus the
// pairwise Link matrix between them), a PodRequest (what each container asks
// for), a PodAllocation (which devices, and how much of each, each container
// got) and the ContainerEdits that give a container its devices. The wire form
// of these types is versioned by SchemaVersion; package kubeinterface encodes
// them on Kubernetes objects.
//
// The interfaces a device module implements live here too: NodePlugin (used by
// kubegpu-crishim to discover devices and edit containers), SchedulerPlugin
// (used by the allocation engine for the device-specific part of fit and
// score) and Module, which a plugin .so hands out through its one exported
// constructor, ModuleSymbol.
//
// Nothing in this package keeps state; every value is safe to share between
// goroutines as long as nobody mutates it.
package types
