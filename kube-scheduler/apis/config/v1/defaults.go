package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/apis/config"
	"github.com/kubegpu/kubegpu/types"
)

// SetDefaults_KubeGPUArgs fills in what the args leave out; defaulter-gen
// registers it (its name is the one defaulter-gen looks for).
func SetDefaults_KubeGPUArgs(a *KubeGPUArgs) {
	if a.PluginDir == "" {
		a.PluginDir = config.DefaultPluginDir
	}
	if a.NodePolicy == "" {
		a.NodePolicy = devicescheduler.PolicyKubegpu
	}
	if a.DefaultTopology == "" {
		a.DefaultTopology = types.TopologyPreferred
	}
	if a.WriteAllocation == "" {
		a.WriteAllocation = config.WriteAllocationBind
	}
	if a.Enforcement == "" {
		a.Enforcement = types.EnforcementBestEffort
	}
	if a.HeartbeatStaleness == nil {
		a.HeartbeatStaleness = &metav1.Duration{Duration: config.DefaultHeartbeatStaleness}
	}
	if a.PodsWithoutDevices == "" {
		a.PodsWithoutDevices = config.PodsWithoutDevicesScore
	}
	if a.GPUMetrics == "" {
		a.GPUMetrics = config.GPUMetricsPerGPU
	}
	if a.RecordQPS == 0 {
		a.RecordQPS = config.DefaultRecordQPS
	}
	if a.WorkloadHalfLife == nil {
		a.WorkloadHalfLife = &metav1.Duration{Duration: devicescheduler.DefaultHalfLife}
	}
	if a.WorkloadMaxTypes == 0 {
		a.WorkloadMaxTypes = devicescheduler.DefaultMaxTypes
	}
}
