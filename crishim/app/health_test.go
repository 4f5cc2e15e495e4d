package app

import (
	"errors"
	"strings"
	"testing"

	"github.com/kubegpu/kubegpu/crishim/metrics"
	"github.com/kubegpu/kubegpu/crishim/nodeplugins"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

// TestModuleStatus: what the shim says of its modules, on /healthz, on the
// Node and in the metrics, with and without a module that failed.
func TestModuleStatus(t *testing.T) {
	ok := newModuleStatus("/usr/lib/kubegpu/plugins", []nodeplugins.Plugin{{Module: "nvidia"}}, nil)
	if err := ok.health(); err != nil {
		t.Errorf("health with every module serving: %v", err)
	}
	if c := ok.condition(); c.Status != "True" || c.Reason != kubeinterface.ReasonModulesLoaded || c.Message != "device modules serving: nvidia" {
		t.Errorf("condition with every module serving: %+v", c)
	}
	if c := newModuleStatus("/p", nil, nil).condition(); c.Status != "True" || !strings.Contains(c.Message, "no device module serves on this node (/p)") {
		t.Errorf("condition without modules: %+v", c)
	}

	cause := errors.New("load device plugin: plugin /usr/lib/kubegpu/plugins/nvidia.so was not built with /usr/local/bin/kubegpu-crishim: Go toolchain: host go1.26.0, plugin go1.25.1")
	bad := newModuleStatus("/usr/lib/kubegpu/plugins", []nodeplugins.Plugin{{Module: "simgpu"}}, []nodeplugins.Failure{{Module: "nvidia.so", Err: cause}})
	err := bad.health()
	if err == nil || !strings.Contains(err.Error(), "nvidia.so: "+cause.Error()) || !strings.Contains(err.Error(), "serves CRI") {
		t.Errorf("health with nvidia.so failed: %v", err)
	}
	c := bad.condition()
	if c.Status != "False" || c.Reason != kubeinterface.ReasonModuleLoadFailed || !strings.Contains(c.Message, "nvidia.so: "+cause.Error()) {
		t.Errorf("condition with nvidia.so failed: %+v", c)
	}
	if got := bad.failed(); len(got) != 1 || got[0] != "nvidia.so" {
		t.Errorf("failed() = %v", got)
	}
	m := metrics.New()
	bad.record(m)
	if m.Modules.Value() != 1 || m.ModulesFailed.With("nvidia.so").Value() != 1 {
		t.Errorf("metrics: %d modules, nvidia.so failed %d", m.Modules.Value(), m.ModulesFailed.With("nvidia.so").Value())
	}
}
