package main

import (
	"os"
	"path/filepath"
	"strings"
)

// simNodes are the simulated GPU nodes: name, and the device module and
// option that give each its GPUs (a simgpu preset, or a sysfs tree
// recorded from a machine of another vendor).
var simNodes = []struct{ name, module, option string }{
	{"dgx1-a", "simgpu", "preset=dgx1"}, {"dgx1-b", "simgpu", "preset=dgx1"}, {"dgx-h100", "simgpu", "preset=dgx-h100"},
	{"t4-box-a", "simgpu", "preset=t4x4"}, {"t4-box-b", "simgpu", "preset=t4x4"},
	{"mi300x", "amd", "root=plugins/amd/testdata/mi300x-8"},
	{"max1550", "intel", "root=plugins/intel/testdata/max1550-4"},
}

// simNodeModule returns the plugin directory and option of a simulated
// node: a directory of the node's module alone (the others would find
// nothing to serve, or want options of their own), made once per module,
// and the option with its path made absolute.
func simNodeModule(dir, pluginDir, module, option string) (string, string, error) {
	own := filepath.Join(dir, "plugins-"+module)
	if err := os.MkdirAll(own, 0o755); err != nil {
		return "", "", err
	}
	// A copy: the shim loads no module through a link.
	dst := filepath.Join(own, module+".so")
	if _, err := os.Stat(dst); os.IsNotExist(err) {
		b, err := os.ReadFile(filepath.Join(pluginDir, module+".so"))
		if err != nil {
			return "", "", err
		}
		if err := os.WriteFile(dst, b, 0o755); err != nil {
			return "", "", err
		}
	}
	if key, value, _ := strings.Cut(option, "="); key == "root" {
		abs, err := filepath.Abs(value)
		if err != nil {
			return "", "", err
		}
		option = key + "=" + abs
	}
	return own, module + "." + option, nil
}
