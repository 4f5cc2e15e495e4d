// Package enforce proves, on the node, that each running container's GPU
// slices are held to their grant, and acts on what it finds.
//
// Every interval the Checker lists the runtime's running containers and
// their ready sandboxes, reads each container's verified allocation from
// its sandbox's annotations (rewrite.Rewriter, as CreateContainer does),
// and, for a container that holds devices of kubegpu ResourceClaims, the
// devices its ledger annotation lists and its claims' policies
// (ClaimPolicies), and for the slices asks the device module that serves them to read
// back what its enforcer applied (types.EnforcementProver). The result is
// recorded on the pod as condition kubegpu.io/Enforced, with the node's
// credentials, only when it changes; a container whose limits differ from
// its grant, or whose slices no enforcer holds, is a Warning event and a
// metric, and, under the allocation's policy Required, is stopped
// (kubelet restarts it as its restartPolicy says; while its enforcer still
// holds other limits, it is stopped again). An enforcer that does not
// answer makes the slice unproven; under Required the container is
// stopped after UnprovenRounds checks in a row.
package enforce
