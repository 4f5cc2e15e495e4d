package advertiser

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/crishim/metrics"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
)

// Source discovers the node's devices (every module's, merged).
type Source func(ctx context.Context) (types.Inventory, error)

// Options configure an Advertiser.
type Options struct {
	Node   string
	Client Client
	// Discover returns the node's current devices.
	Discover Source
	// Interval is how often devices are discovered and the Node is
	// compared with them (default 10s).
	Interval time.Duration
	// SlicesPerDevice scales nvidia.com/gpu capacity (see Capacity).
	SlicesPerDevice int
	// Metrics counts publications; optional.
	Metrics *metrics.Shim
	// Condition is the Node's kubeinterface.ConditionDevicesReady
	// condition as it should be (whether every device module is serving);
	// nil: the advertiser does not write it. Its message is cut to 2 KiB.
	Condition *Condition
	// Now is the clock for the condition's times (default time.Now).
	Now func() time.Time
	// KeyIDs are the IDs of the allocation keys the shim verifies with,
	// published in the inventory (types.Inventory.KeyIDs).
	KeyIDs []string
	// Slices, when set, publishes every discovery's devices as the node's
	// ResourceSlices as well, owned by the Node the advertiser read
	// (Slices.Run must run beside the advertiser).
	Slices *Slices
	// DRA, when set, is told every good discovery's devices and says
	// which of them other DRA drivers publish: the advertiser keeps the
	// condition kubeinterface.ConditionDRAConflict from it.
	DRA DRA
}

// DRA is what the advertiser learns of other DRA drivers (package
// draclaims implements it).
type DRA interface {
	SetInventory(inv types.Inventory)
	// Overlaps lists the node's devices other drivers publish, and
	// whether the node's slices have been read (no condition is written
	// before).
	Overlaps() ([]dra.Overlap, bool)
}

// Advertiser keeps the node's devices published on its Node: the inventory
// annotation, the extended-resource capacity and, when given one, the
// condition kubeinterface.ConditionDevicesReady. Every interval it
// discovers the devices, reads the Node (from the API server's cache) and
// writes what differs, so a Node that was re-created, or whose inventory or
// capacity something else changed or reset (kubelet resets extended
// resources it does not know on some restarts), is restored within one
// interval. API errors are retried with backoff; nothing is lost, since
// every round publishes the current state.
//
// The advertiser writes nothing periodically: the node's liveness is its
// kubelet's Lease (kubegpu-crishim is kubelet's container runtime, so a
// kubelet that cannot reach the shim reports the node NotReady).
type Advertiser struct {
	opts Options

	mu   sync.Mutex
	last types.Inventory // last good discovery
	good bool            // whether a discovery has succeeded
	// published is the annotation value last written and the UID of the
	// Node it was written on, to tell a change by someone else.
	published    string
	publishedUID string
}

// New checks opts and fills in defaults.
func New(opts Options) (*Advertiser, error) {
	if opts.Node == "" || opts.Client == nil || opts.Discover == nil {
		return nil, errors.New("advertiser: node, client and discovery are required")
	}
	if opts.Interval <= 0 {
		opts.Interval = 10 * time.Second
	}
	if opts.SlicesPerDevice <= 0 {
		opts.SlicesPerDevice = DefaultSlicesPerDevice
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.New()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Condition != nil {
		c := *opts.Condition
		c.Message = boundMessage(c.Message)
		opts.Condition = &c
	}
	return &Advertiser{opts: opts}, nil
}

// Run publishes until ctx ends.
func (a *Advertiser) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithValues("node", a.opts.Node)
	backoff := wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 6, Cap: a.opts.Interval}
	delay := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		if err := a.Once(ctx); err != nil {
			delay = backoff.Step()
			logger.Error(err, "Publishing devices failed; retrying", "in", delay)
			continue
		}
		backoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 6, Cap: a.opts.Interval}
		delay = a.opts.Interval
	}
}

