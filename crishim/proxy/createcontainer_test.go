package proxy

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubegpu/kubegpu/crishim/ledger"
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
	out, err := CreateContainer(Devices{Rewriter: rw})(ctx, req)
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
	_, err = CreateContainer(Devices{Rewriter: rw, CDIOff: func() bool { return true }})(ctx, req)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "CDI off") {
		t.Errorf("CDI off: %v", err)
	}

	// The ledger refuses before any module starts anything for the container.
	calls.Store(0)
	book := ledger.New(ledger.Options{Runtime: holder{}, Capacity: func(string) (types.Device, bool) { return types.Device{}, false }})
	_, err = CreateContainer(Devices{Rewriter: rw, Ledger: book})(ctx, req)
	if status.Code(err) != codes.ResourceExhausted || calls.Load() != 0 {
		t.Errorf("ledger conflict: %v, module called %d times; want ResourceExhausted before any edit", err, calls.Load())
	}
}
