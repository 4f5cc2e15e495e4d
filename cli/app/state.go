package app

import (
	"fmt"
	"strings"
	"unicode"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// clusterState is what the commands read from the API: nodes with their
// inventories and liveness, and the allocations of bound pods.
type clusterState struct {
	nodes []nodeState
	// pods maps a node name to the pods bound there whose allocation
	// verifies: they hold devices.
	pods map[string][]podAllocation
	// unverified are the bound GPU pods whose allocation does not verify:
	// they hold no devices as far as the scheduler and the node are
	// concerned.
	unverified []unverifiedPod
	// withoutDevices maps a node name to its bound pods that ask for no
	// devices.
	withoutDevices map[string][]*corev1.Pod
	// leases are the nodes' Leases, and bound every bound pod that has
	// not finished, as the scheduler's informers list them; requestedBytes
	// maps a node name to the CPU (millicores) and memory (bytes) its
	// bound pods ask for.
	leases         []coordinationv1.Lease
	bound          []*corev1.Pod
	requestedBytes map[string][2]int64
	// nominated are the pods preemption nominated to a node, not bound
	// yet and not finished: the scheduler places them first
	// (nominatedBefore).
	nominated []*corev1.Pod
	// policies is the enforcement policy of the nominated pods'
	// namespaces (namespacePolicies), for their devices.
	policies map[string]types.EnforcementPolicy
	// slices are the ResourceSlices of other DRA drivers, and classes the
	// DeviceClasses: what kubegpu leaves to DRA.
	slices  []*resourceapi.ResourceSlice
	classes []*resourceapi.DeviceClass
	// claims are the allocated ResourceClaims (loadClaims); pinned is the
	// node the explained pod's claims are allocated on, or "".
	claims []*resourceapi.ResourceClaim
	pinned string
	// claimHolds maps a node name to the kubegpu claims allocated there
	// whose signed allocation verifies (with a key; checked for the claim
	// without one), and unverifiedClaims counts the others.
	claimHolds       map[string][]claimHold
	unverifiedClaims int
	// draUnread says why the slices or classes could not be read (a role
	// from before kubegpu read them), or is empty.
	draUnread string
}

type nodeState struct {
	name string
	inv  types.Inventory
	// invErr is why the node has no usable inventory (kubeinterface.ErrNoInventory
	// when it publishes none).
	invErr error
	// node is the Node object, for what the scheduler's other filters
	// read (labels, taints).
	node *corev1.Node
}

type podAllocation struct {
	pod   *corev1.Pod
	alloc kubeinterface.Allocation
	// source is where the allocation was read from (objects.SourceRecord
	// or SourceAnnotation); annotationDiffers is set when the pod's
	// annotation no longer matches the scheduler's record.
	source            string
	annotationDiffers bool
}

// unverifiedPod is a bound GPU pod whose allocation does not verify.
type unverifiedPod struct {
	pod    *corev1.Pod
	reason string
}

// hasInventory reports whether n publishes a usable inventory.
func (n nodeState) hasInventory() bool { return n.invErr == nil }

// sanitize makes a string that a node (or anyone who can write a node)
// published safe to print on a terminal: characters that are not printable
// (control and format characters: escape sequences, bidirectional
// overrides) are shown as Go escapes. Inventories bound the length of what
// nodes publish (types.Inventory.Validate).
func sanitize(s string) string {
	var b strings.Builder
	for _, r := range s {
		if unicode.IsPrint(r) {
			b.WriteRune(r)
			continue
		}
		q := fmt.Sprintf("%+q", string(r))
		b.WriteString(q[1 : len(q)-1])
	}
	return b.String()
}
