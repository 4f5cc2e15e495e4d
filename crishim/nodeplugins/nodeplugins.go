package nodeplugins

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"strings"

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

// Failure is a device module that is not serving on this node.
type Failure struct {
	// Module names it: the file in the plugin directory (e.g. nvidia.so),
	// or the plugin directory itself when the directory, the pins or the
	// options were refused as a whole and no module was loaded.
	Module string
	// Err says why, naming the file and the fix.
	Err error
}

func (f Failure) Error() string { return f.Err.Error() }

// Unwrap returns Err.
func (f Failure) Unwrap() error { return f.Err }

// Open loads every module in dir and builds its node side with the options
// given as MODULE.KEY=VALUE flags. It returns the modules that started and
// a Failure for each one that did not, so that the caller can serve with
// the others and say which are missing:
//
//   - a .so that does not load (built with other versions or flags than
//     this binary, not a module, untrusted, not matching its pin) is a
//     Failure of its file; the other files still load;
//   - a plugin directory that cannot be used (missing, untrusted), a pin
//     naming no file, and options that do not parse or name a module that
//     is not there fail every module: one Failure of the directory;
//   - a module whose node side fails to start (e.g. a bad option) is a
//     Failure of its file;
//   - a module whose node side says the node has none of its devices (an
//     error wrapping types.ErrNoDevices, e.g. the NVIDIA module on a node
//     without the driver) is skipped with a log line that says why, as are
//     modules without a node side: neither is a failure.
func Open(ctx context.Context, dir, nodeName string, optionFlags []string, pins pluginload.Pins) ([]Plugin, []Failure) {
	logger := klog.FromContext(ctx)
	whole := func(err error) []Failure { return []Failure{{Module: dir, Err: err}} }
	opts, err := pluginload.ParseOptions(optionFlags)
	if err != nil {
		return nil, whole(err)
	}
	mods, fileErrs, err := pluginload.LoadEach(dir, pins)
	if err != nil {
		return nil, whole(fmt.Errorf("load device plugins: %w", err))
	}
	var failures []Failure
	for _, fe := range fileErrs {
		failures = append(failures, Failure{Module: filepath.Base(fe.Path), Err: fmt.Errorf("load device plugin: %w", fe)})
	}
	// An option for a module whose file did not load (nvidia.* for
	// nvidia.so) is no error of its own: that file's failure says what is
	// wrong.
	checked := maps.Clone(opts)
	for _, fe := range fileErrs {
		delete(checked, strings.TrimSuffix(filepath.Base(fe.Path), ".so"))
	}
	if err := checked.CheckModules(mods); err != nil {
		return nil, whole(err)
	}
	var plugins []Plugin
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
			failures = append(failures, Failure{Module: filepath.Base(m.Path), Err: fmt.Errorf("device module %s (%s): %w", m.Name(), m.Path, err)})
			continue
		}
		logger.V(1).Info("Started device module", "module", m.Name(), "path", m.Path)
		plugins = append(plugins, Plugin{Module: m.Name(), Path: m.Path, NodePlugin: np})
	}
	return plugins, failures
}

// Errors joins the failures' errors; nil without failures.
func Errors(failures []Failure) error {
	errs := make([]error, len(failures))
	for i, f := range failures {
		errs[i] = f
	}
	return errors.Join(errs...)
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
