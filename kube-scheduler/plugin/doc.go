// Package plugin is the kubegpu framework plugin for kube-scheduler.
//
// PreFilter decodes a pod's device request (pods without one skip the plugin);
// Filter asks the allocation engine (package devicescheduler) whether the pod
// fits on each node and why not; Score ranks the nodes by the engine's score,
// normalised by rank; Reserve chooses the devices and assumes them in a
// device cache shared by every profile of the process; Bind (or PreBind)
// writes the signed allocation onto the pod as it is bound; PostBind asks
// for the scheduler's record of it in the pod's status (package record);
// Unreserve gives the devices back.
//
// The device cache (package devicecache) is fed only by informers (node inventories and Ready
// conditions, the nodes' Leases renewed by their kubelets, pods' verified
// allocations: the scheduler's record first), so a restarted scheduler
// rebuilds the same state from the API server, whatever tenants did to
// their pods' annotations. GPU scheduling cycles wait until it is synced
// and has seen the nodes' Leases renewed.
//
// The plugin keeps one file per extension point (prefilter.go, filter.go,
// score.go, reserve.go, prebind.go, bind.go, events.go, preempt.go for PreFilter's
// extensions), the wiring (plugin.go), its args (args.go, config.go; the
// types are in kube-scheduler/apis/config). ResourceClaims of kubegpu's
// DeviceClass are allocated through the same steps (claims.go, with
// package claims); Facade (facade.go) is the stock DynamicResources plugin
// with those claims hidden from it (docs/dra.md). Records are written by package
// record, metrics kept by package metrics. Fit, refusal and score are
// decided in package devicecache alone.
//
// Logging verbosity: errors for unusable inventories and allocations that do
// not match a node; Info for allocations changed after binding; V(2)
// written allocations and rejected allocations; V(4) each reservation,
// record and node update.
package plugin
