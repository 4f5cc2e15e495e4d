package advertiser

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/crishim/metrics"
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
	// Interval is how often devices are discovered and the heartbeat
	// renewed (default 10s).
	Interval time.Duration
	// LeaseDuration is written on the heartbeat Lease (default 40s).
	LeaseDuration time.Duration
	// SlicesPerDevice scales nvidia.com/gpu capacity (see Capacity).
	SlicesPerDevice int
	// Metrics counts publications and heartbeats; optional.
	Metrics *metrics.Shim
}

// Advertiser publishes the node's devices and heartbeat: the inventory and
// capacity when they change (and after the API server comes back), and the
// Lease every interval. API errors are retried with backoff; nothing is
// lost, since every round publishes the current state.
type Advertiser struct {
	opts Options

	mu        sync.Mutex
	published *types.Inventory // what the API has, as far as we know
	last      types.Inventory  // last good discovery
}

// New checks opts and fills in defaults.
func New(opts Options) (*Advertiser, error) {
	if opts.Node == "" || opts.Client == nil || opts.Discover == nil {
		return nil, errors.New("advertiser: node, client and discovery are required")
	}
	if opts.Interval <= 0 {
		opts.Interval = 10 * time.Second
	}
	if opts.LeaseDuration <= 0 {
		opts.LeaseDuration = 40 * time.Second
	}
	if opts.SlicesPerDevice <= 0 {
		opts.SlicesPerDevice = DefaultSlicesPerDevice
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.New()
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

// Once discovers the devices and publishes what changed, then renews the
// heartbeat. A failed discovery keeps the last good inventory.
func (a *Advertiser) Once(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	inv, err := a.opts.Discover(ctx)
	a.mu.Lock()
	if err != nil {
		logger.Error(err, "Device discovery failed; keeping the last inventory")
		inv = a.last
	} else {
		a.last = inv
	}
	changed := a.published == nil || !reflect.DeepEqual(*a.published, inv)
	a.mu.Unlock()
	if changed {
		if err := PublishInventory(ctx, a.opts.Client, a.opts.Node, inv, Capacity(inv, a.opts.SlicesPerDevice)); err != nil {
			a.opts.Metrics.Publishes.With("error").Inc()
			return err
		}
		a.opts.Metrics.Publishes.With("ok").Inc()
		a.mu.Lock()
		a.published = &inv
		a.mu.Unlock()
		logger.V(2).Info("Published device inventory", "devices", len(inv.Devices))
	}
	created, err := renewLease(ctx, a.opts.Client, a.opts.Node, a.opts.LeaseDuration, time.Now())
	if err != nil {
		a.opts.Metrics.Heartbeats.With("error").Inc()
		// Publish the inventory again once the API answers: the node may
		// have been re-created meanwhile.
		a.forget()
		return err
	}
	a.opts.Metrics.Heartbeats.With("ok").Inc()
	if created && !changed {
		// A new Lease means a new Node object (the old Lease went with the
		// old Node): publish again, now.
		a.forget()
		return a.Once(ctx)
	}
	return nil
}

// forget makes the next round publish the inventory again.
func (a *Advertiser) forget() {
	a.mu.Lock()
	a.published = nil
	a.mu.Unlock()
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
