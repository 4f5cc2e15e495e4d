package nvidia

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/plugins/nvidia/nvmllib"
	"github.com/kubegpu/kubegpu/types"
)

// Name is the module's name; its options are given as nvidia.KEY=VALUE.
const Name = "nvidia"

// Vendor is the Device.Vendor of NVIDIA GPUs and their MIG devices.
const Vendor = types.VendorNVIDIA

// ErrNoNVML is wrapped by NodePlugin's error when NVML cannot be used on
// this node: the library is missing, the kernel driver is not loaded, or
// NVML does not initialise. The error says which. It matches
// types.ErrNoDevices too, so that a host skips the module ("this node has no
// NVIDIA GPUs to offer") and carries on with its other modules.
var ErrNoNVML error = noNVMLError{}

type noNVMLError struct{}

func (noNVMLError) Error() string { return "NVML is not available on this node" }

// Is makes errors.Is(err, types.ErrNoDevices) true.
func (noNVMLError) Is(target error) bool { return target == types.ErrNoDevices }

// defaultEventTimeout is how long one wait for NVML events lasts; Close
// takes up to this long.
const defaultEventTimeout = 5 * time.Second

// NewModule returns the NVIDIA module on the node's NVML library.
func NewModule() types.Module {
	return &module{newLibrary: openLibrary, eventTimeout: defaultEventTimeout, sysfs: "/sys"}
}

// NewModuleWithNVML returns the NVIDIA module on lib instead of the node's
// NVML library (e.g. a mock machine of package nvmltest). The option
// nvidia.nvml-library is then rejected.
func NewModuleWithNVML(lib nvml.Interface) types.Module {
	return &module{
		newLibrary: func(path string) (nvml.Interface, error) {
			if path != nvmllib.DefaultPath {
				return nil, fmt.Errorf("option %s.%s: this module was built on a given NVML", Name, OptionNVMLLibrary)
			}
			return lib, nil
		},
		eventTimeout: defaultEventTimeout,
		sysfs:        "/sys",
	}
}

// openLibrary binds go-nvml to the library at path; see package nvmllib.
func openLibrary(path string) (nvml.Interface, error) {
	if _, err := nvmllib.Open(path); err != nil {
		return nil, err
	}
	return nvml.New(nvml.WithLibraryPath(path)), nil
}

type module struct {
	// newLibrary returns the NVML to use, from the library's path.
	newLibrary func(path string) (nvml.Interface, error)
	// eventTimeout bounds one wait for NVML events.
	eventTimeout time.Duration
	// sysfs is where sysfs is mounted, for NUMA nodes older drivers do not
	// report.
	sysfs string
}

var _ types.Module = (*module)(nil)

func (m *module) Name() string { return Name }

// SchedulerPlugin returns the scheduler side. It takes no options and
// never touches NVML.
func (m *module) SchedulerPlugin(_ context.Context, cfg types.PluginConfig) (types.SchedulerPlugin, error) {
	for k := range cfg.Options {
		return nil, fmt.Errorf("%s: option %s.%s: the scheduler side takes no options", Name, Name, k)
	}
	return scheduler{}, nil
}

// DriverMemoryLimits is the NVML function of newer drivers that caps a
// cgroup's GPU memory, the driver's own per-container limit. go-nvml
// v0.13.2 does not bind it; the module reports a driver that has it.
const DriverMemoryLimits = "nvmlDeviceSetMemoryLimits_v1"

