package rewrite

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubegpu/kubegpu/types"
)

// What reaches a GPU in a container config, besides the allocation: the
// shim removes all of it (Strip) before adding exactly the allocation.

// GPUDevicePrefix is the path prefix of the NVIDIA driver's device nodes
// (/dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-caps/...).
const GPUDevicePrefix = "/dev/nvidia"

// DeviceListMountDirs are the container paths under which the NVIDIA
// container runtime reads device selections from volume mounts
// (accept-nvidia-visible-devices-as-volume-mounts).
var DeviceListMountDirs = []string{"/var/run/nvidia-container-devices", "/run/nvidia-container-devices"}

// CDIAnnotationPrefix is the prefix of the container annotations that
// containerd and CRI-O read CDI device names from.
const CDIAnnotationPrefix = "cdi.k8s.io/"

// gpuCDIVendors are the CDI vendors of GPU devices: NVIDIA's (nvidia-ctk's
// nvidia.com/gpu, the DRA driver's k8s.gpu.nvidia.com/...), AMD's
// (amd-ctk's amd.com/gpu, the DRA driver's gpu.amd.com/...) and kubegpu's
// own.
var gpuCDIVendors = []string{"nvidia.com", ".nvidia.com", "amd.com", ".amd.com", "kubegpu.io", ".kubegpu.io"}

// SelectionEnv are the NVIDIA container runtime's variables that select
// devices, other than NVIDIA_VISIBLE_DEVICES (which a module always sets):
// MIG control, IMEX channels and the NVSwitches' device nodes.
// Baseline sets them empty, so that neither the pod nor the image selects
// a device through them.
var SelectionEnv = []string{"NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES", "NVIDIA_IMEX_CHANNELS", "NVIDIA_NVSWITCH"}

// Stripped says what Strip removed from a container config.
type Stripped struct {
	DeviceNodes []string `json:"deviceNodes,omitempty"`
	Mounts      []string `json:"mounts,omitempty"`
	CDIDevices  []string `json:"cdiDevices,omitempty"`
}

// Empty reports whether nothing was removed.
func (s Stripped) Empty() bool {
	return len(s.DeviceNodes)+len(s.Mounts)+len(s.CDIDevices) == 0
}

// IsGPUDevicePath reports whether p (a host or container path) is one of
// the NVIDIA driver's device nodes.
func IsGPUDevicePath(p string) bool {
	if p == "" {
		return false
	}
	return strings.HasPrefix(path.Clean("/"+p), GPUDevicePrefix)
}

// reachesGPU reports whether a host path given as a container device is,
// or (a directory, which the runtime expands to every device in it) holds,
// a device node of the NVIDIA driver's character majors or one the modules
// guard (g). The walk of a directory stops after maxDeviceWalk entries,
// and counts as holding one.
func reachesGPU(hostPath string, majors map[uint32]bool, g guarded) bool {
	if hostPath == "" {
		return false
	}
	// The runtime follows links; so does the check.
	real, err := filepath.EvalSymlinks(hostPath)
	if err != nil {
		return false
	}
	fi, err := os.Stat(real)
	if err != nil {
		return false
	}
	if !fi.IsDir() {
		return isGPUCharDevice(fi, majors) || g.holds(fi)
	}
	dir := filepath.Clean(real)
	for _, n := range append(HostGPUNodes("/dev"), g.hostPaths...) {
		if _, ok := under(n, dir); ok {
			return true
		}
	}
	found, seen := false, 0
	_ = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		seen++
		if found || seen > maxDeviceWalk {
			found = true
			return fs.SkipAll
		}
		if err == nil && e.Type()&fs.ModeCharDevice != 0 {
			if fi, err := os.Stat(p); err == nil && (isGPUCharDevice(fi, majors) || g.holds(fi)) {
				found = true
			}
		}
		return nil
	})
	return found
}

// guarded are the device nodes the modules guard
// (types.GuardedNodesPlugin): their paths, and the device numbers of
// those that exist on the host, so that a node is found under any name.
type guarded struct {
	hostPaths, containerPaths []string
	devices                   map[uint64]bool
}

func newGuarded(nodes []types.DeviceNode) guarded {
	g := guarded{devices: map[uint64]bool{}}
	for _, n := range nodes {
		if n.HostPath != "" {
			g.hostPaths = append(g.hostPaths, filepath.Clean(n.HostPath))
			if fi, err := os.Stat(n.HostPath); err == nil && fi.Mode()&fs.ModeCharDevice != 0 {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					g.devices[st.Rdev] = true
				}
			}
		}
		if n.ContainerPath != "" {
			g.containerPaths = append(g.containerPaths, path.Clean("/"+n.ContainerPath))
		}
	}
	return g
}

