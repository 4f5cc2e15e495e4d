// Command amd.so is the AMD GPU device module, built with
// go build -buildmode=plugin.
package main

import (
	"github.com/kubegpu/kubegpu/plugins/amd"
	"github.com/kubegpu/kubegpu/types"
)

// NewModule is the module's constructor, looked up by the plugin loader.
func NewModule() types.Module { return amd.NewModule() }

func main() {}
