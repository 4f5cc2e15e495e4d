package advertiser

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
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
//
// Run owns the controller, in a goroutine of its own: starting one waits
// until it has listed the node's slices, which an unreachable API server,
// or one that does not serve resource.k8s.io/v1, delays indefinitely, and
// neither the CRI server nor the advertiser may wait for that.
type Slices struct {
	client  kubernetes.Interface
	node    string
	opts    dra.Options
	metrics *metrics.Shim
	wake    chan struct{}
	// syncDelay is the controller's wait after a change it saw before it
	// compares again (0: upstream's default, 30 s); tests shorten it.
	syncDelay time.Duration
	// rounds counts the wake-ups Run has handled, for tests.
	rounds atomic.Uint64

	mu        sync.Mutex
	want      *resourceslice.DriverResources // nil until the first Update
	wantValue string                         // the encoded inventory of want
	uid       ktypes.UID                     // of the Node the slices belong to
	// withdrawn: the API server dropped the devices' taints (feature
	// gate DRADeviceTaints off), so DRA's allocator could hand out
	// kubegpu's GPUs: nothing is published until the shim restarts.
	withdrawn bool
	// pushed is what Run last handed the controller ("" none,
	// "withdrawn" no devices); running whether a controller runs.
	pushed  string
	running bool
}

// NewSlices returns a publisher for node; Run publishes. client must carry
// the node's credentials (or others that may write that node's
// ResourceSlices).
func NewSlices(client kubernetes.Interface, node string, opts dra.Options, m *metrics.Shim) *Slices {
	if m == nil {
		m = metrics.New()
	}
	return &Slices{client: client, node: node, opts: opts, metrics: m, wake: make(chan struct{}, 1)}
}

// Update sets the devices to publish: inv, for the Node of UID uid (read
// by the advertiser, so that slices are owned by the Node that exists; a
// Node deleted and registered again gets a new controller). Devices the
// API cannot hold exactly are adapted as dra.Devices says and logged.
func (s *Slices) Update(ctx context.Context, inv types.Inventory, uid ktypes.UID) {
	inv.KeyIDs = nil // not the devices'
	value, err := kubeinterface.EncodeInventory(inv)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot publish an invalid inventory as ResourceSlices")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if value == s.wantValue && uid == s.uid && s.want != nil {
		return
	}
	devices, err := dra.Devices(inv, s.opts)
	if err != nil {
		klog.FromContext(ctx).Info("Some device details cannot be published in ResourceSlices", "details", err.Error())
	}
	s.want, s.wantValue, s.uid = DriverResources(s.node, devices, dra.CounterSets(inv)), value, uid
	s.signal()
}

// NodeGone says the Node is not registered (deleted, or not yet there):
// the controller stops, and the garbage collector removes the slices of a
// deleted Node; publishing starts again with the next Update.
func (s *Slices) NodeGone() {
	s.mu.Lock()
	s.uid = ""
	s.mu.Unlock()
	s.signal()
}

func (s *Slices) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run publishes until ctx ends, then stops the controller; the slices
// stay (a restarted shim takes them over), and DeleteSlices removes them.
func (s *Slices) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("resourceslices")
	ctx = klog.NewContext(ctx, logger)
	var c controller
	defer func() { c.ctrl.Stop() }() // Stop on a nil controller does nothing
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		}
		if !s.handle(ctx, &c) {
			return
		}
		s.mu.Lock()
		s.pushed, s.running = c.pushed, c.ctrl != nil
		s.mu.Unlock()
		s.rounds.Add(1)
	}
}

// controller is the controller Run owns, the Node UID it publishes for and
// what Run last handed it ("" nothing, "withdrawn" no devices).
type controller struct {
	ctrl   *resourceslice.Controller
	uid    ktypes.UID
	pushed string
}

// stop stops the controller, if one runs.
func (c *controller) stop() {
	c.ctrl.Stop() // Stop on a nil controller does nothing
	*c = controller{}
}

