package localcluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/crishim/advertiser"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
)

// DeviceNode is a node for benchmarks of thousands of nodes: registered as
// cluster-admin (RegisterNode), with its devices published as
// kubegpu-crishim publishes them and a Lease that RenewLeases renews.
type DeviceNode struct {
	Name string
	// Host is its CPU, memory and pods.
	Host corev1.ResourceList
	// Labels are added to the node's.
	Labels map[string]string
	// Inventory and Capacity are what the advertiser publishes (Capacity
	// may hold more extended resources).
	Inventory types.Inventory
	Capacity  advertiser.ResourceList
	// ResourceSlices publishes the devices as ResourceSlices of driver
	// dra.DriverName too, in the advertiser's layout
	// (advertiser.DriverResources).
	ResourceSlices bool
}

// AddDeviceNodes registers nodes, 32 at a time.
func (c *Cluster) AddDeviceNodes(ctx context.Context, nodes []DeviceNode) error {
	if err := c.EnsureNamespace(ctx, kubeinterface.LeaseNamespace); err != nil {
		return err
	}
	client, err := advertiser.NewClient(c.Config)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(nodes))
	sem := make(chan struct{}, 32)
	for _, n := range nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs <- c.addDeviceNode(ctx, client, n)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) addDeviceNode(ctx context.Context, client advertiser.Client, n DeviceNode) error {
	if err := c.RegisterNode(ctx, n.Name, n.Host); err != nil {
		return err
	}
	if len(n.Labels) > 0 {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for k, v := range n.Labels {
			node.Labels[k] = v
		}
		if _, err := c.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("label node %s: %w", n.Name, err)
		}
	}
	if err := advertiser.PublishInventory(ctx, client, n.Name, n.Inventory, n.Capacity); err != nil {
		return err
	}
	if n.ResourceSlices {
		if err := PublishSlices(ctx, c.Client, n.Name, n.Inventory); err != nil {
			return err
		}
	}
	now := metav1.NewMicroTime(time.Now())
	_, err := c.Client.CoordinationV1().Leases(kubeinterface.LeaseNamespace).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Namespace: kubeinterface.LeaseNamespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(n.Name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
	}, metav1.CreateOptions{})
	return err
}

// RenewLeases renews the named nodes' Leases every 10 s until ctx ends, as
// their kubelets would: kubegpu-scheduler counts a node live only while it
// sees renewals.
func (c *Cluster) RenewLeases(ctx context.Context, names []string) {
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var g errgroup.Group
		g.SetLimit(16)
		for _, name := range names {
			g.Go(func() error {
				patch := fmt.Appendf(nil, `{"spec":{"renewTime":%q}}`, metav1.NewMicroTime(time.Now()).Format(metav1.RFC3339Micro))
				_, _ = c.Client.CoordinationV1().Leases(kubeinterface.LeaseNamespace).Patch(ctx, name, ktypes.MergePatchType, patch, metav1.PatchOptions{})
				return nil
			})
		}
		_ = g.Wait()
	}
}

// PublishSlices writes node's ResourceSlices of driver dra.DriverName for
// inv as the advertiser's resourceslice controller would (one pool named
// after the node, advertiser.DriverResources), directly: for benchmarks of
// thousands of nodes, where one controller per node would cost a watch
// each.
func PublishSlices(ctx context.Context, client kubernetes.Interface, node string, inv types.Inventory) error {
	devices, err := dra.Devices(inv, dra.Options{})
	if err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	pool := advertiser.DriverResources(node, devices, dra.CounterSets(inv)).Pools[node]
	for i, sl := range pool.Slices {
		_, err := client.ResourceV1().ResourceSlices().Create(ctx, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", node, dra.DriverName, i)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:         dra.DriverName,
				Pool:           resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
				NodeName:       ptr.To(node),
				Devices:        sl.Devices,
				SharedCounters: sl.SharedCounters,
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("node %s: ResourceSlice %d: %w", node, i, err)
		}
	}
	return nil
}
