package proxy

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
