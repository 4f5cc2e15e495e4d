// Package claimplugin is kubegpu-crishim's DRA kubelet plugin for driver
// gpu.kubegpu.io: kubelet asks it to prepare the ResourceClaims of
// kubegpu's DeviceClass before their pods' containers start.
//
// Prepare verifies the allocation kubegpu-scheduler signed into each
// claim's status (dra.SignedValue: signed by a trusted key, for this very
// claim, on this node) and that the claim's standard allocation gives
// exactly the signed devices, then writes a CDI spec file for the claim
// with one CDI device per allocated device (kind CDIKind) and returns
// their IDs. Kubelet passes those IDs on in CreateContainer; the shim
// resolves them (Store.Shares) into the devices the container gets, which
// the rewrite, the ledger and the refusals then treat as an annotation
// allocation's. The spec files are the plugin's only state: a restarted
// shim reads them, verifying them again. Unprepare removes them.
package claimplugin
