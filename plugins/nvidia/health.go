package nvidia

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
)

// AllInstances is the GPU and compute instance ID of an NVML event about a
// whole GPU rather than one of its MIG devices.
const AllInstances = 0xFFFFFFFF

// waitRetry is how long the watcher waits after NVML failed to wait for
// events, before it tries again.
const waitRetry = time.Second

// healthKey names what an XID hit: a whole GPU (gi = ci = AllInstances) or
// one MIG device, by its GPU and compute instance.
type healthKey struct {
	uuid   string
	gi, ci uint32
}

// health watches NVML for critical XID errors and remembers the devices
// they hit, as NVIDIA's k8s-device-plugin does: a device stays unhealthy
// until the plugin restarts (an XID that matters usually needs a GPU reset).
type health struct {
	set     nvml.EventSet
	ignored map[uint64]bool
	timeout time.Duration
	gpus    []string // UUIDs of the watched GPUs

	mu   sync.Mutex
	sick map[healthKey]string // why

	cancel context.CancelFunc
	done   chan struct{}
}

// startHealth registers every GPU for XID events and starts the watcher. A
// GPU whose XID events cannot be watched is reported unhealthy: nothing
// would tell if it failed. The watcher runs until stop.
func startHealth(ctx context.Context, lib nvml.Interface, gpus []gpuRecord, ignored map[uint64]bool, timeout time.Duration) (*health, error) {
	logger := klog.FromContext(ctx)
	set, ret := lib.EventSetCreate()
	if err := nvmlError("create NVML event set", ret); err != nil {
		return nil, fmt.Errorf("start XID health checks (set %s.%s=false to run without them): %w", Name, OptionHealthChecks, err)
	}
	h := &health{set: set, ignored: ignored, timeout: timeout, sick: map[healthKey]string{}, done: make(chan struct{})}
	for _, g := range gpus {
		h.gpus = append(h.gpus, g.dev.UUID)
		whole := healthKey{g.dev.UUID, AllInstances, AllInstances}
		supported, ret := g.handle.GetSupportedEventTypes()
		if ret != nvml.SUCCESS {
			h.mark(logger, whole, fmt.Sprintf("cannot list its NVML event types: %v", ret))
			continue
		}
		if supported&nvml.EventTypeXidCriticalError == 0 {
			h.mark(logger, whole, "it does not report XID errors")
			continue
		}
		if ret := g.handle.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
			h.mark(logger, whole, fmt.Sprintf("cannot register for its XID errors: %v", ret))
			continue
		}
	}
	ctx, h.cancel = context.WithCancel(ctx)
	go h.run(ctx)
	logger.V(2).Info("Watching GPUs for XID errors", "gpus", len(h.gpus), "ignoredXIDs", FormatXIDs(sortedKeys(ignored)))
	return h, nil
}

// run handles events until ctx is done.
func (h *health) run(ctx context.Context) {
	defer close(h.done)
	logger := klog.FromContext(ctx)
	for ctx.Err() == nil {
		e, ret := h.set.Wait(uint32(h.timeout / time.Millisecond))
		switch {
		case ret == nvml.ERROR_TIMEOUT:
			continue
		case ret != nvml.SUCCESS:
			// Nothing can be known about the GPUs any more.
			h.markAll(logger, fmt.Sprintf("waiting for NVML events failed: %v", ret))
			select {
			case <-ctx.Done():
			case <-time.After(waitRetry):
			}
			continue
		case e.EventType != nvml.EventTypeXidCriticalError:
			continue
		}
		if h.ignored[e.EventData] {
			logger.V(2).Info("Ignoring an XID that does not make a GPU unhealthy", "xid", e.EventData)
			continue
		}
		uuid, ret := e.Device.GetUUID()
		if ret != nvml.SUCCESS {
			h.markAll(logger, fmt.Sprintf("XID %d on a GPU NVML cannot name: %v", e.EventData, ret))
			continue
		}
		key := healthKey{uuid, AllInstances, AllInstances}
		if e.GpuInstanceId != AllInstances && e.ComputeInstanceId != AllInstances {
			key.gi, key.ci = e.GpuInstanceId, e.ComputeInstanceId
		}
		h.mark(logger, key, fmt.Sprintf("critical XID %d", e.EventData))
	}
}

// mark records that key is unhealthy, and why.
func (h *health) mark(logger klog.Logger, key healthKey, why string) {
	h.mu.Lock()
	_, known := h.sick[key]
	if !known {
		h.sick[key] = why
	}
	h.mu.Unlock()
	if known {
		return
	}
	if key.gi == AllInstances {
		logger.Error(nil, "GPU is unhealthy", "uuid", key.uuid, "reason", why)
	} else {
		logger.Error(nil, "MIG device is unhealthy", "gpuUUID", key.uuid, "gpuInstance", key.gi, "computeInstance", key.ci, "reason", why)
	}
}

func (h *health) markAll(logger klog.Logger, why string) {
	for _, uuid := range h.gpus {
		h.mark(logger, healthKey{uuid, AllInstances, AllInstances}, why)
	}
}

// unhealthy reports whether the GPU uuid (gi = ci = AllInstances) or its MIG
// device (gi, ci) was hit, and why. A nil health knows of nothing.
func (h *health) unhealthy(uuid string, gi, ci uint32) (string, bool) {
	if h == nil {
		return "", false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	why, ok := h.sick[healthKey{uuid, gi, ci}]
	return why, ok
}

// stop stops the watcher and frees the event set. It waits for the current
// wait for events to end (up to the timeout).
func (h *health) stop() error {
	h.cancel()
	<-h.done
	return nvmlError("free NVML event set", h.set.Free())
}

func sortedKeys(m map[uint64]bool) []uint64 {
	return slices.Sorted(maps.Keys(m))
}
