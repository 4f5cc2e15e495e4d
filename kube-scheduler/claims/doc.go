// Package claims places the ResourceClaims of kubegpu's DeviceClass
// (dra.ClassName) with kubegpu's engine, beside the stock DynamicResources
// plugin (docs/dra.md).
//
// ForPod finds a pod's kubegpu claims (pod.go). Compile turns their
// requests into the engine's container requests, one per claim request,
// named as dra.ClaimEntry names them, the CEL selectors of the request and
// of its class evaluated over the cluster's kubegpu devices into a set of
// UUIDs (compile.go); a pod whose requests have alternatives
// (firstAvailable) gets one list of container requests per combination,
// in DRA's order of preference, and RankScore ranks nodes by the first one
// that fits there. Allocate then checks the devices the engine chose
// with the upstream structured allocator, over copies of the node's
// ResourceSlices that keep only those devices and a copy of each claim
// that tolerates kubegpu's taint and is pinned to its devices, and returns
// the standard allocation results (allocate.go): every rule of the API the
// engine does not know (constraints, capacity policies, counters) is the
// allocator's, not a copy of it.
//
// The package knows the scheduler's DRA manager only through small
// interfaces, and nothing of the device cache.
package claims
