package nvidia

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/kubegpu/kubegpu/plugins/nvidia/nvmllib"
	"github.com/kubegpu/kubegpu/types"
)

// Options of the node side, given as --plugin-option nvidia.KEY=VALUE. The
// scheduler side takes none.
const (
	// OptionEdits says how containers get their GPUs: "cdi" (the default)
	// names CDI devices from nvidia-ctk's generated spec for a CDI-enabled
	// runtime (containerd 2.x; 1.7 with enable_cdi; CRI-O); "env" sets
	// NVIDIA_VISIBLE_DEVICES for the NVIDIA container runtime, for runtimes
	// without CDI. With cdi, a container created around the shim gets no
	// GPU; with env, one created under nvidia-container-runtime gets what
	// its image asks for (CUDA images: all): env fails open.
	OptionEdits = "edits"
	// OptionCDIDeviceNames is how CDI devices are named with edits=cdi:
	// "uuid" (the default; nvidia.com/gpu=GPU-..., nvidia.com/gpu=MIG-...)
	// or "index" (nvidia.com/gpu=3, nvidia.com/gpu=3:1). Recent nvidia-ctk
	// cdi generate versions write both by default; older ones wrote index
	// names only unless run with --device-name-strategy=uuid.
	OptionCDIDeviceNames = "cdi-device-names"
	// OptionMPS is "true" to give shared slices MPS memory and compute
	// limits: each container with slices gets an MPS control daemon of its
	// own, started by the shim for the container's GPUs, with its own pipe
	// directory and /dev/shm under OptionMPSRoot, and stopped once its pod
	// is gone. Tenants so never share an MPS daemon or shared memory.
	OptionMPS = "mps"
	// OptionMPSRoot is the directory the per-container MPS directories are
	// made in; the module makes it root-owned with mode 0700. Default
	// DefaultMPSRoot.
	OptionMPSRoot = "mps-root"
	// OptionMPSControl is the MPS control binary (default
	// DefaultMPSControl, looked up in PATH).
	OptionMPSControl = "mps-control"
	// OptionMPSShmMiB is the size of the /dev/shm each container with MPS
	// slices shares with its daemon, in MiB (default DefaultMPSShmMiB).
	OptionMPSShmMiB = "mps-shm-mib"
	// OptionHealthChecks is "true" (the default) to watch NVML for critical
	// XID errors and report the GPUs they hit unhealthy.
	OptionHealthChecks = "health-checks"
	// OptionIgnoreXIDs lists the XIDs that do not make a GPU unhealthy; see
	// ParseXIDs. Default "default" (DefaultIgnoredXIDs).
	OptionIgnoreXIDs = "ignore-xids"
	// OptionNVMLLibrary is the path of libnvidia-ml, for drivers installed
	// outside the loader's search path (e.g. a driver container's root).
	// Default nvmllib.DefaultPath.
	OptionNVMLLibrary = "nvml-library"
)

// MPS defaults.
const (
	DefaultMPSRoot    = "/run/kubegpu/mps"
	DefaultMPSControl = "nvidia-cuda-mps-control"
	// MPSContainerPipeDir is where a container finds its MPS daemon's pipe
	// directory: CUDA's default, so that clients need no setting.
	MPSContainerPipeDir = "/tmp/nvidia-mps"
)

var nodeOptions = []string{
	OptionEdits, OptionCDIDeviceNames, OptionMPS, OptionMPSRoot, OptionMPSControl, OptionMPSShmMiB,
	OptionHealthChecks, OptionIgnoreXIDs, OptionNVMLLibrary,
}

// removedOptions are options of earlier versions, with what replaced them.
var removedOptions = map[string]string{
	"mps-pipe-dir": "each container with MPS slices now gets an MPS daemon of its own, started by the shim under " + OptionMPSRoot + "; stop the node's shared MPS daemon and remove the option",
	"mps-shm-dir":  "each container's MPS daemon now has a /dev/shm of its own under " + OptionMPSRoot + "; remove the option",
}

// DefaultIgnoredXIDs are the XIDs NVIDIA's k8s-device-plugin ignores: errors
// of the application, not of the GPU.
//
//	13  graphics engine exception
//	31  GPU memory page fault
//	43  GPU stopped processing
//	45  preemptive cleanup, due to previous errors
//	68  video processor exception
//	109 context switch timeout
var DefaultIgnoredXIDs = []uint64{13, 31, 43, 45, 68, 109}

// MaxXID bounds the XIDs ParseXIDs accepts.
const MaxXID = 65535

// ErrInvalidXIDs is wrapped by every error of ParseXIDs.
var ErrInvalidXIDs = errors.New("invalid XID list")

