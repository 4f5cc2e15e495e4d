package app

import (
	"fmt"
	"strings"

	"github.com/kubegpu/kubegpu/crishim/advertiser"
	"github.com/kubegpu/kubegpu/crishim/metrics"
	"github.com/kubegpu/kubegpu/crishim/nodeplugins"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

// moduleStatus is what the shim knows of its device modules once it has
// loaded them. The shim keeps serving CRI whatever failed (it is the node's
// only runtime endpoint), so a module that did not load or start is told
// everywhere someone may look: /healthz, the metrics, the Node's
// DevicesReady condition, and the refusal of each container whose devices
// no module serves. Modules are loaded once, at start: the status holds
// until the shim restarts.
type moduleStatus struct {
	dir      string
	started  []string
	failures []nodeplugins.Failure
}

func newModuleStatus(dir string, plugins []nodeplugins.Plugin, failures []nodeplugins.Failure) moduleStatus {
	s := moduleStatus{dir: dir, failures: failures}
	for _, p := range plugins {
		s.started = append(s.started, p.Module)
	}
	return s
}

// health is nil while every module serves, and otherwise an error naming
// each module that did not load or start, and why.
func (s moduleStatus) health() error {
	if len(s.failures) == 0 {
		return nil
	}
	return fmt.Errorf("kubegpu-crishim serves CRI, but device modules failed; containers are refused the devices they would serve:\n%s", s.describe("\n"))
}

func (s moduleStatus) describe(sep string) string {
	lines := make([]string, len(s.failures))
	for i, f := range s.failures {
		lines[i] = fmt.Sprintf("%s: %v", f.Module, f.Err)
	}
	return strings.Join(lines, sep)
}

// failed names the modules that did not load or start (e.g. nvidia.so).
func (s moduleStatus) failed() []string {
	names := make([]string, len(s.failures))
	for i, f := range s.failures {
		names[i] = f.Module
	}
	return names
}

// condition is the Node's DevicesReady condition.
func (s moduleStatus) condition() advertiser.Condition {
	if len(s.failures) > 0 {
		return advertiser.Condition{Status: "False", Reason: kubeinterface.ReasonModuleLoadFailed,
			Message: "device modules failed: " + s.describe("; ") +
				"; containers are refused the devices they would serve until kubegpu-crishim restarts with modules that load"}
	}
	if len(s.started) == 0 {
		return advertiser.Condition{Status: "True", Reason: kubeinterface.ReasonModulesLoaded,
			Message: "no device module serves on this node (" + s.dir + ")"}
	}
	return advertiser.Condition{Status: "True", Reason: kubeinterface.ReasonModulesLoaded,
		Message: "device modules serving: " + strings.Join(s.started, ", ")}
}

// record sets the module gauges.
func (s moduleStatus) record(m *metrics.Shim) {
	m.Modules.Set(int64(len(s.started)))
	for _, f := range s.failures {
		m.ModulesFailed.With(f.Module).Set(1)
	}
}