// Once discovers the devices, reads the Node and writes the inventory and
// capacity where the Node differs. A failed discovery keeps the last good
// inventory.
func (a *Advertiser) Once(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	inv, err := a.opts.Discover(ctx)
	a.mu.Lock()
	if err != nil {
		logger.Error(err, "Device discovery failed; keeping the last inventory")
		inv = a.last
	} else {
		a.last, a.good = inv, true
	}
	good := a.good
	published, publishedUID := a.published, a.publishedUID
	a.mu.Unlock()
	// Known to the DRA guard at once: CreateContainer needs it without
	// the API server.
	if a.opts.DRA != nil && good {
		a.opts.DRA.SetInventory(inv)
	}
	inv.KeyIDs = a.opts.KeyIDs
	value, err := kubeinterface.EncodeInventory(inv)
	if err != nil {
		return err
	}
	capacity := Capacity(inv, a.opts.SlicesPerDevice)

	node, err := a.opts.Client.GetNode(ctx, a.opts.Node)
	if err != nil {
		a.opts.Metrics.Syncs.With("error").Inc()
		if apierrors.IsNotFound(err) {
			if a.opts.Slices != nil {
				a.opts.Slices.NodeGone()
			}
			return fmt.Errorf("node %s is not registered yet (its kubelet registers it): %w", a.opts.Node, err)
		}
		return fmt.Errorf("read node %s: %w", a.opts.Node, err)
	}
	// Slices only from a discovery that succeeded: an empty pool would
	// delete what the previous shim published.
	if a.opts.Slices != nil && good {
		a.opts.Slices.Update(ctx, inv, node.UID)
	}
	// The condition first: it says why the inventory may lack devices.
	if want := a.opts.Condition; want != nil && (node.DevicesReady == nil || *node.DevicesReady != *want) {
		transition := node.DevicesReady == nil || node.DevicesReady.Status != want.Status
		if err := patchCondition(ctx, a.opts.Client, a.opts.Node, kubeinterface.ConditionDevicesReady, *want, a.opts.Now(), transition); err != nil {
			a.opts.Metrics.Publishes.With("error").Inc()
			a.opts.Metrics.Syncs.With("error").Inc()
			return err
		}
		a.opts.Metrics.Publishes.With("ok").Inc()
		logger.V(2).Info("Wrote the node's condition", "type", kubeinterface.ConditionDevicesReady, "status", want.Status, "reason", want.Reason)
	}
	if err := a.draCondition(ctx, node); err != nil {
		return err
	}
	if !node.HasInventory || node.Inventory != value {
		if published == value && publishedUID == string(node.UID) {
			a.opts.Metrics.Restores.Inc()
			logger.Info("Node's kubegpu inventory was changed or removed by someone else; restoring it")
		}
		if err := patchInventory(ctx, a.opts.Client, a.opts.Node, value); err != nil {
			a.opts.Metrics.Publishes.With("error").Inc()
			a.opts.Metrics.Syncs.With("error").Inc()
			return err
		}
		a.opts.Metrics.Publishes.With("ok").Inc()
		a.mu.Lock()
		a.published, a.publishedUID = value, string(node.UID)
		a.mu.Unlock()
		logger.V(2).Info("Published device inventory", "devices", len(inv.Devices))
	}
	owned := Owned(capacity, node.Inventory)
	if !node.Capacity.EqualOn(capacity, owned) || !node.Allocatable.EqualOn(capacity, owned) {
		if err := patchCapacity(ctx, a.opts.Client, a.opts.Node, capacity, owned); err != nil {
			a.opts.Metrics.Publishes.With("error").Inc()
			a.opts.Metrics.Syncs.With("error").Inc()
			return err
		}
		a.opts.Metrics.Publishes.With("ok").Inc()
		logger.V(2).Info("Published extended-resource capacity", "capacity", capacity)
	}
	a.opts.Metrics.Syncs.With("ok").Inc()
	return nil
}

// draCondition writes the condition kubeinterface.ConditionDRAConflict
// where the Node's differs from what the DRA guard says; nothing before the
// guard has read the node's slices.
func (a *Advertiser) draCondition(ctx context.Context, node *Node) error {
	if a.opts.DRA == nil {
		return nil
	}
	overlaps, synced := a.opts.DRA.Overlaps()
	if !synced {
		return nil
	}
	want := Condition{Status: "False", Reason: kubeinterface.ReasonNoDRAConflict, Message: "no other DRA driver publishes this node's GPUs"}
	if len(overlaps) > 0 {
		want = Condition{Status: "True", Reason: kubeinterface.ReasonDRAConflict,
			Message: boundMessage(describeOverlaps(overlaps) + ": kubegpu-scheduler places no GPU pods on this node while they do, and kubegpu-crishim refuses containers GPUs that DRA claims hold")}
	}
	if node.DRAConflict != nil && *node.DRAConflict == want {
		return nil
	}
	transition := node.DRAConflict == nil || node.DRAConflict.Status != want.Status
	if err := patchCondition(ctx, a.opts.Client, a.opts.Node, kubeinterface.ConditionDRAConflict, want, a.opts.Now(), transition); err != nil {
		a.opts.Metrics.Publishes.With("error").Inc()
		a.opts.Metrics.Syncs.With("error").Inc()
		return err
	}
	a.opts.Metrics.Publishes.With("ok").Inc()
	klog.FromContext(ctx).Info("Wrote the node's condition", "type", kubeinterface.ConditionDRAConflict, "status", want.Status, "message", want.Message)
	return nil
}

// describeOverlaps names the drivers and the GPUs each publishes.
func describeOverlaps(overlaps []dra.Overlap) string {
	byDriver := map[string][]string{}
	var drivers []string
	for _, o := range overlaps {
		if _, ok := byDriver[o.Driver]; !ok {
			drivers = append(drivers, o.Driver)
		}
		byDriver[o.Driver] = append(byDriver[o.Driver], o.Device)
	}
	slices.Sort(drivers)
	parts := make([]string, len(drivers))
	for i, d := range drivers {
		parts[i] = fmt.Sprintf("DRA driver %s publishes GPUs %s", d, strings.Join(byDriver[d], ", "))
	}
	return strings.Join(parts, "; ")
}

// MergeInventories joins the inventories of several modules.
func MergeInventories(invs ...types.Inventory) (types.Inventory, error) {
	var out types.Inventory
	ids := map[string]bool{}
	for _, inv := range invs {
		for _, d := range inv.Devices {
			if ids[d.ID] {
				return types.Inventory{}, fmt.Errorf("device ID %s is reported by two modules", d.ID)
			}
			ids[d.ID] = true
		}
		out.Devices = append(out.Devices, inv.Devices...)
		out.Links = append(out.Links, inv.Links...)
	}
	return out, nil
}
