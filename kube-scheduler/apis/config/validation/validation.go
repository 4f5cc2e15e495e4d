// Package validation checks the KubeGPU plugin's args once they are
// decoded and defaulted: every field's value, without building an engine or
// reading a file.
package validation

import (
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/apis/config"
	"github.com/kubegpu/kubegpu/types"
	"github.com/kubegpu/kubegpu/utils/pluginload"
)

// ValidateKubeGPUArgs lists what is wrong with a, under path.
func ValidateKubeGPUArgs(path *field.Path, a *config.KubeGPUArgs) field.ErrorList {
	var errs field.ErrorList
	policies := devicescheduler.Policies()
	if !slices.Contains(policies, a.NodePolicy) {
		errs = append(errs, field.NotSupported(path.Child("nodePolicy"), a.NodePolicy, policies))
	}
	if a.DevicePolicy != "" && a.DevicePolicy != devicescheduler.PolicyBinpack && a.DevicePolicy != devicescheduler.PolicySpread &&
		a.DevicePolicy != a.NodePolicy {
		errs = append(errs, field.NotSupported(path.Child("devicePolicy"), a.DevicePolicy,
			[]string{devicescheduler.PolicyBinpack, devicescheduler.PolicySpread}))
	}
	if !slices.Contains(types.TopologyPolicies, a.DefaultTopology) {
		errs = append(errs, field.NotSupported(path.Child("defaultTopology"), a.DefaultTopology, types.TopologyPolicies))
	}
	if !a.Enforcement.Valid() {
		errs = append(errs, field.NotSupported(path.Child("enforcement"), a.Enforcement, types.EnforcementPolicies))
	}
	if a.WriteAllocation != config.WriteAllocationBind && a.WriteAllocation != config.WriteAllocationPreBind {
		errs = append(errs, field.NotSupported(path.Child("writeAllocation"), a.WriteAllocation, []string{config.WriteAllocationBind, config.WriteAllocationPreBind}))
	}
	if a.GPUMetrics != config.GPUMetricsPerGPU && a.GPUMetrics != config.GPUMetricsPerModel {
		errs = append(errs, field.NotSupported(path.Child("gpuMetrics"), a.GPUMetrics, []string{config.GPUMetricsPerGPU, config.GPUMetricsPerModel}))
	}
	if a.PodsWithoutDevices != config.PodsWithoutDevicesScore && a.PodsWithoutDevices != config.PodsWithoutDevicesIgnore {
		errs = append(errs, field.NotSupported(path.Child("podsWithoutDevices"), a.PodsWithoutDevices, []string{config.PodsWithoutDevicesScore, config.PodsWithoutDevicesIgnore}))
	}
	if a.CapacityConfigMap != "" {
		ns, name, ok := strings.Cut(a.CapacityConfigMap, "/")
		if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
			errs = append(errs, field.Invalid(path.Child("capacityConfigMap"), a.CapacityConfigMap, "must be NAMESPACE/NAME of a ConfigMap"))
		}
	}
	if a.RecordQPS < 1 || a.RecordQPS > 1000 {
		errs = append(errs, field.Invalid(path.Child("recordQPS"), a.RecordQPS, "must be 1..1000"))
	}
	if a.HeartbeatStaleness == nil || a.HeartbeatStaleness.Duration < time.Second {
		errs = append(errs, field.Invalid(path.Child("heartbeatStaleness"), durationOf(a.HeartbeatStaleness).String(), "must be at least 1s"))
	}
	switch d := durationOf(a.WorkloadHalfLife); {
	case a.WorkloadHalfLife == nil || d < time.Minute || d > devicescheduler.MaxHalfLife:
		errs = append(errs, field.Invalid(path.Child("workloadHalfLife"), d.String(), "must be 1m..8760h"))
	default:
		if err := a.LearnConfig().Validate(); err != nil {
			errs = append(errs, field.Invalid(path.Child("workloadMaxTypes"), a.WorkloadMaxTypes, err.Error()))
		}
	}
	if strings.TrimSpace(a.SigningKeyFile) == "" {
		errs = append(errs, field.Required(path.Child("signingKeyFile"), "the allocation signing key; see kube-scheduler/README.md"))
	}
	if _, err := pluginload.ParseOptions(a.PluginOptions); err != nil {
		errs = append(errs, field.Invalid(path.Child("pluginOptions"), a.PluginOptions, err.Error()))
	}
	return errs
}

func durationOf(d *metav1.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.Duration
}
