package nodeplugins

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/types"
	"github.com/kubegpu/kubegpu/utils/pluginload"
)

// Plugin is a started node plugin and the module it came from.
type Plugin struct {
	// Module is the module's name.
	Module string
	// Path is the .so it was loaded from.
	Path string
	types.NodePlugin
}

// Open loads every module in dir and builds its node side with the options
// given as MODULE.KEY=VALUE flags.
//
// A .so that does not load, or options for a module that is not there, fail
// the whole call: the installation is broken. A module whose node side says
// the node has none of its devices (an error wrapping types.ErrNoDevices,
// e.g. the NVIDIA module on a node without the driver) is skipped with a log
// line that says why. A module that fails otherwise (e.g. a bad option) is
// reported in the returned error while the modules that started are still
// returned, so that the caller can decide to carry on without it. Modules
// without a node side are skipped.
func Open(ctx context.Context, dir, nodeName string, optionFlags []string, pins pluginload.Pins) ([]Plugin, error) {
	logger := klog.FromContext(ctx)
	opts, err := pluginload.ParseOptions(optionFlags)
	if err != nil {
		return nil, err
	}
	mods, err := pluginload.Load(dir, pins)
	if err != nil {
		return nil, fmt.Errorf("load device plugins: %w", err)
	}
	if err := opts.CheckModules(mods); err != nil {
		return nil, err
	}
	var (
		plugins  []Plugin
		failures []error
	)
	for _, m := range mods {
		np, err := m.NodePlugin(klog.NewContext(ctx, logger.WithValues("module", m.Name())),
			types.PluginConfig{NodeName: nodeName, Options: opts[m.Name()]})
		switch {
		case errors.Is(err, types.ErrNotImplemented):
			logger.V(2).Info("Device module has no node side", "module", m.Name(), "path", m.Path)
			continue
		case errors.Is(err, types.ErrNoDevices):
			logger.Info("Device module has nothing to serve on this node; continuing without it", "module", m.Name(), "path", m.Path, "reason", err.Error())
			continue
		case err != nil:
			failures = append(failures, fmt.Errorf("device module %s (%s): %w", m.Name(), m.Path, err))
			continue
		}
		logger.V(1).Info("Started device module", "module", m.Name(), "path", m.Path)
		plugins = append(plugins, Plugin{Module: m.Name(), Path: m.Path, NodePlugin: np})
	}
	return plugins, errors.Join(failures...)
}

// Close closes every plugin and returns their errors.
func Close(plugins []Plugin) error {
	var errs []error
	for _, p := range plugins {
		if err := p.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close device module %s: %w", p.Module, err))
		}
	}
	return errors.Join(errs...)
}
