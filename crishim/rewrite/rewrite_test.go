package rewrite

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// fakeModule makes edits that name the devices it got.
type fakeModule struct{ env string }

func (f fakeModule) ContainerEdits(_ context.Context, a types.ContainerAllocation) (types.ContainerEdits, error) {
	if len(a.Devices) == 0 {
		return types.ContainerEdits{Env: []types.EnvVar{{Name: f.env, Value: "void"}}}, nil
	}
	var ids []string
	for _, d := range a.Devices {
		ids = append(ids, d.UUID)
	}
	return types.ContainerEdits{Env: []types.EnvVar{{Name: f.env, Value: strings.Join(ids, ",")}}, CDIDevices: []string{"example.com/gpu=" + ids[0]}}, nil
}

// failingModule fails every container.
type failingModule struct{ err error }

func (f failingModule) ContainerEdits(context.Context, types.ContainerAllocation) (types.ContainerEdits, error) {
	return types.ContainerEdits{}, f.err
}

func testKey(t *testing.T, secret string) *kubeinterface.Key {
	t.Helper()
	k, err := kubeinterface.NewHMACKey([]byte(strings.Repeat(secret, 32)))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func sandbox(t *testing.T, key *kubeinterface.Key, ref kubeinterface.PodRef, node string) *runtimeapi.PodSandboxConfig {
	t.Helper()
	sb := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "ml", Name: "train", Uid: "uid-1"}}
	if key == nil {
		return sb
	}
	a, err := key.Sign(kubeinterface.Allocation{Pod: ref, PodAllocation: types.PodAllocation{Node: node,
		Containers:     []types.ContainerAllocation{{Name: "main", Devices: []types.DeviceShare{{ID: "gpu1", UUID: "GPU-1", Exclusive: true}}}},
		InitContainers: []types.ContainerAllocation{{Name: "init", Devices: []types.DeviceShare{{ID: "gpu2", UUID: "GPU-2", ComputePercent: 50}}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	value, err := kubeinterface.EncodeAllocation(a)
	if err != nil {
		t.Fatal(err)
	}
	sb.Annotations = map[string]string{kubeinterface.AnnotationAllocation: value}
	return sb
}

func TestContainerAllocation(t *testing.T) {
	key := testKey(t, "k")
	r := &Rewriter{Node: "node-1", Keys: kubeinterface.NewKeySet(key)}
	self := kubeinterface.PodRef{Namespace: "ml", Name: "train", UID: "uid-1"}
	for _, tt := range []struct {
		name      string
		sb        *runtimeapi.PodSandboxConfig
		container string
		want      []string // device IDs
		wantErr   error
		cause     error // wrapped too: what the refusals metric counts
		errText   string
	}{
		{name: "no allocation", sb: sandbox(t, nil, self, ""), container: "main"},
		{name: "main", sb: sandbox(t, key, self, "node-1"), container: "main", want: []string{"gpu1"}},
		{name: "init container", sb: sandbox(t, key, self, "node-1"), container: "init", want: []string{"gpu2"}},
		{name: "container not named", sb: sandbox(t, key, self, "node-1"), container: "sidecar"},
		{name: "forged", sb: sandbox(t, testKey(t, "x"), self, "node-1"), container: "main", wantErr: ErrForbidden, cause: kubeinterface.ErrBadSignature, errText: "which is not among the keys held here"},
		{name: "other pod", sb: sandbox(t, key, kubeinterface.PodRef{Namespace: "ml", Name: "train", UID: "uid-0"}, "node-1"), container: "main", wantErr: ErrForbidden, cause: ErrOtherPod, errText: "carries the allocation of pod ml/train (uid uid-0)"},
		{name: "other node", sb: sandbox(t, key, self, "node-2"), container: "main", wantErr: ErrForbidden, cause: ErrOtherNode, errText: `the allocation is for node "node-2", this is node "node-1"`},
		{name: "malformed", sb: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "ml", Name: "train"},
			Annotations: map[string]string{kubeinterface.AnnotationAllocation: "{"}}, container: "main", wantErr: ErrInvalid},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, err := r.ContainerAllocation(tt.sb, tt.container)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.errText) {
					t.Fatalf("error %v, want %v containing %q", err, tt.wantErr, tt.errText)
				}
				if tt.cause != nil && !errors.Is(err, tt.cause) {
					t.Errorf("error %v does not wrap %v", err, tt.cause)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range a.Devices {
				got = append(got, d.ID)
			}
			if !reflect.DeepEqual(got, tt.want) || a.Name != tt.container {
				t.Errorf("allocation %+v, want devices %v", a, tt.want)
			}
		})
	}
}

