// Package main is a minimal device module for the loader's tests.
package main

import (
	"context"

	"github.com/kubegpu/kubegpu/types"
)

type module struct{}

func (module) Name() string { return "testmod" }

func (module) NodePlugin(context.Context, types.PluginConfig) (types.NodePlugin, error) {
	return nil, types.ErrNotImplemented
}

func (module) SchedulerPlugin(context.Context, types.PluginConfig) (types.SchedulerPlugin, error) {
	return nil, types.ErrNotImplemented
}

// NewModule is the module's constructor.
func NewModule() types.Module { return module{} }

func main() {}
