package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

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

// listed is what the commands read from the API server, as one set of
// lists (listFromAPI) or as the stores of watches hold it (`kubegpu ui`):
// the objects clusterState is built from.
type listed struct {
	nodes  []*corev1.Node
	leases []*coordinationv1.Lease
	// pods are at least the pods bound to a node or nominated to one that
	// have not finished; others are passed over.
	pods    []*corev1.Pod
	slices  []*resourceapi.ResourceSlice
	classes []*resourceapi.DeviceClass
	claims  []*resourceapi.ResourceClaim
	// claimsRead is false when the caller may not list ResourceClaims;
	// draUnread says what could not be read (a role from before kubegpu
	// read it), or is empty.
	claimsRead bool
	draUnread  string
	// inventories, when set, keeps the nodes' decoded inventories
	// between builds (the watches' lists change a node at a time).
	inventories *inventoryCache
}

// inventoryCache keeps each node's decoded inventory while the node
// publishes the same one: decoding is most of a rebuild's cost (5,000
// nodes: about 0.7 s of 0.8).
type inventoryCache struct {
	mu sync.Mutex
	m  map[string]decodedInventory
}

type decodedInventory struct {
	value string
	inv   types.Inventory
	err   error
}

// decode is objects.NodeInventory(n), from the cache where n publishes
// what it published last. The cache keeps only the nodes of the last
// call, nodes.
func (c *inventoryCache) decode(nodes []*corev1.Node) []nodeState {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := make(map[string]decodedInventory, len(nodes))
	out := make([]nodeState, 0, len(nodes))
	for _, n := range nodes {
		value, ok := n.Annotations[kubeinterface.AnnotationInventory]
		d, hit := c.m[n.Name]
		if !ok || !hit || d.value != value {
			d.value = value
			d.inv, d.err = objects.NodeInventory(n)
		}
		if ok {
			next[n.Name] = d
		}
		out = append(out, nodeState{name: n.Name, inv: d.inv, invErr: d.err, node: n})
	}
	c.m = next
	return out
}

// loadState reads the cluster. With key, allocations must be signed by it;
// without, they must at least name their pod (UID included) and node.
func loadState(ctx context.Context, client kubernetes.Interface, key *kubeinterface.KeySet) (*clusterState, error) {
	l, err := listFromAPI(ctx, client)
	if err != nil {
		return nil, err
	}
	return l.state(verifier(key)), nil
}

// verifier is key's check of a signed allocation, or nil without a key.
func verifier(key *kubeinterface.KeySet) func(kubeinterface.Allocation) error {
	if key == nil {
		return nil
	}
	return key.Verify
}

// listFromAPI lists what the commands read. Not being allowed to list
// ResourceSlices, DeviceClasses or ResourceClaims is said (draUnread), not
// an error: a viewer bound to the role of an earlier kubegpu still sees
// the rest.
func listFromAPI(ctx context.Context, client kubernetes.Interface) (*listed, error) {
	l := &listed{}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	for i := range nodes.Items {
		l.nodes = append(l.nodes, &nodes.Items[i])
	}
	leases, err := client.CoordinationV1().Leases(kubeinterface.LeaseNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the nodes' Leases in %s: %w", kubeinterface.LeaseNamespace, err)
	}
	for i := range leases.Items {
		l.leases = append(l.leases, &leases.Items[i])
	}
	for _, list := range []struct {
		what, selector string
		bound          bool
	}{
		{"pods", "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed", true},
		{"pods nominated to nodes", "spec.nodeName=,status.nominatedNodeName!=,status.phase!=Succeeded,status.phase!=Failed", false},
	} {
		pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: list.selector})
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", list.what, err)
		}
		for i := range pods.Items {
			// What the field selector asked for, should the server not
			// filter: each pod once.
			if p := &pods.Items[i]; (p.Spec.NodeName != "") == list.bound {
				l.pods = append(l.pods, p)
			}
		}
	}
	rs, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsForbidden(err):
		l.draUnread = fmt.Sprintf("Not checked: which GPUs other DRA drivers publish, and which resources DeviceClasses map to DRA (%v); the role kubegpu-viewer grants it.", err)
	case err != nil:
		return nil, fmt.Errorf("list ResourceSlices (GPUs other DRA drivers publish): %w", err)
	default:
		for i := range rs.Items {
			l.slices = append(l.slices, &rs.Items[i])
		}
		classes, err := client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
		switch {
		case apierrors.IsForbidden(err):
			l.draUnread = fmt.Sprintf("Not checked: which resources DeviceClasses map to DRA (%v); the role kubegpu-viewer grants it.", err)
		case err != nil:
			return nil, fmt.Errorf("list DeviceClasses (resources mapped to DRA): %w", err)
		default:
			for i := range classes.Items {
				l.classes = append(l.classes, &classes.Items[i])
			}
		}
	}
	claims, err := client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsForbidden(err):
		l.draUnread = fmt.Sprintf("Not counted: the GPUs that ResourceClaims hold (%v); the role kubegpu-viewer grants it.", err)
	case err != nil:
		return nil, fmt.Errorf("list ResourceClaims (GPUs claims hold): %w", err)
	default:
		l.claimsRead = true
		for i := range claims.Items {
			l.claims = append(l.claims, &claims.Items[i])
		}
	}
	return l, nil
}

// state builds the cluster's state from the lists; verify checks signed
// allocations (nil: checked against the pod and node they name only).
func (l *listed) state(verify func(kubeinterface.Allocation) error) *clusterState {
	s := &clusterState{pods: map[string][]podAllocation{}, withoutDevices: map[string][]*corev1.Pod{},
		requestedBytes: map[string][2]int64{}, draUnread: l.draUnread}
	for _, le := range l.leases {
		s.leases = append(s.leases, *le)
	}
	for _, sl := range l.slices {
		if sl.Spec.Driver != dra.DriverName && sl.Spec.NodeName != nil {
			s.slices = append(s.slices, sl)
		}
	}
	s.classes = l.classes
	if l.claimsRead {
		s.claimHolds = map[string][]claimHold{}
		for _, c := range l.claims {
			if c.Status.Allocation == nil {
				continue
			}
			s.claims = append(s.claims, c)
			a, _, err := dra.ClaimAllocation(c, verify)
			switch {
			case errors.Is(err, dra.ErrNotSigned):
			case err != nil:
				s.unverifiedClaims++
			default:
				s.claimHolds[a.Node] = append(s.claimHolds[a.Node], claimHold{claim: c, alloc: a.PodAllocation})
			}
		}
	}
	if l.inventories != nil {
		s.nodes = l.inventories.decode(l.nodes)
	} else {
		for _, n := range l.nodes {
			inv, err := objects.NodeInventory(n)
			s.nodes = append(s.nodes, nodeState{name: n.Name, inv: inv, invErr: err, node: n})
		}
	}
	slices.SortFunc(s.nodes, func(a, b nodeState) int { return strings.Compare(a.name, b.name) })
	for _, p := range l.pods {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue // what the field selectors ask for, should the server not filter
		}
		if p.Spec.NodeName == "" {
			if p.Status.NominatedNodeName != "" {
				s.nominated = append(s.nominated, p)
			}
			continue
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
	return s
}
