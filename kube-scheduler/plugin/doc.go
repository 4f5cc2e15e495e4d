// Package plugin is the kubegpu framework plugin for kube-scheduler.
//
// PreFilter decodes a pod's device request (pods without one skip the plugin);
// Filter asks the allocation engine (package devicescheduler) whether the pod
// fits on each node and why not; Score ranks the nodes by the engine's score,
// normalised by rank; Reserve chooses the devices and assumes them in a
// device cache shared by every profile of the process; PreBind writes the
// signed allocation onto the pod before it is bound; Unreserve gives the
// devices back.
//
// The device cache is fed only by informers (node inventories, heartbeat
// Leases, pods' verified allocations), so a restarted scheduler rebuilds the
// same state from the API server. Scheduling cycles wait until it is synced.
//
// Logging verbosity: errors for unusable inventories and allocations that do
// not match a node; V(2) written allocations and rejected allocations; V(4)
// each reservation and node update.
package plugin
