package proxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubegpu/kubegpu/crishim/ledger"
	"github.com/kubegpu/kubegpu/crishim/metrics"
	"github.com/kubegpu/kubegpu/crishim/rewrite"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// cdiModule gives CDI devices and counts its calls.
type cdiModule struct{ calls *atomic.Int32 }

func (m cdiModule) ContainerEdits(_ context.Context, a types.ContainerAllocation) (types.ContainerEdits, error) {
	m.calls.Add(1)
	var e types.ContainerEdits
	for _, d := range a.Devices {
		e.CDIDevices = append(e.CDIDevices, "nvidia.com/gpu="+d.UUID)
	}
	return e, nil
}

// holder is a runtime whose one live container holds gpu0 for pod "other".
type holder struct{}

func (holder) ListContainers(context.Context, *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	labels, annotations, err := ledger.Labels(ledger.Claim{PodUID: "other", Devices: []types.DeviceShare{{ID: "gpu0", Exclusive: true}}})
	if err != nil {
		return nil, err
	}
	return []*runtimeapi.Container{{Id: "x", State: runtimeapi.ContainerState_CONTAINER_RUNNING, Labels: labels, Annotations: annotations}}, nil
}

func (holder) LivePods(context.Context) (map[string]bool, error) {
	return map[string]bool{"other": true, "uid-1": true}, nil
}

func TestCreateContainerOrder(t *testing.T) {
	key, err := kubeinterface.NewHMACKey([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	signed, _ := key.Sign(kubeinterface.Allocation{
		Pod: kubeinterface.PodRef{Namespace: "ml", Name: "train", UID: "uid-1"},
		PodAllocation: types.PodAllocation{Node: "node-1", Containers: []types.ContainerAllocation{{Name: "main",
			Devices: []types.DeviceShare{{ID: "gpu0", UUID: "GPU-0", Exclusive: true}}}}},
	})
	value, _ := kubeinterface.EncodeAllocation(signed)
	req, _ := proto.Marshal(&runtimeapi.CreateContainerRequest{
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "main"},
			CDIDevices: []*runtimeapi.CDIDevice{{Name: "nvidia.com/gpu=all"}}},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "ml", Name: "train", Uid: "uid-1"},
			Annotations: map[string]string{kubeinterface.AnnotationAllocation: value, "cdi.k8s.io/x": "nvidia.com/gpu=all"}},
	})
	var calls atomic.Int32
	rw := &rewrite.Rewriter{Node: "node-1", Keys: kubeinterface.NewKeySet(key), Modules: func() []rewrite.Module {
		return []rewrite.Module{{Name: "nvidia", Plugin: cdiModule{&calls}, Devices: map[string]types.Device{"gpu0": {ID: "gpu0"}}}}
	}}
	ctx := context.Background()

	// Without metrics, with something to strip: no panic; the sandbox's
	// CDI annotations are stripped too.
	out, _, err := CreateContainer(Devices{Rewriter: rw})(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var got runtimeapi.CreateContainerRequest
	if err := proto.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if n := got.GetConfig().GetCDIDevices(); len(n) != 1 || n[0].GetName() != "nvidia.com/gpu=GPU-0" {
		t.Errorf("CDI devices %v, want the allocation's only", n)
	}
	if _, ok := got.GetSandboxConfig().GetAnnotations()["cdi.k8s.io/x"]; ok {
		t.Error("the sandbox's cdi.k8s.io annotation naming a GPU was forwarded")
	}

	// A runtime with CDI off: refused, not started without its GPU.
	_, _, err = CreateContainer(Devices{Rewriter: rw, CDIOff: func() bool { return true }})(ctx, req)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "CDI off") || refusalReason(err) != metrics.ReasonCDIOff {
		t.Errorf("CDI off: %v (reason %s)", err, refusalReason(err))
	}

	// The ledger refuses before any module starts anything for the container.
	calls.Store(0)
	book := ledger.New(ledger.Options{Runtime: holder{}, Capacity: func(string) (types.Device, bool) { return types.Device{}, false }})
	m := metrics.New()
	_, _, err = CreateContainer(Devices{Rewriter: rw, Ledger: book, Metrics: m})(ctx, req)
	if status.Code(err) != codes.ResourceExhausted || calls.Load() != 0 || refusalReason(err) != metrics.ReasonDevicesHeld {
		t.Errorf("ledger conflict: %v (reason %s), module called %d times; want ResourceExhausted before any edit", err, refusalReason(err), calls.Load())
	}
	if n := m.LedgerRefusals.Value(); n != 1 {
		t.Errorf("ledger refusals %d, want 1", n)
	}
}