// holds reports whether fi is a character device the modules guard.
func (g guarded) holds(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && fi.Mode()&fs.ModeCharDevice != 0 && g.devices[st.Rdev]
}

// names reports whether a device entry names a guarded node by its host
// or container path.
func (g guarded) names(hostPath, containerPath string) bool {
	return (hostPath != "" && slices.Contains(g.hostPaths, filepath.Clean(hostPath))) ||
		(containerPath != "" && slices.Contains(g.containerPaths, path.Clean("/"+containerPath)))
}

// maxDeviceWalk bounds the walk of a directory given as a device.
const maxDeviceWalk = 4096

// nvidiaMajor is the NVIDIA driver's character-device major (/dev/nvidia0,
// /dev/nvidiactl).
const nvidiaMajor = 195

// gpuMajors are the character-device majors of the host's /dev/nvidia*
// nodes: 195, and nvidia-uvm's and nvidia-caps' dynamic ones.
func gpuMajors() map[uint32]bool {
	out := map[uint32]bool{nvidiaMajor: true}
	for _, n := range HostGPUNodes("/dev") {
		if fi, err := os.Stat(n); err == nil && fi.Mode()&fs.ModeCharDevice != 0 {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				out[unix.Major(st.Rdev)] = true
			}
		}
	}
	return out
}

func isGPUCharDevice(fi fs.FileInfo, majors map[uint32]bool) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && fi.Mode()&fs.ModeCharDevice != 0 && majors[unix.Major(st.Rdev)]
}

