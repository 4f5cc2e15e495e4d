package advertiser

import (
	"context"
	"fmt"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/crishim/metrics"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
)

// Slices keeps the node's devices published as the ResourceSlices of
// driver dra.DriverName: one pool named after the node, owned by its Node
// object (so that they go when the Node goes), written with the node's own
// credentials, which the Node authorizer and NodeRestriction allow for
// slices whose spec.nodeName is the node. Upstream's
// k8s.io/dynamic-resource-allocation/resourceslice controller does the
// writing: it compares what is stored with what is wanted and creates,
// updates and deletes slices until they agree, retrying with backoff.
type Slices struct {
	node    string
	opts    dra.Options
	metrics *metrics.Shim
	ctrl    *resourceslice.Controller

	mu   sync.Mutex
	last string // the encoded inventory last handed to the controller
}

// StartSlices starts publishing for node, with no devices until the first
// Update. client must carry the node's credentials (or others that may
// write ResourceSlices of that node). Stop ends it; the slices stay (a
// restarted shim takes them over), and DeleteSlices removes them.
func StartSlices(ctx context.Context, client kubernetes.Interface, node string, opts dra.Options, m *metrics.Shim) (*Slices, error) {
	if m == nil {
		m = metrics.New()
	}
	s := &Slices{node: node, opts: opts, metrics: m}
	logger := klog.FromContext(ctx).WithName("resourceslices")
	ctrl, err := resourceslice.StartController(klog.NewContext(ctx, logger), resourceslice.Options{
		DriverName: dra.DriverName,
		KubeClient: client,
		Owner:      &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: node},
		ErrorHandler: func(ctx context.Context, err error, msg string) {
			m.SliceErrors.Inc()
			logger.Error(err, "Publishing the node's ResourceSlices failed; retrying", "step", msg)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("publish ResourceSlices of node %s: %w", node, err)
	}
	s.ctrl = ctrl
	return s, nil
}

// Update publishes inv (nothing is written when it equals the last one).
// Devices the API cannot hold exactly are adapted as dra.Devices says and
// logged.
func (s *Slices) Update(ctx context.Context, inv types.Inventory) {
	inv.KeyIDs = nil // not the devices'
	value, err := kubeinterface.EncodeInventory(inv)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot publish an invalid inventory as ResourceSlices")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if value == s.last {
		return
	}
	devices, err := dra.Devices(inv, s.opts)
	if err != nil {
		klog.FromContext(ctx).Info("Some device details cannot be published in ResourceSlices", "details", err.Error())
	}
	s.ctrl.Update(DriverResources(s.node, devices))
	s.last = value
}

// Stop stops publishing and waits for the controller to end.
func (s *Slices) Stop() { s.ctrl.Stop() }

// DriverResources is the one pool of node's devices, in slices of at most
// dra.MaxDevicesPerSlice.
func DriverResources(node string, devices []resourceapi.Device) *resourceslice.DriverResources {
	var slices []resourceslice.Slice
	for _, d := range dra.Slices(devices) {
		slices = append(slices, resourceslice.Slice{Devices: d})
	}
	return &resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: {Slices: slices}}}
}

// DeleteSlices deletes node's ResourceSlices of driver dra.DriverName and
// returns how many there were. With the node's credentials the Node
// authorizer allows the list and each delete for the node's own slices.
func DeleteSlices(ctx context.Context, client kubernetes.Interface, node string) (int, error) {
	selector := fields.Set{resourceapi.ResourceSliceSelectorDriver: dra.DriverName, resourceapi.ResourceSliceSelectorNodeName: node}.String()
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: selector})
	if err != nil {
		return 0, fmt.Errorf("list the ResourceSlices of node %s: %w", node, err)
	}
	for _, s := range list.Items {
		if err := client.ResourceV1().ResourceSlices().Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("delete ResourceSlice %s: %w", s.Name, err)
		}
	}
	return len(list.Items), nil
}