func TestEdits(t *testing.T) {
	r := &Rewriter{Modules: func() []Module {
		return []Module{
			{Name: "a", Plugin: fakeModule{env: "A_DEVICES"}, Devices: map[string]types.Device{"gpu0": {ID: "gpu0"}, "gpu1": {ID: "gpu1"}}},
			{Name: "b", Plugin: fakeModule{env: "B_DEVICES"}, Devices: map[string]types.Device{"acc0": {ID: "acc0"}}},
		}
	}}
	got, err := r.Edits(context.Background(), "uid-1", types.ContainerAllocation{Name: "main", Devices: []types.DeviceShare{{ID: "gpu1", UUID: "GPU-1"}}})
	if err != nil {
		t.Fatal(err)
	}
	want := types.ContainerEdits{
		Env: []types.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"},
			{Name: "NVIDIA_MIG_CONFIG_DEVICES"}, {Name: "NVIDIA_MIG_MONITOR_DEVICES"}, {Name: "NVIDIA_IMEX_CHANNELS"}, {Name: "NVIDIA_NVSWITCH"},
			{Name: "A_DEVICES", Value: "GPU-1"}, {Name: "B_DEVICES", Value: "void"}},
		CDIDevices: []string{"example.com/gpu=GPU-1"},
	}
	if !reflect.DeepEqual(got.Env, want.Env) || !reflect.DeepEqual(got.CDIDevices, want.CDIDevices) {
		t.Errorf("edits %+v, want %+v", got, want)
	}
	// No module running (e.g. the NVIDIA driver not loaded yet): containers
	// still get no GPU.
	none := &Rewriter{Modules: func() []Module { return nil }}
	got, err = none.Edits(context.Background(), "uid-1", types.ContainerAllocation{Name: "main"})
	if err != nil || !reflect.DeepEqual(got.Env, Baseline.Env) {
		t.Errorf("edits without modules = %+v, %v; want the baseline %+v", got, err, Baseline)
	}
	_, err = r.Edits(context.Background(), "uid-1", types.ContainerAllocation{Name: "main", Devices: []types.DeviceShare{{ID: "gpu9", UUID: "GPU-9"}}})
	if want := `container "main": device not on this node: gpu9 (GPU-9)`; !errors.Is(err, ErrInvalid) || !errors.Is(err, ErrUnknownDevice) || !strings.Contains(err.Error(), want) {
		t.Errorf("unknown device: %v, want %q", err, want)
	}
	// A module that fails: its error, named.
	cause := errors.New("MPS control daemon did not start")
	failing := &Rewriter{Modules: func() []Module {
		return []Module{{Name: "nvidia.so", Plugin: failingModule{cause}, Devices: map[string]types.Device{"gpu1": {ID: "gpu1"}}}}
	}}
	_, err = failing.Edits(context.Background(), "uid-1", types.ContainerAllocation{Name: "main", Devices: []types.DeviceShare{{ID: "gpu1", UUID: "GPU-1"}}})
	var me *ModuleError
	if want := "allocation cannot be applied: device module nvidia.so: " + cause.Error(); !errors.Is(err, ErrInvalid) || !errors.As(err, &me) || me.Module != "nvidia.so" || !errors.Is(err, cause) || err.Error() != want {
		t.Errorf("failing module: %v, want %q as a *ModuleError", err, want)
	}
	// A module failed to load (an upgrade gone wrong): a container whose
	// devices no module serves is refused, and told which module failed;
	// one without devices still gets the baseline.
	broken := &Rewriter{Modules: none.Modules, Failed: []string{"nvidia.so"}}
	_, err = broken.Edits(context.Background(), "uid-1", types.ContainerAllocation{Name: "main", Devices: []types.DeviceShare{{ID: "gpu1", UUID: "GPU-1"}}})
	if want := `container "main": device gpu1 (GPU-1) is not served: device modules failed on this node: nvidia.so (the Node's condition kubegpu.io/DevicesReady says why)`; !errors.Is(err, ErrInvalid) || !errors.Is(err, ErrModulesFailed) || !strings.Contains(err.Error(), want) {
		t.Errorf("device of a failed module: %v, want %q", err, want)
	}
	if got, err := broken.Edits(context.Background(), "uid-1", types.ContainerAllocation{Name: "main"}); err != nil || !reflect.DeepEqual(got.Env, Baseline.Env) {
		t.Errorf("no devices, a module failed: %+v, %v; want the baseline", got, err)
	}
}

