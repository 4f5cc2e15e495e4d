package app

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"unicode"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
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

// loadState reads the cluster. With key, allocations must be signed by it;
// without, they must at least name their pod (UID included) and node.
func loadState(ctx context.Context, client kubernetes.Interface, key *kubeinterface.KeySet) (*clusterState, error) {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	leases, err := client.CoordinationV1().Leases(kubeinterface.LeaseNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the nodes' Leases in %s: %w", kubeinterface.LeaseNamespace, err)
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"})
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	nominated, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: "spec.nodeName=,status.nominatedNodeName!=,status.phase!=Succeeded,status.phase!=Failed"})
	if err != nil {
		return nil, fmt.Errorf("list pods nominated to nodes: %w", err)
	}
	s := &clusterState{pods: map[string][]podAllocation{}, withoutDevices: map[string][]*corev1.Pod{},
		leases: leases.Items, requestedBytes: map[string][2]int64{}}
	if err := s.loadDRA(ctx, client); err != nil {
		return nil, err
	}
	var verify func(kubeinterface.Allocation) error
	if key != nil {
		verify = key.Verify
	}
	if err := s.loadClaims(ctx, client, verify); err != nil {
		return nil, err
	}
	for i := range nominated.Items {
		p := &nominated.Items[i]
		if p.Spec.NodeName == "" && p.Status.NominatedNodeName != "" && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			s.nominated = append(s.nominated, p)
		}
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		inv, err := objects.NodeInventory(n)
		s.nodes = append(s.nodes, nodeState{name: n.Name, inv: inv, invErr: err, node: n})
	}
	slices.SortFunc(s.nodes, func(a, b nodeState) int { return strings.Compare(a.name, b.name) })
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue // what the field selector asked for, should the server not filter
		}
		s.bound = append(s.bound, p)
		cpuMilli, memBytes := objects.HostRequestBytes(p)
		rb := s.requestedBytes[p.Spec.NodeName]
		s.requestedBytes[p.Spec.NodeName] = [2]int64{rb[0] + cpuMilli, rb[1] + memBytes}
		if !objects.WantsDevices(p) || objects.ServedByDRA(p) {
			// A pod DRA serves holds no kubegpu GPU: as one without.
			s.withoutDevices[p.Spec.NodeName] = append(s.withoutDevices[p.Spec.NodeName], p)
			continue
		}
		h, err := objects.HeldAllocation(p, verify)
		if err != nil {
			s.unverified = append(s.unverified, unverifiedPod{pod: p, reason: err.Error()})
			continue
		}
		s.pods[p.Spec.NodeName] = append(s.pods[p.Spec.NodeName], podAllocation{pod: p, alloc: h.Allocation,
			source: h.Source, annotationDiffers: h.AnnotationDiffers})
	}
	return s, nil
}

// loadDRA lists other DRA drivers' node-local ResourceSlices and the
// DeviceClasses. Not being allowed to is said (draUnread), not an error:
// a viewer bound to the role of an earlier kubegpu still sees the rest.
func (s *clusterState) loadDRA(ctx context.Context, client kubernetes.Interface) error {
	slices, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if apierrors.IsForbidden(err) {
		s.draUnread = fmt.Sprintf("Not checked: which GPUs other DRA drivers publish, and which resources DeviceClasses map to DRA (%v); the role kubegpu-viewer grants it.", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("list ResourceSlices (GPUs other DRA drivers publish): %w", err)
	}
	classes, err := client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if apierrors.IsForbidden(err) {
		s.draUnread = fmt.Sprintf("Not checked: which resources DeviceClasses map to DRA (%v); the role kubegpu-viewer grants it.", err)
	} else if err != nil {
		return fmt.Errorf("list DeviceClasses (resources mapped to DRA): %w", err)
	}
	for i := range slices.Items {
		if sl := &slices.Items[i]; sl.Spec.Driver != dra.DriverName && sl.Spec.NodeName != nil {
			s.slices = append(s.slices, sl)
		}
	}
	if classes != nil {
		for i := range classes.Items {
			s.classes = append(s.classes, &classes.Items[i])
		}
	}
	return nil
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
