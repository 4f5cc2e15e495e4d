package nvidia

import (
	"errors"
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kubegpu/kubegpu/types"
)

// node is the node side: NVML discovery, health and container edits.
type node struct {
	lib   nvml.Interface
	cfg   config
	sysfs string
	// procRoot is where procfs is mounted (/proc), for the processes on
	// an MPS slice's GPUs.
	procRoot string
	// mps starts the containers' MPS daemons (nil without MPS).
	mps *mpsDaemons

	// discoverMu serialises Discover, which owns the fields below it.
	discoverMu sync.Mutex
	// known is the last discovery's GPUs by NVML index, to report a GPU
	// that fell off the bus.
	known map[int]gpuRecord
	// links caches the path between two GPUs by their UUIDs: hardware
	// topology does not change while the node runs.
	links map[[2]string]types.Link
	// noticed remembers the conditions already logged, so that periodic
	// discovery logs them once: MIG-mode GPUs without MIG devices (by
	// UUID), NVSwitch fabrics without peer-to-peer (noticeNoP2P).
	noticed map[string]bool

	// mu guards the published state below.
	mu sync.RWMutex
	// devices is the last inventory's devices by ID, for ContainerEdits.
	devices map[string]deviceEntry
	// answering are the last discovery's GPUs that answer NVML, advertised
	// or not (a GPU in MIG mode without MIG devices is not).
	answering []gpuRecord
	health    *health

	closeOnce sync.Once
	closeErr  error
}

// gpuRecord is what one discovery learned about a whole GPU.
type gpuRecord struct {
	handle nvml.Device
	dev    types.Device
	// migEnabled is true when the GPU is in MIG mode.
	migEnabled bool
	migs       []migRecord
	// lost is true when the GPU stopped answering (ERROR_GPU_IS_LOST) and
	// dev and migs are from an earlier discovery.
	lost bool
}

// migRecord is one MIG device.
type migRecord struct {
	dev types.Device
	// index is the MIG device's index on its GPU, as NVML and nvidia-ctk's
	// index names ("3:1") count.
	index  int
	gi, ci uint32
}

// deviceEntry is what ContainerEdits needs about one device of the inventory.
type deviceEntry struct {
	dev types.Device
	// migIndex is the MIG device's index on its GPU; -1 for a whole GPU.
	migIndex int
	// parent is true for a GPU in MIG mode: it is given out only through
	// its MIG devices.
	parent bool
}

func newNode(lib nvml.Interface, c config, sysfs string) *node {
	return &node{
		lib: lib, cfg: c, sysfs: sysfs, procRoot: "/proc",
		known:   map[int]gpuRecord{},
		links:   map[[2]string]types.Link{},
		noticed: map[string]bool{},
	}
}

var (
	_ types.NodePlugin      = (*node)(nil)
	_ types.PodScopedPlugin = (*node)(nil)
)

func (n *node) setHealth(h *health) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.health = h
}

// answeringGPUs returns the last discovery's GPUs that answer NVML,
// advertised or not.
func (n *node) answeringGPUs() []gpuRecord {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.answering
}

// Close stops the health watcher and shuts NVML down.
func (n *node) Close() error {
	n.closeOnce.Do(func() {
		n.mu.Lock()
		h := n.health
		n.health = nil
		n.mu.Unlock()
		var errs []error
		if h != nil {
			if err := h.stop(); err != nil {
				errs = append(errs, err)
			}
		}
		if err := nvmlError("shut NVML down", n.lib.Shutdown()); err != nil {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			n.closeErr = fmt.Errorf("%s: %w", Name, err)
		}
	})
	return n.closeErr
}