// brokenRuntime cannot list its containers.
type brokenRuntime struct{}

func (brokenRuntime) ListContainers(context.Context, *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	return nil, status.Error(codes.Unavailable, "containerd is restarting")
}

func (brokenRuntime) LivePods(context.Context) (map[string]bool, error) {
	return nil, status.Error(codes.Unavailable, "containerd is restarting")
}

// failModule fails every container.
type failModule struct{}

func (failModule) ContainerEdits(context.Context, types.ContainerAllocation) (types.ContainerEdits, error) {
	return types.ContainerEdits{}, errors.New("MPS control daemon did not start")
}

// signedRequest is a CreateContainer of container main in the sandbox of
// pod sandbox, whose allocation, signed with k, is for pod, node and
// devices.
func signedRequest(t *testing.T, k *kubeinterface.Key, sandbox, pod kubeinterface.PodRef, node string, devices []types.DeviceShare, privileged bool) []byte {
	t.Helper()
	signed, err := k.Sign(kubeinterface.Allocation{Pod: pod,
		PodAllocation: types.PodAllocation{Node: node, Containers: []types.ContainerAllocation{{Name: "main", Devices: devices}}}})
	if err != nil {
		t.Fatal(err)
	}
	value, err := kubeinterface.EncodeAllocation(signed)
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(&runtimeapi.CreateContainerRequest{
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "main"},
			Linux: &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{Privileged: privileged}}},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: sandbox.Namespace, Name: sandbox.Name, Uid: string(sandbox.UID)},
			Annotations: map[string]string{kubeinterface.AnnotationAllocation: value}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCreateContainerRefusals: every refusal of the interceptor has its