// isDeviceListMount reports whether container path p is where the NVIDIA
// container runtime reads a device selection from.
func isDeviceListMount(p string) bool {
	p = path.Clean("/" + p)
	return slices.ContainsFunc(DeviceListMountDirs, func(dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") })
}

// gpuCDIKinds are the CDI kinds of GPU devices of vendors whose other
// devices are no GPUs: Intel's GPUs (intel.com/gpu, and its DRA
// driver's), not its accelerators or QAT devices.
var gpuCDIKinds = []string{"intel.com/gpu", ".intel.com/gpu"}

// IsGPUCDIDevice reports whether a fully qualified CDI device name
// (vendor/class=name) is a GPU's.
func IsGPUCDIDevice(name string) bool {
	kind, _, _ := strings.Cut(name, "=")
	kind = strings.ToLower(strings.TrimSpace(kind))
	vendor, _, _ := strings.Cut(kind, "/")
	match := func(v, s string) bool {
		if strings.HasPrefix(v, ".") {
			return strings.HasSuffix(s, v)
		}
		return s == v
	}
	return slices.ContainsFunc(gpuCDIVendors, func(v string) bool { return match(v, vendor) }) ||
		slices.ContainsFunc(gpuCDIKinds, func(k string) bool { return match(k, kind) })
}

// Strip removes from cfg every way to a GPU that the shim did not add: the
// NVIDIA driver's device nodes and those the modules guard (nodes, from
// Rewriter.Guarded), mounts of them or of the NVIDIA runtime's
// device-list paths, and GPU CDI devices, in the config's fields and in
// its CDI annotations, but for the CDI devices named in keep: those of the
// pod's prepared DRA claims, which kubelet adds. Env variables are not
// touched here: the edits (Baseline and the modules') replace them. It
// changes cfg in place.
func Strip(cfg *runtimeapi.ContainerConfig, keep []string, nodes []types.DeviceNode) Stripped {
	var s Stripped
	g := newGuarded(nodes)
	var majors map[uint32]bool // read once, if a device entry needs it
	cfg.Devices = slices.DeleteFunc(cfg.Devices, func(d *runtimeapi.Device) bool {
		if IsGPUDevicePath(d.GetHostPath()) || IsGPUDevicePath(d.GetContainerPath()) || g.names(d.GetHostPath(), d.GetContainerPath()) {
			s.DeviceNodes = append(s.DeviceNodes, d.GetHostPath())
			return true
		}
		if majors == nil {
			majors = gpuMajors()
		}
		if reachesGPU(d.GetHostPath(), majors, g) {
			s.DeviceNodes = append(s.DeviceNodes, d.GetHostPath())
			return true
		}
		return false
	})
	cfg.Mounts = slices.DeleteFunc(cfg.Mounts, func(m *runtimeapi.Mount) bool {
		if IsGPUDevicePath(m.GetHostPath()) || isDeviceListMount(m.GetContainerPath()) || g.names(m.GetHostPath(), "") {
			s.Mounts = append(s.Mounts, m.GetHostPath()+":"+m.GetContainerPath())
			return true
		}
		return false
	})
	cfg.CDIDevices = slices.DeleteFunc(cfg.CDIDevices, func(d *runtimeapi.CDIDevice) bool {
		if IsGPUCDIDevice(d.GetName()) && !slices.Contains(keep, d.GetName()) {
			s.CDIDevices = append(s.CDIDevices, d.GetName())
			return true
		}
		return false
	})
	s.CDIDevices = append(s.CDIDevices, StripCDIAnnotations(cfg.Annotations, keep)...)
	return s
}

// HasCDIAnnotations reports whether m has a cdi.k8s.io/* annotation.
func HasCDIAnnotations(m map[string]string) bool {
	for k := range m {
		if strings.HasPrefix(k, CDIAnnotationPrefix) {
			return true
		}
	}
	return false
}

// StripCDIAnnotations removes GPU CDI device names but those in keep from
// the cdi.k8s.io/* annotations in m (in place) and returns them.
func StripCDIAnnotations(m map[string]string, keep []string) []string {
	strip := func(n string) bool { return IsGPUCDIDevice(n) && !slices.Contains(keep, n) }
	var removed []string
	for k, v := range m {
		if !strings.HasPrefix(k, CDIAnnotationPrefix) {
			continue
		}
		names := strings.Split(v, ",")
		kept := slices.DeleteFunc(slices.Clone(names), strip)
		if len(kept) == len(names) {
			continue
		}
		for _, n := range names {
			if strip(n) {
				removed = append(removed, n)
			}
		}
		if len(kept) == 0 {
			delete(m, k)
		} else {
			m[k] = strings.Join(kept, ",")
		}
	}
	return removed
}

// MaskSource is the host file bound over GPU device nodes in privileged
// containers.
const MaskSource = "/dev/null"

// Privileged reports whether the container asks to be privileged.
func Privileged(cfg *runtimeapi.ContainerConfig) bool {
	return cfg.GetLinux().GetSecurityContext().GetPrivileged()
}

// Masks are the mounts that hide the host's GPU device nodes (hostNodes,
// absolute paths under /dev) from a privileged container, whose runtime
// otherwise gives it every host device: MaskSource bound read-only over
// each node, at its own path and under every mount of a directory that
// holds it (a hostPath of /dev or /). They hide the nodes; they are no
// wall against a privileged process, which may create device nodes itself.
func Masks(cfg *runtimeapi.ContainerConfig, hostNodes []string) []*runtimeapi.Mount {
	seen := map[string]bool{}
	var out []*runtimeapi.Mount
	add := func(p string) {
		p = path.Clean(p)
		if !seen[p] {
			seen[p] = true
			out = append(out, &runtimeapi.Mount{HostPath: MaskSource, ContainerPath: p, Readonly: true})
		}
	}
	for _, node := range hostNodes {
		add(node)
		for _, m := range cfg.GetMounts() {
			host := path.Clean("/" + m.GetHostPath())
			if rel, ok := under(node, host); ok && m.GetContainerPath() != "" {
				add(path.Join(m.GetContainerPath(), rel))
			}
		}
	}
	return out
}

// under returns p relative to dir if p is dir or below it.
func under(p, dir string) (string, bool) {
	if dir == "/" {
		return p, true
	}
	if p == dir {
		return "", true
	}
	rel, ok := strings.CutPrefix(p, dir+"/")
	return rel, ok
}

// HostGPUNodes lists the NVIDIA device nodes under devRoot (normally
// "/dev"), as paths under /dev: the driver's /dev/nvidia* and the
// capability nodes in its /dev/nvidia-caps* directories. A node with no
// NVIDIA driver has none.
func HostGPUNodes(devRoot string) []string {
	var out []string
	entries, _ := filepath.Glob(filepath.Join(devRoot, "nvidia*"))
	for _, e := range entries {
		fi, err := os.Lstat(e)
		if err != nil {
			continue
		}
		rel := "/dev/" + filepath.Base(e)
		if !fi.IsDir() {
			out = append(out, rel)
			continue
		}
		sub, _ := os.ReadDir(e)
		for _, s := range sub {
			if !s.IsDir() {
				out = append(out, rel+"/"+s.Name())
			}
		}
	}
	return out
}