func TestApply(t *testing.T) {
	for _, tt := range []struct {
		name  string
		cfg   *runtimeapi.ContainerConfig
		edits types.ContainerEdits
		want  *runtimeapi.ContainerConfig
	}{
		{
			name: "env replaces the container's own",
			cfg: &runtimeapi.ContainerConfig{Envs: []*runtimeapi.KeyValue{
				{Key: "NVIDIA_VISIBLE_DEVICES", Value: []byte("all")}, {Key: "HOME", Value: []byte("/root")}}},
			edits: types.ContainerEdits{Env: []types.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}}},
			want: &runtimeapi.ContainerConfig{Envs: []*runtimeapi.KeyValue{
				{Key: "HOME", Value: []byte("/root")}, {Key: "NVIDIA_VISIBLE_DEVICES", Value: []byte("void")}}},
		},
		{
			name: "devices, mounts, CDI and annotations are added",
			cfg:  &runtimeapi.ContainerConfig{Annotations: map[string]string{"a": "1"}},
			edits: types.ContainerEdits{
				DeviceNodes: []types.DeviceNode{{HostPath: "/dev/nvidia0", ContainerPath: "/dev/nvidia0"}},
				Mounts:      []types.Mount{{HostPath: "/run/mps", ContainerPath: "/run/mps", ReadOnly: true}},
				CDIDevices:  []string{"nvidia.com/gpu=GPU-1"},
				Annotations: map[string]string{"b": "2"},
			},
			want: &runtimeapi.ContainerConfig{
				Annotations: map[string]string{"a": "1", "b": "2"},
				Devices:     []*runtimeapi.Device{{HostPath: "/dev/nvidia0", ContainerPath: "/dev/nvidia0", Permissions: "rw"}},
				Mounts:      []*runtimeapi.Mount{{HostPath: "/run/mps", ContainerPath: "/run/mps", Readonly: true}},
				CDIDevices:  []*runtimeapi.CDIDevice{{Name: "nvidia.com/gpu=GPU-1"}},
			},
		},
		{name: "no edits", cfg: &runtimeapi.ContainerConfig{}, want: &runtimeapi.ContainerConfig{}},
		{
			name:  "a later edit of a variable wins",
			cfg:   &runtimeapi.ContainerConfig{},
			edits: types.ContainerEdits{Env: []types.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}, {Name: "NVIDIA_VISIBLE_DEVICES", Value: "GPU-1"}}},
			want:  &runtimeapi.ContainerConfig{Envs: []*runtimeapi.KeyValue{{Key: "NVIDIA_VISIBLE_DEVICES", Value: []byte("GPU-1")}}},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			Apply(tt.cfg, tt.edits)
			if !proto.Equal(tt.cfg, tt.want) {
				t.Errorf("Apply gave %v, want %v", tt.cfg, tt.want)
			}
		})
	}
}
