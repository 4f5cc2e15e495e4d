package rewrite

import (
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
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
// nvidia.com/gpu, the DRA driver's k8s.gpu.nvidia.com/...) and kubegpu's own.
var gpuCDIVendors = []string{"nvidia.com", ".nvidia.com", "kubegpu.io", ".kubegpu.io"}

// SelectionEnv are the NVIDIA container runtime's variables that select
// devices, other than NVIDIA_VISIBLE_DEVICES (which a module always sets).
// Baseline sets them empty, so that neither the pod nor the image selects
// a device through them.
var SelectionEnv = []string{"NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES", "NVIDIA_IMEX_CHANNELS"}

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

// isDeviceListMount reports whether container path p is where the NVIDIA
// container runtime reads a device selection from.
func isDeviceListMount(p string) bool {
	p = path.Clean("/" + p)
	return slices.ContainsFunc(DeviceListMountDirs, func(dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") })
}

// IsGPUCDIDevice reports whether a fully qualified CDI device name
// (vendor/class=name) is a GPU's.
func IsGPUCDIDevice(name string) bool {
	kind, _, _ := strings.Cut(name, "=")
	vendor, _, _ := strings.Cut(kind, "/")
	vendor = strings.ToLower(strings.TrimSpace(vendor))
	return slices.ContainsFunc(gpuCDIVendors, func(v string) bool {
		if strings.HasPrefix(v, ".") {
			return strings.HasSuffix(vendor, v)
		}
		return vendor == v
	})
}

// Strip removes from cfg every way to a GPU that the shim did not add: the
// NVIDIA driver's device nodes, mounts of them or of the NVIDIA runtime's
// device-list paths, and GPU CDI devices, in the config's fields and in
// its CDI annotations. Env variables are not touched here: the edits
// (Baseline and the modules') replace them. It changes cfg in place.
func Strip(cfg *runtimeapi.ContainerConfig) Stripped {
	var s Stripped
	cfg.Devices = slices.DeleteFunc(cfg.Devices, func(d *runtimeapi.Device) bool {
		if IsGPUDevicePath(d.GetHostPath()) || IsGPUDevicePath(d.GetContainerPath()) {
			s.DeviceNodes = append(s.DeviceNodes, d.GetHostPath())
			return true
		}
		return false
	})
	cfg.Mounts = slices.DeleteFunc(cfg.Mounts, func(m *runtimeapi.Mount) bool {
		if IsGPUDevicePath(m.GetHostPath()) || isDeviceListMount(m.GetContainerPath()) {
			s.Mounts = append(s.Mounts, m.GetHostPath()+":"+m.GetContainerPath())
			return true
		}
		return false
	})
	cfg.CDIDevices = slices.DeleteFunc(cfg.CDIDevices, func(d *runtimeapi.CDIDevice) bool {
		if IsGPUCDIDevice(d.GetName()) {
			s.CDIDevices = append(s.CDIDevices, d.GetName())
			return true
		}
		return false
	})
	for k, v := range cfg.Annotations {
		if !strings.HasPrefix(k, CDIAnnotationPrefix) {
			continue
		}
		names := strings.Split(v, ",")
		kept := slices.DeleteFunc(slices.Clone(names), IsGPUCDIDevice)
		if len(kept) == len(names) {
			continue
		}
		for _, n := range names {
			if IsGPUCDIDevice(n) {
				s.CDIDevices = append(s.CDIDevices, n)
			}
		}
		if len(kept) == 0 {
			delete(cfg.Annotations, k)
		} else {
			cfg.Annotations[k] = strings.Join(kept, ",")
		}
	}
	return s
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
