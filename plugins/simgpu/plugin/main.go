// Command simgpu.so is the simulated-GPU device module, built with
// go build -buildmode=plugin.
package main

import (
	"github.com/kubegpu/kubegpu/plugins/simgpu"
	"github.com/kubegpu/kubegpu/types"
)

// NewModule is the module's constructor, looked up by the plugin loader.
func NewModule() types.Module { return simgpu.NewModule() }

func main() {}
