package plugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/types"
	"github.com/kubegpu/kubegpu/utils/pluginload"
)

// Defaults of Args.
const (
	DefaultPluginDir          = "/usr/lib/kubegpu/plugins"
	DefaultHeartbeatStaleness = 40 * time.Second
	DefaultRecordQPS          = 20
)

// Args are the plugin's arguments in a KubeSchedulerConfiguration:
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
type Args struct {
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
}

// Values of Args.WriteAllocation.
const (
	WriteAllocationBind    = "Bind"
	WriteAllocationPreBind = "PreBind"
)

// Values of Args.GPUMetrics.
const (
	GPUMetricsPerGPU   = "PerGPU"
	GPUMetricsPerModel = "PerModel"
)

// Values of Args.PodsWithoutDevices.
const (
	PodsWithoutDevicesScore  = "Score"
	PodsWithoutDevicesIgnore = "Ignore"
)

// decodeArgs reads the plugin's args strictly, applies defaults and
// validates them.
func decodeArgs(obj runtime.Object) (*Args, error) {
	args := &Args{}
	switch o := obj.(type) {
	case nil:
	case *Args:
		*args = *o
	case *runtime.Unknown:
		if err := strictUnmarshal(o, args); err != nil {
			return nil, fmt.Errorf("decode %s args: %w", Name, err)
		}
	default:
		return nil, fmt.Errorf("decode %s args: want args of type runtime.Unknown, got %T", Name, obj)
	}
	setDefaults(args)
	if errs := validateArgs(args, field.NewPath("pluginConfig").Key(Name).Child("args")); len(errs) > 0 {
		return nil, fmt.Errorf("invalid %s args: %w", Name, errs.ToAggregate())
	}
	return args, nil
}

func strictUnmarshal(o *runtime.Unknown, into *Args) error {
	if len(o.Raw) == 0 {
		return nil
	}
	raw := o.Raw
	switch o.ContentType {
	case runtime.ContentTypeJSON, "":
	case runtime.ContentTypeYAML:
		j, err := yaml.YAMLToJSON(raw)
		if err != nil {
			return err
		}
		raw = j
	default:
		return fmt.Errorf("unsupported content type %q", o.ContentType)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after the args object")
	}
	return nil
}

func setDefaults(a *Args) {
	if a.PluginDir == "" {
		a.PluginDir = DefaultPluginDir
	}
	if a.NodePolicy == "" {
		a.NodePolicy = devicescheduler.PolicyKubegpu
	}
	if a.DefaultTopology == "" {
		a.DefaultTopology = types.TopologyPreferred
	}
	if a.WriteAllocation == "" {
		a.WriteAllocation = WriteAllocationBind
	}
	if a.Enforcement == "" {
		a.Enforcement = types.EnforcementBestEffort
	}
	if a.HeartbeatStaleness == nil {
		a.HeartbeatStaleness = &metav1.Duration{Duration: DefaultHeartbeatStaleness}
	}
	if a.PodsWithoutDevices == "" {
		a.PodsWithoutDevices = PodsWithoutDevicesScore
	}
	if a.GPUMetrics == "" {
		a.GPUMetrics = GPUMetricsPerGPU
	}
	if a.RecordQPS == 0 {
		a.RecordQPS = DefaultRecordQPS
	}
	if a.WorkloadHalfLife == nil {
		a.WorkloadHalfLife = &metav1.Duration{Duration: devicescheduler.DefaultHalfLife}
	}
	if a.WorkloadMaxTypes == 0 {
		a.WorkloadMaxTypes = devicescheduler.DefaultMaxTypes
	}
}

func validateArgs(a *Args, path *field.Path) field.ErrorList {
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
	if a.WriteAllocation != WriteAllocationBind && a.WriteAllocation != WriteAllocationPreBind {
		errs = append(errs, field.NotSupported(path.Child("writeAllocation"), a.WriteAllocation, []string{WriteAllocationBind, WriteAllocationPreBind}))
	}
	if a.GPUMetrics != GPUMetricsPerGPU && a.GPUMetrics != GPUMetricsPerModel {
		errs = append(errs, field.NotSupported(path.Child("gpuMetrics"), a.GPUMetrics, []string{GPUMetricsPerGPU, GPUMetricsPerModel}))
	}
	if a.PodsWithoutDevices != PodsWithoutDevicesScore && a.PodsWithoutDevices != PodsWithoutDevicesIgnore {
		errs = append(errs, field.NotSupported(path.Child("podsWithoutDevices"), a.PodsWithoutDevices, []string{PodsWithoutDevicesScore, PodsWithoutDevicesIgnore}))
	}
	if a.RecordQPS < 1 || a.RecordQPS > 1000 {
		errs = append(errs, field.Invalid(path.Child("recordQPS"), a.RecordQPS, "must be 1..1000"))
	}
	if a.HeartbeatStaleness.Duration < time.Second {
		errs = append(errs, field.Invalid(path.Child("heartbeatStaleness"), a.HeartbeatStaleness.Duration.String(), "must be at least 1s"))
	}
	if d := a.WorkloadHalfLife.Duration; d < time.Minute || d > devicescheduler.MaxHalfLife {
		errs = append(errs, field.Invalid(path.Child("workloadHalfLife"), d.String(), "must be 1m..8760h"))
	} else if _, err := devicescheduler.New(devicescheduler.Config{Learn: a.learnConfig()}); err != nil {
		errs = append(errs, field.Invalid(path.Child("workloadMaxTypes"), a.WorkloadMaxTypes, err.Error()))
	}
	if strings.TrimSpace(a.SigningKeyFile) == "" {
		errs = append(errs, field.Required(path.Child("signingKeyFile"), "the allocation signing key; see kube-scheduler/README.md"))
	}
	if _, err := pluginload.ParseOptions(a.PluginOptions); err != nil {
		errs = append(errs, field.Invalid(path.Child("pluginOptions"), a.PluginOptions, err.Error()))
	}
	return errs
}

// DeepCopyObject makes Args a runtime.Object, so that tests and embedders
// can pass it to New directly.
func (a *Args) DeepCopyObject() runtime.Object {
	c := *a
	c.PluginOptions = slices.Clone(a.PluginOptions)
	if a.HeartbeatStaleness != nil {
		d := *a.HeartbeatStaleness
		c.HeartbeatStaleness = &d
	}
	if a.WorkloadHalfLife != nil {
		d := *a.WorkloadHalfLife
		c.WorkloadHalfLife = &d
	}
	c.PluginSHA256 = maps.Clone(a.PluginSHA256)
	return &c
}

// learnConfig is how the engine learns the workload mix.
func (a *Args) learnConfig() devicescheduler.LearnConfig {
	return devicescheduler.LearnConfig{HalfLife: a.WorkloadHalfLife.Duration, MaxTypes: int(a.WorkloadMaxTypes)}
}
