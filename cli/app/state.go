package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// clusterState is what the commands read from the API: nodes with their
// inventories and heartbeats, and the allocations of bound pods.
type clusterState struct {
	nodes []nodeState
	// pods maps a node name to the pods bound there with an allocation.
	pods map[string][]podAllocation
	// requested maps a node name to the CPU and memory its bound pods ask
	// for, all of them, as the scheduler counts them.
	requested map[string]host
	// withoutDevices maps a node name to its bound pods that ask for no
	// devices.
	withoutDevices map[string][]*corev1.Pod
}

// host is CPU (millicores) and memory (MiB).
type host struct{ cpuMilli, memoryMiB int64 }

type nodeState struct {
	name string
	inv  types.Inventory
	// invErr is why the node has no usable inventory (kubeinterface.ErrNoInventory
	// when it publishes none).
	invErr error
	// renewed is the heartbeat Lease's last renewal; zero without one.
	renewed time.Time
	// allocatable is the node's allocatable CPU and memory.
	allocatable host
}

type podAllocation struct {
	pod   *corev1.Pod
	alloc kubeinterface.Allocation
}

func loadState(ctx context.Context, client kubernetes.Interface) (*clusterState, error) {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	leases, err := client.CoordinationV1().Leases(kubeinterface.LeaseNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list heartbeat leases: %w", err)
	}
	renewed := map[string]time.Time{}
	for _, l := range leases.Items {
		if name, ok := strings.CutPrefix(l.Name, kubeinterface.LeasePrefix); ok && l.Spec.RenewTime != nil {
			renewed[name] = l.Spec.RenewTime.Time
		}
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"})
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	s := &clusterState{pods: map[string][]podAllocation{}, requested: map[string]host{}, withoutDevices: map[string][]*corev1.Pod{}}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		inv, err := objects.NodeInventory(n)
		cpu, mem := objects.NodeHost(n)
		s.nodes = append(s.nodes, nodeState{name: n.Name, inv: inv, invErr: err, renewed: renewed[n.Name], allocatable: host{cpu, mem}})
	}
	slices.SortFunc(s.nodes, func(a, b nodeState) int { return strings.Compare(a.name, b.name) })
	for i := range pods.Items {
		p := &pods.Items[i]
		cpu, mem := objects.HostRequest(p)
		r := s.requested[p.Spec.NodeName]
		s.requested[p.Spec.NodeName] = host{r.cpuMilli + cpu, r.memoryMiB + mem}
		if !objects.WantsDevices(p) {
			s.withoutDevices[p.Spec.NodeName] = append(s.withoutDevices[p.Spec.NodeName], p)
			continue
		}
		a, err := objects.PodAllocation(p)
		if err != nil || a.Node != p.Spec.NodeName {
			continue // holds no devices the scheduler counts
		}
		s.pods[p.Spec.NodeName] = append(s.pods[p.Spec.NodeName], podAllocation{pod: p, alloc: a})
	}
	return s, nil
}

// hasInventory reports whether n publishes a usable inventory.
func (n nodeState) hasInventory() bool { return n.invErr == nil }

// why says why a node has no usable inventory.
func (n nodeState) why() string {
	if errors.Is(n.invErr, kubeinterface.ErrNoInventory) {
		return "no kubegpu inventory (kubegpu-crishim not running there?)"
	}
	return fmt.Sprintf("inventory unusable: %v", n.invErr)
}