// ParseXIDs parses a list of XIDs: comma-separated decimal numbers 1..MaxXID
// and the word "default", which stands for DefaultIgnoredXIDs (so
// "default,94" adds XID 94 to them); or "none" alone for the empty list. The
// result is sorted, without duplicates.
func ParseXIDs(s string) ([]uint64, error) {
	if strings.TrimSpace(s) == "none" {
		return []uint64{}, nil
	}
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		switch f {
		case "":
			return nil, fmt.Errorf("%w %q: empty entry", ErrInvalidXIDs, s)
		case "default":
			out = append(out, DefaultIgnoredXIDs...)
		case "none":
			return nil, fmt.Errorf("%w %q: none must stand alone", ErrInvalidXIDs, s)
		default:
			x, err := strconv.ParseUint(f, 10, 64)
			if err != nil || x < 1 || x > MaxXID {
				return nil, fmt.Errorf("%w %q: %q is not an XID (a number 1..%d, default or none)", ErrInvalidXIDs, s, f, MaxXID)
			}
			out = append(out, x)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// FormatXIDs is the inverse of ParseXIDs.
func FormatXIDs(xids []uint64) string {
	if len(xids) == 0 {
		return "none"
	}
	s := make([]string, len(xids))
	for i, x := range xids {
		s[i] = strconv.FormatUint(x, 10)
	}
	return strings.Join(s, ",")
}

// config is the node side's parsed options.
type config struct {
	cdi          bool
	cdiByIndex   bool
	mps          bool
	mpsRoot      string
	mpsControl   string
	mpsShmMiB    int
	healthChecks bool
	ignoredXIDs  map[uint64]bool
	library      string
}

// parseNodeOptions checks the node side's options and applies defaults.
func parseNodeOptions(opts map[string]string) (config, error) {
	for k := range opts {
		if why, ok := removedOptions[k]; ok {
			return config{}, fmt.Errorf("option %s.%s was removed: %s", Name, k, why)
		}
	}
	if err := (types.PluginConfig{Options: opts}).CheckOptions(Name, nodeOptions...); err != nil {
		return config{}, err
	}
	c := config{cdi: true, mpsRoot: DefaultMPSRoot, mpsControl: DefaultMPSControl, mpsShmMiB: DefaultMPSShmMiB, healthChecks: true, library: nvmllib.DefaultPath}
	bad := func(key, want string) error {
		return fmt.Errorf("option %s.%s must be %s, got %q", Name, key, want, opts[key])
	}
	switch opts[OptionEdits] {
	case "", "cdi":
	case "env":
		c.cdi = false
	default:
		return config{}, bad(OptionEdits, "env or cdi")
	}
	if v, ok := opts[OptionCDIDeviceNames]; ok {
		if !c.cdi {
			return config{}, fmt.Errorf("option %s.%s needs %s.%s=cdi", Name, OptionCDIDeviceNames, Name, OptionEdits)
		}
		switch v {
		case "uuid":
		case "index":
			c.cdiByIndex = true
		default:
			return config{}, bad(OptionCDIDeviceNames, "uuid or index")
		}
	}
	var err error
	if v, ok := opts[OptionMPS]; ok {
		if c.mps, err = strconv.ParseBool(v); err != nil {
			return config{}, bad(OptionMPS, "true or false")
		}
	}
	if v, ok := opts[OptionMPSShmMiB]; ok {
		if !c.mps {
			return config{}, fmt.Errorf("option %s.%s needs %s.%s=true", Name, OptionMPSShmMiB, Name, OptionMPS)
		}
		if c.mpsShmMiB, err = strconv.Atoi(v); err != nil || c.mpsShmMiB < 1 || c.mpsShmMiB > 1<<20 {
			return config{}, bad(OptionMPSShmMiB, "a size in MiB, 1..1048576")
		}
	}
	for _, key := range []string{OptionMPSRoot, OptionMPSControl} {
		v, ok := opts[key]
		if !ok {
			continue
		}
		if !c.mps {
			return config{}, fmt.Errorf("option %s.%s needs %s.%s=true", Name, key, Name, OptionMPS)
		}
		switch {
		case key == OptionMPSRoot && (!filepath.IsAbs(v) || filepath.Clean(v) != v || v == "/"):
			return config{}, bad(key, "a clean absolute path other than /")
		case key == OptionMPSRoot:
			c.mpsRoot = v
		case v == "":
			return config{}, bad(key, "the path or name of nvidia-cuda-mps-control")
		default:
			c.mpsControl = v
		}
	}
	if v, ok := opts[OptionHealthChecks]; ok {
		if c.healthChecks, err = strconv.ParseBool(v); err != nil {
			return config{}, bad(OptionHealthChecks, "true or false")
		}
	}
	xids := DefaultIgnoredXIDs
	if v, ok := opts[OptionIgnoreXIDs]; ok {
		if !c.healthChecks {
			return config{}, fmt.Errorf("option %s.%s has no effect with %s.%s=false", Name, OptionIgnoreXIDs, Name, OptionHealthChecks)
		}
		if xids, err = ParseXIDs(v); err != nil {
			return config{}, fmt.Errorf("option %s.%s: %w", Name, OptionIgnoreXIDs, err)
		}
	}
	c.ignoredXIDs = make(map[uint64]bool, len(xids))
	for _, x := range xids {
		c.ignoredXIDs[x] = true
	}
	if v, ok := opts[OptionNVMLLibrary]; ok {
		if v == "" {
			return config{}, bad(OptionNVMLLibrary, "the path of libnvidia-ml")
		}
		c.library = v
	}
	return c, nil
}
