// Command intel.so is the Intel GPU device module, built with
// go build -buildmode=plugin.
package main

import (
	"github.com/kubegpu/kubegpu/plugins/intel"
	"github.com/kubegpu/kubegpu/types"
)

// NewModule is the module's constructor, looked up by the plugin loader.
func NewModule() types.Module { return intel.NewModule() }

func main() {}
