// Package admission generates kubegpu's admission policies
// (deploy/admission): ValidatingAdmissionPolicies, in CEL, that enforce at
// the API server what kubegpu-scheduler and kubegpu-crishim also enforce.
//
//   - kubegpu-gpu-request refuses a GPU pod whose request PreFilter would
//     refuse, with the same words: the policy is generated from the rules'
//     bounds and texts in kubeinterface/objects, and an integration test
//     compares both on the same pods.
//   - kubegpu-allocation lets only kubegpu-scheduler set a pod's
//     kubegpu.io/allocation (and its record in the pod's status), only
//     before the pod is bound; nobody changes or removes either afterwards,
//     and no pod is created with one.
//   - kubegpu-node-name refuses GPU pods created with spec.nodeName, which
//     would skip the scheduler, unless the creator may
//     "set pods/nodename" in the kubegpu.io API group.
//   - kubegpu-scheduler-name (second-scheduler mode only) refuses GPU pods
//     addressed to another scheduler.
//
// Identities are not listed in the policies: they ask the authorizer
// (RBAC) for permissions on kubegpu.io resources that exist only as names
// in RBAC rules, so an operator grants them with ordinary (Cluster)Role
// bindings and no policy parameter can go missing.
package admission
