package config

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/types"
)

// Defaults of KubeGPUArgs.
const (
	DefaultPluginDir          = "/usr/lib/kubegpu/plugins"
	DefaultHeartbeatStaleness = 40 * time.Second
	DefaultRecordQPS          = 20
)

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// KubeGPUArgs are the plugin's arguments in a KubeSchedulerConfiguration:
//
//	profiles:
//	- pluginConfig:
//	  - name: KubeGPU
//	    args:
//	      signingKeyFile: /etc/kubegpu/allocation-key.pem
//	      pluginDir: /usr/lib/kubegpu/plugins
//	      nodePolicy: kubegpu
//
// Unknown fields are errors, so that a typo is not silently ignored.
type KubeGPUArgs struct {
	metav1.TypeMeta `json:",inline"`

	// PluginDir holds the device modules (*.so) to load. It, the
	// directories above it and the modules must be owned by root (or the
	// scheduler's user) and writable by no one else, with no symbolic link.
	PluginDir string `json:"pluginDir,omitempty"`
	// PluginSHA256 pins module files to their SHA-256 digests
	// ("nvidia.so": DIGEST, as sha256sum prints it). With any pin, every
	// module in PluginDir must be pinned.
	PluginSHA256 map[string]string `json:"pluginSHA256,omitempty"`
	// PluginOptions are the modules' scheduler-side options, each
	// "MODULE.KEY=VALUE".
	PluginOptions []string `json:"pluginOptions,omitempty"`
	// NodePolicy ranks the nodes a pod fits on: kubegpu (default;
	// fragmentation-aware), binpack or spread.
	NodePolicy string `json:"nodePolicy,omitempty"`
	// DevicePolicy chooses among a node's devices for GPU slices: binpack or
	// spread; empty means the same as NodePolicy.
	DevicePolicy string `json:"devicePolicy,omitempty"`
	// DefaultTopology applies to multi-GPU requests that set no
	// kubegpu.io/topology annotation: required, preferred (default) or none.
	DefaultTopology types.TopologyPolicy `json:"defaultTopology,omitempty"`
	// Enforcement is the cluster's enforcement policy for GPU slices:
	// BestEffort (default), slices placed on any device with room and
	// marked unenforced where the node cannot hold them to their share; or
	// Required, slices placed only on devices whose node enforces them, and
	// stopped by the node if what it applied differs from the grant. A
	// namespace's kubegpu.io/enforcement label overrides it.
	Enforcement types.EnforcementPolicy `json:"enforcement,omitempty"`
	// HeartbeatStaleness is how long the scheduler may go without seeing a
	// node's Lease renewed, on its own clock, before the node gets no new
	// GPU pods (default 40s).
	HeartbeatStaleness *metav1.Duration `json:"heartbeatStaleness,omitempty"`
	// WriteAllocation is where the signed allocation is written onto the
	// pod: Bind (default), in the same API call as the binding; or PreBind,
	// in a patch before another bind plugin binds the pod.
	WriteAllocation string `json:"writeAllocation,omitempty"`
	// PodsWithoutDevices says what the plugin does with pods that ask for no
	// devices: Score (default), ranking nodes without devices first and GPU
	// nodes by the node policy (kubegpu: where the pod's CPU and memory
	// strand the least idle GPU share); or Ignore, leaving them to the other
	// scorers.
	PodsWithoutDevices string `json:"podsWithoutDevices,omitempty"`
	// RecordQPS bounds the writes per second of the scheduler's records of
	// allocations into pods' status (default 20), on a client of their own:
	// they never take from the scheduler's own QPS. They are written once
	// the plugin has reserved no pod for a second, or once a record has
	// waited two minutes: during a burst they lag behind the
	// bindings. A record whose pod's annotation is changed before it is
	// written is written at once.
	RecordQPS int32 `json:"recordQPS,omitempty"`
	// SigningKeyFile is the key the allocations are signed with: an Ed25519
	// private key (PEM, PKCS #8), or, not recommended, an HMAC-SHA256
	// secret shared with the nodes (PEM "KUBEGPU HMAC-SHA256 SECRET").
	// Required.
	SigningKeyFile string `json:"signingKeyFile"`
	// VerificationKeysFile holds more public keys (PEM) whose allocations
	// the scheduler counts as its own: during a key rotation, the key it
	// signed with before. The signing key's own public half is always
	// accepted. Optional.
	VerificationKeysFile string `json:"verificationKeysFile,omitempty"`
	// SignWithoutKeyID signs allocations without the key's ID, as versions
	// before key IDs did, so that nodes still running such versions can
	// verify them. Only while upgrading from them; see the README.
	SignWithoutKeyID bool `json:"signWithoutKeyID,omitempty"`
	// WorkloadHalfLife is how fast the learned workload mix forgets: a pod
	// created this long ago weighs half as much as one created now
	// (default 24h). The mix holds the pods running; it is rebuilt from
	// them when the scheduler starts or becomes leader.
	WorkloadHalfLife *metav1.Duration `json:"workloadHalfLife,omitempty"`
	// WorkloadMaxTypes bounds the task types (request shapes) the learned
	// mix tracks (default 512); the lightest make room for new ones.
	WorkloadMaxTypes int32 `json:"workloadMaxTypes,omitempty"`
	// GPUMetrics is what the scheduler's /metrics says of the GPUs: PerGPU
	// (default), five series per GPU beside the per-model ones; or PerModel,
	// the per-model, node and pending-pod series and the unhealthy GPUs'
	// series only, for clusters that take per-GPU figures from the nodes'
	// exporters and would rather not have the scheduler's registry carry
	// five series per GPU (200,000 at 5,000 8-GPU nodes) at every gather.
	GPUMetrics string `json:"gpuMetrics,omitempty"`
	// CapacityConfigMap is the ConfigMap (NAMESPACE/NAME) the scheduler
	// keeps the cluster's GPU capacity in, by model, for tenants who may
	// not read nodes (`kubegpu pods`, `kubegpu ui --tenant`); empty
	// (default): none. The shipped configurations set
	// kube-system/kubegpu-capacity, which kube-scheduler/deploy lets every
	// authenticated user read.
	CapacityConfigMap string `json:"capacityConfigMap,omitempty"`
}

// Values of KubeGPUArgs.WriteAllocation.
const (
	WriteAllocationBind    = "Bind"
	WriteAllocationPreBind = "PreBind"
)

// Values of KubeGPUArgs.GPUMetrics.
const (
	GPUMetricsPerGPU   = "PerGPU"
	GPUMetricsPerModel = "PerModel"
)

// Values of KubeGPUArgs.PodsWithoutDevices.
const (
	PodsWithoutDevicesScore  = "Score"
	PodsWithoutDevicesIgnore = "Ignore"
)

// LearnConfig is how the engine learns the workload mix.
func (a *KubeGPUArgs) LearnConfig() devicescheduler.LearnConfig {
	var halfLife time.Duration
	if a.WorkloadHalfLife != nil {
		halfLife = a.WorkloadHalfLife.Duration
	}
	return devicescheduler.LearnConfig{HalfLife: halfLife, MaxTypes: int(a.WorkloadMaxTypes)}
}

// EngineConfig is the allocation engine the plugin runs with these
// arguments, over the scheduler sides of the device modules given.
func (a *KubeGPUArgs) EngineConfig(plugins []types.SchedulerPlugin) devicescheduler.Config {
	return devicescheduler.Config{
		Plugins:         plugins,
		Policy:          a.NodePolicy,
		DevicePolicy:    a.DevicePolicy,
		DefaultTopology: a.DefaultTopology,
		Learn:           a.LearnConfig(),
	}
}