// NodePlugin initialises NVML, discovers the node's GPUs once and, unless
// health checks are off, starts watching for XID errors. An error wrapping
// ErrNoNVML means NVML is not usable here.
func (m *module) NodePlugin(ctx context.Context, cfg types.PluginConfig) (types.NodePlugin, error) {
	c, err := parseNodeOptions(cfg.Options)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	var mps *mpsDaemons
	if c.mps {
		if mps, err = newMPSDaemons(c); err != nil {
			return nil, fmt.Errorf("%s: %w", Name, err)
		}
		// In the background: a daemon that answers slowly must not hold
		// up the node's CRI.
		go func() {
			restoreCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
			defer cancel()
			mps.restore(restoreCtx)
		}()
	}
	lib, err := m.newLibrary(c.library)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w; install the NVIDIA driver, or set %s.%s to libnvidia-ml's path",
			Name, ErrNoNVML, err, Name, OptionNVMLLibrary)
	}
	if err := initNVML(lib, c.library); err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	logger := klog.FromContext(ctx)
	n := newNode(lib, c, m.sysfs)
	n.mps = mps
	fail := func(err error) (types.NodePlugin, error) {
		if ret := lib.Shutdown(); ret != nvml.SUCCESS {
			logger.Error(ret, "Shutting NVML down after a failed start")
		}
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	inv, err := n.Discover(ctx)
	if err != nil {
		return fail(err)
	}
	if c.healthChecks {
		// The watcher outlives this call: it stops on Close, not when
		// ctx is done.
		h, err := startHealth(context.WithoutCancel(ctx), lib, n.answeringGPUs(), c.ignoredXIDs, m.eventTimeout)
		if err != nil {
			return fail(err)
		}
		n.setHealth(h)
	}
	if nvmllib.Has(DriverMemoryLimits) {
		driver, _ := lib.SystemGetDriverVersion()
		logger.Info("The NVIDIA driver offers per-cgroup GPU memory limits, which this version does not use: slices are enforced by MPS (nvidia.mps=true) or not at all",
			"driver", driver, "function", DriverMemoryLimits)
	}
	if logger.V(2).Enabled() {
		driver, _ := lib.SystemGetDriverVersion()
		logger.V(2).Info("NVIDIA GPUs ready", "driver", driver, "devices", len(inv.Devices),
			"edits", editsMode(c), "mps", c.mps, "healthChecks", c.healthChecks, "ignoredXIDs", FormatXIDs(sortedKeys(c.ignoredXIDs)))
	}
	return n, nil
}

// initNVML initialises lib and says what is missing when it cannot.
func initNVML(lib nvml.Interface, path string) error {
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return fmt.Errorf("%w: %s not found; install the NVIDIA driver, or set %s.%s to libnvidia-ml's path: %w",
			ErrNoNVML, path, Name, OptionNVMLLibrary, ret)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("%w: the NVIDIA kernel driver is not loaded (is the nvidia module loaded and /dev/nvidiactl present?): %w", ErrNoNVML, ret)
	case nvml.ERROR_NO_PERMISSION:
		return fmt.Errorf("%w: no permission to use the GPUs (the process needs /dev/nvidiactl and /dev/nvidia*): %w", ErrNoNVML, ret)
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return fmt.Errorf("%w: libnvidia-ml does not match the loaded kernel driver (driver upgraded without a reboot?): %w", ErrNoNVML, ret)
	default:
		return fmt.Errorf("%w: initialize NVML: %w", ErrNoNVML, ret)
	}
}

func editsMode(c config) string {
	switch {
	case c.cdi && c.cdiByIndex:
		return "cdi (index names)"
	case c.cdi:
		return "cdi (uuid names)"
	default:
		return "env"
	}
}

// nvmlError returns nil for SUCCESS, else ret wrapped with what failed.
func nvmlError(op string, ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return fmt.Errorf("%s: %w", op, ret)
}

// unsupported reports whether ret says the driver or GPU lacks a feature.
func unsupported(ret nvml.Return) bool {
	return ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_FUNCTION_NOT_FOUND
}

// normalizeBusID turns a PCI bus ID as NVML writes it ("00000000:07:00.0")
// into the form sysfs uses ("0000:07:00.0").
func normalizeBusID(s string) (string, error) {
	bad := fmt.Errorf("malformed PCI bus ID %q", s)
	domain, rest, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok {
		return "", bad
	}
	bus, rest, ok := strings.Cut(rest, ":")
	if !ok {
		return "", bad
	}
	dev, fn, ok := strings.Cut(rest, ".")
	if !ok {
		return "", bad
	}
	var v [4]uint64
	for i, part := range []string{domain, bus, dev, fn} {
		x, err := strconv.ParseUint(part, 16, 32)
		if err != nil || len(part) > 8 {
			return "", bad
		}
		v[i] = x
	}
	if v[0] > 0xffff || v[1] > 0xff || v[2] > 0x1f || v[3] > 7 {
		return "", bad
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", v[0], v[1], v[2], v[3]), nil
}

// cString turns a NUL-terminated C char array into a string.
func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
