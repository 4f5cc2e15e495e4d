package enforce

import (
	"errors"
	"strings"
	"testing"

	ktypes "k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubegpu/kubegpu/crishim/metrics"
	"github.com/kubegpu/kubegpu/crishim/rewrite"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// policies are claims' policies by UID; a claim not listed is not
// prepared here.
type policies map[string]types.EnforcementPolicy

func (p policies) Enforcement(uid string) (types.EnforcementPolicy, error) {
	policy, ok := p[uid]
	if !ok {
		return "", errors.New("not prepared on this node")
	}
	return policy, nil
}

// TestCheckerClaims: the slices of kubegpu ResourceClaims are proven as
// an allocation's, under their claims' policies; a container of a pod
// with an allocation and claims is proven for both, in the order its
// edits were made from; a claim not prepared here is not proven.
func TestCheckerClaims(t *testing.T) {
	key, err := kubeinterface.NewHMACKey([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	slice := types.DeviceShare{ID: "gpu0", UUID: "GPU-0", MemoryMiB: 4096, ComputePercent: 25}
	held := func(claim string, before ...types.DeviceShare) string {
		var devices []kubeinterface.HeldDevice
		for _, d := range before {
			devices = append(devices, kubeinterface.HeldDevice{DeviceShare: d})
		}
		v, err := kubeinterface.EncodeHeld(append(devices, kubeinterface.HeldDevice{DeviceShare: slice, Claim: claim}))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	sandbox := func(id string) *runtimeapi.PodSandbox {
		return &runtimeapi.PodSandbox{Id: id, Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "ns", Name: "pod-" + id, Uid: "uid-" + id}}
	}
	p := &prover{applied: types.Enforcement{Mechanism: "mps", ComputePercent: 25, MemoryMiB: []int64{4096}}}
	modules := func() []rewrite.Module {
		return []rewrite.Module{{Name: "nvidia", Plugin: p, Devices: map[string]types.Device{
			"gpu0": {ID: "gpu0", UUID: "GPU-0", SliceEnforcer: types.EnforcerMPS}, "gpu1": {ID: "gpu1", UUID: "GPU-1", SliceEnforcer: types.EnforcerMPS}}}}
	}
	rt := &fakeRuntime{sandboxes: []*runtimeapi.PodSandbox{sandbox("required"), sandbox("lax"), sandbox("gone")},
		held: map[string]string{"required": held("claim-r"), "lax": held("claim-l"), "gone": held("claim-gone")}}
	pods := &fakePods{}
	m := metrics.New()
	rw := &rewrite.Rewriter{Node: "n1", Keys: kubeinterface.NewKeySet(key), Modules: modules}
	c := New(Options{Node: "n1", Rewriter: rw, Claims: policies{"claim-r": types.EnforcementRequired, "claim-l": ""}, Runtime: rt, Pods: pods, Metrics: m})
	if err := c.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(pods.patches) != 2 || !strings.Contains(pods.patches[0], "pod-lax") || !strings.Contains(pods.patches[1], "pod-required") ||
		strings.Contains(strings.Join(pods.patches, " "), `"False"`) {
		t.Fatalf("patches %q, want the two claims' pods True, the unprepared claim's not proven", pods.patches)
	}
	// The enforcer holds compute to 100%: the Required claim's container
	// is stopped, the BestEffort one's marked.
	p.applied.ComputePercent = 0
	if err := c.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(rt.stopped) != 1 || rt.stopped[0] != "c-required" {
		t.Errorf("stopped %v, want the Required claim's container alone", rt.stopped)
	}

	// An allocation's whole GPU, then the claim's slice: both, in order,
	// Required by the claim.
	ref := kubeinterface.PodRef{Namespace: "ns", Name: "pod-mixed", UID: ktypes.UID("uid-mixed")}
	whole := types.DeviceShare{ID: "gpu1", UUID: "GPU-1", Exclusive: true, MemoryMiB: 16000, ComputePercent: 100}
	a, err := key.Sign(kubeinterface.Allocation{Pod: ref, PodAllocation: types.PodAllocation{Node: "n1",
		Containers: []types.ContainerAllocation{{Name: "main", Devices: []types.DeviceShare{whole}}}}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := kubeinterface.EncodeAllocation(a)
	if err != nil {
		t.Fatal(err)
	}
	mixed := sandbox("mixed")
	mixed.Annotations = map[string]string{kubeinterface.AnnotationAllocation: v}
	rt = &fakeRuntime{sandboxes: []*runtimeapi.PodSandbox{mixed}, held: map[string]string{"mixed": held("claim-r", whole)}}
	ctrs, _ := rt.RunningContainers(t.Context())
	alloc, required, err := c.allocation(ctrs[0], mixed)
	if err != nil || !required || len(alloc.Devices) != 2 || alloc.Devices[0] != whole || alloc.Devices[1] != slice {
		t.Errorf("the mixed container: %+v, required %v, %v; want the allocation's GPU, then the claim's slice, Required", alloc, required, err)
	}
	// Without a claim store, a claim's container is not proven.
	if _, _, err := New(Options{Node: "n1", Rewriter: rw, Runtime: rt}).allocation(ctrs[0], mixed); err == nil {
		t.Error("a claim's container proven without the claim's policy")
	}
}
