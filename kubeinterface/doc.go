// Package kubeinterface owns kubegpu's encoding on Kubernetes objects: every
// annotation, label and resource key (constants under kubegpu.io/), the
// versioned JSON payloads for node inventories and pod allocations, and
// their signatures. Subpackage objects reads them off Pod and Node objects
// (including a pod's device request from its limits and annotations); this
// package does not import the core API types, so that the node agent can use
// it without linking them.
//
// Every decoder takes untrusted input: it bounds sizes, checks the payload's
// apiVersion and kind, validates the content, and reports problems as
// *FieldError or *InvalidError values that wrap ErrInvalid and read as
// instructions to the user ("container "train": kubegpu.io/gpu-cores must be
// an integer 1..100, got "150""). Missing annotations are ErrNoInventory and
// ErrNoAllocation, which are not ErrInvalid.
//
// The package is stateless and safe for concurrent use.
package kubeinterface
