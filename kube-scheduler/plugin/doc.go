// Package plugin is the kubegpu framework plugin for kube-scheduler.
//
// PreFilter decodes a pod's device request (pods without one skip the plugin);
// Filter asks the allocation engine (package devicescheduler) whether the pod
// fits on each node and why not; Score ranks the nodes by the engine's score,
// normalised by rank; Reserve chooses the devices and assumes them in a
// device cache shared by every profile of the process; Bind (or PreBind)
// writes the signed allocation onto the pod as it is bound; PostBind asks
// for the scheduler's record of it in the pod's status (recorder);
// Unreserve gives the devices back.
//
// The device cache is fed only by informers (node inventories and Ready
// conditions, the nodes' Leases renewed by their kubelets, pods' verified
// allocations: the scheduler's record first), so a restarted scheduler
// rebuilds the same state from the API server, whatever tenants did to
// their pods' annotations. GPU scheduling cycles wait until it is synced
// and has seen the nodes' Leases renewed.
//
// Logging verbosity: errors for unusable inventories and allocations that do
// not match a node; Info for allocations changed after binding; V(2)
// written allocations and rejected allocations; V(4) each reservation,
// record and node update.
package plugin