// gRPC code and says why, one of metrics.Reasons, for the refusals metric.
func TestCreateContainerRefusals(t *testing.T) {
	key, err := kubeinterface.NewHMACKey([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	other, err := kubeinterface.NewHMACKey([]byte(strings.Repeat("o", 32)))
	if err != nil {
		t.Fatal(err)
	}
	self := kubeinterface.PodRef{Namespace: "ml", Name: "train", UID: "uid-1"}
	gpu0 := []types.DeviceShare{{ID: "gpu0", UUID: "GPU-0", Exclusive: true}}
	// request is a CreateContainer of container main in pod ml/train
	// (uid-1) whose allocation, signed with k, is for pod, node and devices.
	request := func(k *kubeinterface.Key, pod kubeinterface.PodRef, node string, devices []types.DeviceShare, privileged bool) []byte {
		return signedRequest(t, k, self, pod, node, devices, privileged)
	}
	malformed, _ := proto.Marshal(&runtimeapi.CreateContainerRequest{
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "main"}},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "ml", Name: "train", Uid: "uid-1"},
			Annotations: map[string]string{kubeinterface.AnnotationAllocation: "{}"}},
	})
	many := make([]types.DeviceShare, kubeinterface.MaxHeldDevices+1)
	for i := range many {
		many[i] = types.DeviceShare{ID: fmt.Sprintf("gpu%d", i), UUID: fmt.Sprintf("GPU-%d", i), ComputePercent: 1}
	}
	serve := func(p rewrite.Module) func() []rewrite.Module {
		return func() []rewrite.Module { return []rewrite.Module{p} }
	}
	cdi := serve(rewrite.Module{Name: "nvidia.so", Plugin: cdiModule{new(atomic.Int32)}, Devices: map[string]types.Device{"gpu0": {ID: "gpu0"}}})
	noDevices := func(string) (types.Device, bool) { return types.Device{}, false }
	for _, tt := range []struct {
		name   string
		req    []byte
		d      Devices // Rewriter.Keys and Node are set
		code   codes.Code
		reason metrics.Reason
		text   string // in the error, where the code and reason could come from elsewhere
	}{
		{name: "not a CreateContainerRequest", req: []byte{0xff, 0x01}, code: codes.InvalidArgument, reason: metrics.ReasonBadRequest},
		{name: "malformed allocation", req: malformed, code: codes.FailedPrecondition, reason: metrics.ReasonInvalidAllocation},
		{name: "signed with an unknown key", req: request(other, self, "node-1", gpu0, false), code: codes.PermissionDenied, reason: metrics.ReasonBadSignature},
		{name: "another pod's allocation", req: request(key, kubeinterface.PodRef{Namespace: "ml", Name: "train", UID: "uid-0"}, "node-1", gpu0, false),
			code: codes.PermissionDenied, reason: metrics.ReasonOtherPod},
		{name: "another node's allocation", req: request(key, self, "node-2", gpu0, false), code: codes.PermissionDenied, reason: metrics.ReasonOtherNode},
		{name: "privileged", req: request(key, self, "node-1", gpu0, true), d: Devices{Rewriter: &rewrite.Rewriter{Modules: cdi}},
			code: codes.FailedPrecondition, reason: metrics.ReasonPrivileged},
		{name: "more devices than the ledger holds", req: request(key, self, "node-1", many, false),
			d:    Devices{Rewriter: &rewrite.Rewriter{Modules: cdi}, Ledger: ledger.New(ledger.Options{Runtime: holder{}, Capacity: noDevices})},
			code: codes.FailedPrecondition, reason: metrics.ReasonInvalidAllocation, text: "encode held devices"},
		{name: "devices held by another pod", req: request(key, self, "node-1", gpu0, false),
			d:    Devices{Rewriter: &rewrite.Rewriter{Modules: cdi}, Ledger: ledger.New(ledger.Options{Runtime: holder{}, Capacity: noDevices})},
			code: codes.ResourceExhausted, reason: metrics.ReasonDevicesHeld},
		{name: "ledger cannot be read", req: request(key, self, "node-1", gpu0, false),
			d:    Devices{Rewriter: &rewrite.Rewriter{Modules: cdi}, Ledger: ledger.New(ledger.Options{Runtime: brokenRuntime{}, Capacity: noDevices})},
			code: codes.Unavailable, reason: metrics.ReasonLedgerUnavailable},
		{name: "device not on this node", req: request(key, self, "node-1", []types.DeviceShare{{ID: "gpu7", UUID: "GPU-7", Exclusive: true}}, false),
			d: Devices{Rewriter: &rewrite.Rewriter{Modules: cdi}}, code: codes.FailedPrecondition, reason: metrics.ReasonUnknownDevice},
		{name: "device of a module that failed to load", req: request(key, self, "node-1", gpu0, false),
			d:    Devices{Rewriter: &rewrite.Rewriter{Modules: func() []rewrite.Module { return nil }, Failed: []string{"nvidia.so"}}},
			code: codes.FailedPrecondition, reason: metrics.ReasonModuleFailed},
		{name: "module fails", req: request(key, self, "node-1", gpu0, false),
			d:    Devices{Rewriter: &rewrite.Rewriter{Modules: serve(rewrite.Module{Name: "nvidia.so", Plugin: failModule{}, Devices: map[string]types.Device{"gpu0": {ID: "gpu0"}}})}},
			code: codes.FailedPrecondition, reason: metrics.ReasonModuleError},
		{name: "CDI off", req: request(key, self, "node-1", gpu0, false), d: Devices{Rewriter: &rewrite.Rewriter{Modules: cdi}, CDIOff: func() bool { return true }},
			code: codes.FailedPrecondition, reason: metrics.ReasonCDIOff},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.d
			if d.Rewriter == nil {
				d.Rewriter = &rewrite.Rewriter{Modules: cdi}
			}
			d.Rewriter.Node, d.Rewriter.Keys = "node-1", kubeinterface.NewKeySet(key)
			_, _, err := CreateContainer(d)(context.Background(), tt.req)
			if status.Code(err) != tt.code || refusalReason(err) != tt.reason || !strings.Contains(fmt.Sprint(err), tt.text) {
				t.Errorf("got %v, reason %s; want %v, reason %s, %q", err, refusalReason(err), tt.code, tt.reason, tt.text)
			}
		})
	}
}
