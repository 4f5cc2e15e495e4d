// Command nvidia.so is the NVIDIA GPU device module, built with
// go build -buildmode=plugin.
package main

import (
	"github.com/kubegpu/kubegpu/plugins/nvidia"
	"github.com/kubegpu/kubegpu/types"
)

// NewModule is the module's constructor, looked up by the plugin loader.
func NewModule() types.Module { return nvidia.NewModule() }

func main() {}