// handle brings the controller in line with what is wanted: stopped while
// the Node is missing, one per Node UID, handed the devices (or none, when
// withdrawn). It reports false when publishing must end.
func (s *Slices) handle(ctx context.Context, c *controller) bool {
	logger := klog.FromContext(ctx)
	s.mu.Lock()
	uid, started := s.uid, s.want != nil
	s.mu.Unlock()
	if uid == "" && c.ctrl != nil {
		logger.V(2).Info("The Node is gone: stopping the ResourceSlice controller")
		c.stop()
	}
	if !started || uid == "" {
		return true
	}
	if c.ctrl == nil || uid != c.uid {
		c.stop()
		logger.V(2).Info("Starting the ResourceSlice controller", "nodeUID", uid)
		opts := resourceslice.Options{
			DriverName:   dra.DriverName,
			KubeClient:   s.client,
			Owner:        &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: s.node, UID: uid},
			ErrorHandler: s.handleError,
		}
		if s.syncDelay > 0 {
			opts.SyncDelay = &s.syncDelay
		}
		ctrl, err := resourceslice.StartController(ctx, opts)
		if err != nil {
			if ctx.Err() == nil {
				s.metrics.SliceErrors.Inc()
				logger.Error(err, "Cannot publish the node's ResourceSlices")
			}
			return false
		}
		*c = controller{ctrl: ctrl, uid: uid}
	}
	s.mu.Lock()
	want, value := s.want, s.wantValue
	if s.withdrawn {
		want, value = &resourceslice.DriverResources{}, "withdrawn"
	}
	s.mu.Unlock()
	if value != c.pushed {
		c.ctrl.Update(want)
		c.pushed = value
	}
	return true
}

// handleError is the controller's error handler: every failure is logged
// and counted (the controller retries); slices stored without their taints
// are withdrawn.
func (s *Slices) handleError(ctx context.Context, err error, msg string) {
	s.metrics.SliceErrors.Inc()
	logger := klog.FromContext(ctx)
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) && slices.Contains(dropped.DisabledFeatures(), "DRADeviceTaints") {
		s.mu.Lock()
		first := !s.withdrawn
		s.withdrawn = true
		s.mu.Unlock()
		if first {
			logger.Error(err, "The API server dropped the devices' taints (feature gate DRADeviceTaints off): withdrawing the node's ResourceSlices, so that DRA cannot allocate GPUs that kubegpu allocates; turn the gate on and restart kubegpu-crishim to publish them again")
		}
		s.signal()
		return
	}
	if dropped != nil {
		// Consumable capacity with DRAConsumableCapacity off, say: the
		// slices are stored without them, and the controller stops
		// asking for them.
		logger.Error(err, "The API server dropped fields of the node's ResourceSlices (its feature gates are off); published without them", "disabledFeatures", dropped.DisabledFeatures())
		return
	}
	logger.Error(err, "Publishing the node's ResourceSlices failed; retrying", "step", msg)
}

// DriverResources is the one pool of node's devices, in slices of at most
// dra.MaxDevicesPerSlice, and their shared counters (dra.CounterSets), in
// slices of their own (the API keeps counter sets and devices apart), at
// most resourceapi.ResourceSliceMaxCounterSets a slice.
func DriverResources(node string, devices []resourceapi.Device, counters []resourceapi.CounterSet) *resourceslice.DriverResources {
	var out []resourceslice.Slice
	for len(counters) > 0 {
		n := min(len(counters), resourceapi.ResourceSliceMaxCounterSets)
		out = append(out, resourceslice.Slice{SharedCounters: counters[:n:n]})
		counters = counters[n:]
	}
	for _, d := range dra.Slices(devices) {
		out = append(out, resourceslice.Slice{Devices: d})
	}
	return &resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: {Slices: out}}}
}

// DeleteSlices deletes node's ResourceSlices of driver dra.DriverName and
// returns how many there were. With the node's credentials the Node
// authorizer allows the list and each delete for the node's own slices.
func DeleteSlices(ctx context.Context, client kubernetes.Interface, node string) (int, error) {
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: dra.NodeSelector(node)})
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
