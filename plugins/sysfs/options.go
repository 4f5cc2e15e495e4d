package sysfs

import (
	"fmt"
	"path/filepath"
	"slices"

	"github.com/kubegpu/kubegpu/types"
)

// Options of the node side of a module that reads sysfs and gives
// containers device nodes: the host's root directory, under which sysfs is
// read, and the directory under which the host's device nodes are (a
// container's /dev/kfd is DIR/dev/kfd on the host); both "/" by default,
// a recorded tree and device nodes made by a test otherwise.
const (
	OptionRoot    = "root"
	OptionDevRoot = "dev-root"
)

// Dirs checks a node side's options (only OptionRoot and OptionDevRoot,
// each an absolute directory) and returns them, cleaned.
func Dirs(cfg types.PluginConfig, module string) (root, devRoot string, err error) {
	if err := cfg.CheckOptions(module, OptionRoot, OptionDevRoot); err != nil {
		return "", "", err
	}
	dirs := []string{"/", "/"}
	for i, key := range []string{OptionRoot, OptionDevRoot} {
		if v, ok := cfg.Options[key]; ok {
			if !filepath.IsAbs(v) {
				return "", "", fmt.Errorf("%s.%s=%q: want an absolute directory", module, key, v)
			}
			dirs[i] = filepath.Clean(v)
		}
	}
	return dirs[0], dirs[1], nil
}

// Guarded are the device nodes of paths (under /dev) and of every DRM
// node this reader finds for vendor, each once, on a host whose device
// nodes are under devRoot: what types.GuardedNodesPlugin returns.
func (r *Reader) Guarded(devRoot string, paths []string, vendor string) []types.DeviceNode {
	for _, p := range r.DRMNodes(vendor) {
		if !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	out := make([]types.DeviceNode, len(paths))
	for i, p := range paths {
		out[i] = types.DeviceNode{HostPath: filepath.Join(devRoot, p), ContainerPath: p}
	}
	return out
}
