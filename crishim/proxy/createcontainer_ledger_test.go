package proxy

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	ktypes "k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubegpu/kubegpu/crishim/ledger"
	"github.com/kubegpu/kubegpu/crishim/rewrite"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// emptyRuntime lists no containers; every pod's sandbox is ready.
type emptyRuntime struct{}

func (emptyRuntime) ListContainers(context.Context, *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	return nil, nil
}

func (emptyRuntime) LivePods(context.Context) (map[string]bool, error) {
	return map[string]bool{"uid-1": true, "uid-2": true, "uid-3": true}, nil
}

// TestCreateContainerClaimLastsTheCall: the ledger's claim on a
// container's devices ends when the runtime answers the call (the
// interceptor's answered function) or when the interceptor refuses it
// after claiming, not minutes later: another pod may then have the
// devices at once.
func TestCreateContainerClaimLastsTheCall(t *testing.T) {
	key, err := kubeinterface.NewHMACKey([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	// request creates container main of pod ml/<uid>, given gpu0 whole.
	request := func(uid string) []byte {
		pod := kubeinterface.PodRef{Namespace: "ml", Name: uid, UID: ktypes.UID(uid)}
		return signedRequest(t, key, pod, pod, "node-1", []types.DeviceShare{{ID: "gpu0", UUID: "GPU-0", Exclusive: true}}, false)
	}
	var cdiOff atomic.Bool
	d := Devices{
		Rewriter: &rewrite.Rewriter{Node: "node-1", Keys: kubeinterface.NewKeySet(key), Modules: func() []rewrite.Module {
			return []rewrite.Module{{Name: "nvidia.so", Plugin: cdiModule{new(atomic.Int32)}, Devices: map[string]types.Device{"gpu0": {ID: "gpu0"}}}}
		}},
		Ledger: ledger.New(ledger.Options{Runtime: emptyRuntime{}, Capacity: func(string) (types.Device, bool) { return types.Device{}, false }}),
		CDIOff: cdiOff.Load,
	}
	intercept := CreateContainer(d)
	ctx := context.Background()

	_, answered, err := intercept(ctx, request("uid-1"))
	if err != nil || answered == nil {
		t.Fatalf("first container: %v, answered function %v; want one", err, answered != nil)
	}
	// While the call is in flight, gpu0 is held.
	if _, _, err := intercept(ctx, request("uid-2")); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("gpu0 while another pod's call is in flight: %v, want ResourceExhausted", err)
	}
	// The runtime answered (and then the container was removed with its
	// pod): gpu0 is free again.
	answered()
	answered() // more than once is harmless
	if _, answered, err = intercept(ctx, request("uid-2")); err != nil {
		t.Fatalf("gpu0 once the first call was answered: %v", err)
	}
	answered()
	// A call refused after the ledger claimed its devices holds nothing.
	cdiOff.Store(true)
	if _, _, err := intercept(ctx, request("uid-3")); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("with CDI off: %v, want FailedPrecondition", err)
	}
	cdiOff.Store(false)
	if _, _, err := intercept(ctx, request("uid-1")); err != nil {
		t.Errorf("gpu0 after a refused call: %v", err)
	}
}

// claimStore resolves the CDI devices of claim "claim-1".
type claimStore map[string]types.DeviceShare

func (s claimStore) Shares(cdi []string) (shares []kubeinterface.HeldDevice, used []string, err error) {
	for _, name := range cdi {
		if d, ok := s[name]; ok {
			shares = append(shares, kubeinterface.HeldDevice{DeviceShare: d, Claim: "claim-1"})
			used = append(used, name)
		}
	}
	return shares, used, nil
}

// TestCreateContainerRecordsClaimDevices: a container's held devices are
// its allocation's, then its claims' with their claim, in the order its
// edits were made from (the enforcement checker proves them in that
// order); a claim's whole GPU is also held through DRA, as before.
func TestCreateContainerRecordsClaimDevices(t *testing.T) {
	key, err := kubeinterface.NewHMACKey([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	pod := kubeinterface.PodRef{Namespace: "ml", Name: "train", UID: "uid-1"}
	req := signedRequest(t, key, pod, pod, "node-1", []types.DeviceShare{{ID: "gpu0", UUID: "GPU-0", MemoryMiB: 1024, ComputePercent: 30}}, false)
	var r runtimeapi.CreateContainerRequest
	if err := proto.Unmarshal(req, &r); err != nil {
		t.Fatal(err)
	}
	r.Config.CDIDevices = []*runtimeapi.CDIDevice{{Name: "claim=slice"}, {Name: "claim=whole"}}
	if req, err = proto.Marshal(&r); err != nil {
		t.Fatal(err)
	}
	devices := map[string]types.Device{"gpu0": {ID: "gpu0"}, "gpu1": {ID: "gpu1"}, "gpu2": {ID: "gpu2"}}
	d := Devices{
		Rewriter: &rewrite.Rewriter{Node: "node-1", Keys: kubeinterface.NewKeySet(key), Modules: func() []rewrite.Module {
			return []rewrite.Module{{Name: "nvidia.so", Plugin: cdiModule{new(atomic.Int32)}, Devices: devices}}
		}},
		Ledger: ledger.New(ledger.Options{Runtime: emptyRuntime{}, Capacity: func(string) (types.Device, bool) { return types.Device{}, false }}),
		Claims: claimStore{
			"claim=slice": {ID: "gpu1", UUID: "GPU-1", MemoryMiB: 2048, ComputePercent: 50},
			"claim=whole": {ID: "gpu2", UUID: "GPU-2", Exclusive: true},
		},
	}
	out, answered, err := CreateContainer(d)(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	answered()
	if err := proto.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	var edits []string
	for _, c := range r.GetConfig().GetCDIDevices() {
		edits = append(edits, c.GetName())
	}
	held, err := kubeinterface.DecodeHeld(r.GetConfig().GetAnnotations()[kubeinterface.AnnotationContainerHeld])
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range held {
		got = append(got, h.ID+"/"+h.Claim)
	}
	if strings.Join(got, " ") != "gpu0/ gpu1/claim-1 gpu2/claim-1" || strings.Join(edits, " ") != "nvidia.com/gpu=GPU-0 nvidia.com/gpu=GPU-1 nvidia.com/gpu=GPU-2" {
		t.Errorf("held %v, edits %v; want the allocation's gpu0, then the claim's gpu1 and gpu2, in both", got, edits)
	}
	dra, err := kubeinterface.DecodeHeld(r.GetConfig().GetAnnotations()[kubeinterface.AnnotationContainerDRAHeld])
	if err != nil || len(dra) != 1 || dra[0].ID != "gpu2" {
		t.Errorf("held through DRA %+v (%v), want the claim's whole gpu2", dra, err)
	}
}
