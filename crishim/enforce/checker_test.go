package enforce

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	ktypes "k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubegpu/kubegpu/crishim/metrics"
	"github.com/kubegpu/kubegpu/crishim/rewrite"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// fakeRuntime has one running container per sandbox, named "main".
type fakeRuntime struct {
	sandboxes []*runtimeapi.PodSandbox
	stopped   []string
	// held are the ledger annotations of the containers, by sandbox ID.
	held map[string]string
}

func (f *fakeRuntime) RunningContainers(context.Context) ([]*runtimeapi.Container, error) {
	var out []*runtimeapi.Container
	for _, sb := range f.sandboxes {
		c := &runtimeapi.Container{Id: "c-" + sb.GetId(), PodSandboxId: sb.GetId(), Metadata: &runtimeapi.ContainerMetadata{Name: "main"}}
		if v, ok := f.held[sb.GetId()]; ok {
			c.Labels = map[string]string{kubeinterface.LabelContainerLedger: kubeinterface.LedgerVersion}
			c.Annotations = map[string]string{kubeinterface.AnnotationContainerHeld: v}
		}
		out = append(out, c)
	}
	return out, nil
}

func (f *fakeRuntime) ReadySandboxes(context.Context) ([]*runtimeapi.PodSandbox, error) {
	return f.sandboxes, nil
}

func (f *fakeRuntime) StopContainer(_ context.Context, id string) error {
	f.stopped = append(f.stopped, id)
	return nil
}

// fakePods records the patches and events.
type fakePods struct {
	mu      sync.Mutex
	patches []string
	events  []string
}

func (f *fakePods) PatchPodStatus(_ context.Context, ns, name string, patch []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.patches = append(f.patches, ns+"/"+name+" "+string(patch))
	return nil
}

func (f *fakePods) CreateEvent(_ context.Context, ns string, event []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, ns+" "+string(event))
	return nil
}

// prover reports what applied says, or err; with hang set it blocks,
// whatever its context says, until hang is closed.
type prover struct {
	applied types.Enforcement
	err     error
	hang    chan struct{}
}

func (p *prover) ContainerEdits(context.Context, types.ContainerAllocation) (types.ContainerEdits, error) {
	return types.ContainerEdits{}, nil
}

func (p *prover) Enforced(context.Context, string, types.ContainerAllocation) (types.Enforcement, error) {
	if p.hang != nil {
		<-p.hang
	}
	return p.applied, p.err
}

func TestChecker(t *testing.T) {
	key, err := kubeinterface.NewHMACKey([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	grant := types.DeviceShare{ID: "gpu0", UUID: "GPU-0", MemoryMiB: 4096, ComputePercent: 25}
	sandbox := func(uid string, policy types.EnforcementPolicy) *runtimeapi.PodSandbox {
		ref := kubeinterface.PodRef{Namespace: "ns", Name: "pod-" + uid, UID: ktypes.UID("uid-" + uid)}
		a, err := key.Sign(kubeinterface.Allocation{Pod: ref, PodAllocation: types.PodAllocation{Node: "n1", Enforcement: policy,
			Containers: []types.ContainerAllocation{{Name: "main", Devices: []types.DeviceShare{grant}}}}})
		if err != nil {
			t.Fatal(err)
		}
		v, err := kubeinterface.EncodeAllocation(a)
		if err != nil {
			t.Fatal(err)
		}
		return &runtimeapi.PodSandbox{Id: uid, Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "ns", Name: ref.Name, Uid: string(ref.UID)},
			Annotations: map[string]string{kubeinterface.AnnotationAllocation: v}}
	}
	p := &prover{applied: types.Enforcement{Mechanism: "mps", ComputePercent: 25, MemoryMiB: []int64{4096}}}
	enforcer := types.EnforcerMPS
	modules := func() []rewrite.Module {
		return []rewrite.Module{{Name: "nvidia", Plugin: p, Devices: map[string]types.Device{"gpu0": {ID: "gpu0", UUID: "GPU-0", SliceEnforcer: enforcer}}}}
	}
	rt := &fakeRuntime{sandboxes: []*runtimeapi.PodSandbox{sandbox("a", types.EnforcementRequired), sandbox("b", "")}}
	pods := &fakePods{}
	m := metrics.New()
	c := New(Options{Node: "n1", Rewriter: &rewrite.Rewriter{Node: "n1", Keys: kubeinterface.NewKeySet(key), Modules: modules}, Runtime: rt, Pods: pods, Metrics: m})
	ctx := t.Context()
	check := func() {
		t.Helper()
		if err := c.Check(ctx); err != nil {
			t.Fatal(err)
		}
	}

	check()
	if len(pods.patches) != 2 || !strings.Contains(pods.patches[0], `"status":"True"`) || !strings.Contains(pods.patches[0], "mps: compute 25%, memory 4096 MiB") ||
		!strings.Contains(pods.patches[0], `"metadata":{"uid":"uid-a"}`) {
		t.Fatalf("enforced: patches %q, want one True condition per pod, with the values and the UID precondition", pods.patches)
	}
	if len(pods.events) != 0 || len(rt.stopped) != 0 || m.Slices.With("enforced").Value() != 2 {
		t.Errorf("enforced: events %q, stopped %v, gauge %d", pods.events, rt.stopped, m.Slices.With("enforced").Value())
	}
	check()
	if len(pods.patches) != 2 {
		t.Errorf("an unchanged result was written again: %q", pods.patches[2:])
	}

	// The enforcer now holds compute to 100%: Required stops, BestEffort
	// marks; both get an event.
	p.applied.ComputePercent = 0
	check()
	if len(rt.stopped) != 1 || rt.stopped[0] != "c-a" {
		t.Errorf("mismatch: stopped %v, want the Required pod's container alone", rt.stopped)
	}
	if len(pods.patches) != 4 || !strings.Contains(pods.patches[2], `"reason":"Mismatch"`) || !strings.Contains(pods.patches[2], "compute unlimited, granted 25%") ||
		!strings.Contains(pods.patches[2], "stopped: enforcement Required") || strings.Contains(pods.patches[3], "stopped") {
		t.Errorf("mismatch: patches %q", pods.patches[2:])
	}
	if len(pods.events) != 2 || !strings.Contains(pods.events[0], "GPUSliceMismatch") {
		t.Errorf("mismatch: events %q, want one Warning per pod", pods.events)
	}
	if m.EnforcementMismatches.Value() != 2 || m.EnforcementStops.Value() != 1 || m.Slices.With("mismatch").Value() != 2 {
		t.Errorf("mismatch: metrics %d mismatches, %d stops, gauge %d", m.EnforcementMismatches.Value(), m.EnforcementStops.Value(), m.Slices.With("mismatch").Value())
	}

	// The enforcer does not answer: unproven; Required stops only after
	// UnprovenRounds checks in a row.
	p.err = errors.New("no answer")
	rt.stopped = nil
	for i := 1; i < UnprovenRounds; i++ {
		check()
	}
	if len(rt.stopped) != 0 {
		t.Errorf("unproven for %d rounds: stopped %v already", UnprovenRounds-1, rt.stopped)
	}
	check()
	if len(rt.stopped) != 1 {
		t.Errorf("unproven for %d rounds: stopped %v, want the Required pod's container", UnprovenRounds, rt.stopped)
	}

	// The node lost its enforcer: unenforced; BestEffort records it
	// without an event, Required stops.
	p.err, enforcer, rt.stopped = nil, "", nil
	events := len(pods.events)
	check()
	var last map[string]any
	if err := json.Unmarshal([]byte(strings.SplitN(pods.patches[len(pods.patches)-1], " ", 2)[1]), &last); err != nil {
		t.Fatal(err)
	}
	if cond := last["status"].(map[string]any)["conditions"].([]any)[0].(map[string]any); cond["reason"] != kubeinterface.ReasonUnenforced || cond["status"] != "False" {
		t.Errorf("unenforced: condition %v", cond)
	}
	if len(rt.stopped) != 1 || len(pods.events) != events+1 {
		t.Errorf("unenforced: stopped %v, %d new events; want the Required container stopped and its event alone", rt.stopped, len(pods.events)-events)
	}
}

// TestCheckerBounds: a module that never answers (ignoring its deadline)
// holds a round up for the timeout at most and is not asked again while
// its read-back runs, so that it gets stopped under Required after
// UnprovenRounds; a device no module serves any longer (the shim's own
// fault) is recorded unproven and stops nothing.
func TestCheckerBounds(t *testing.T) {
	key, err := kubeinterface.NewHMACKey([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	a, err := key.Sign(kubeinterface.Allocation{Pod: kubeinterface.PodRef{Namespace: "ns", Name: "p", UID: "uid-p"},
		PodAllocation: types.PodAllocation{Node: "n1", Enforcement: types.EnforcementRequired,
			Containers: []types.ContainerAllocation{{Name: "main", Devices: []types.DeviceShare{{ID: "gpu0", UUID: "GPU-0", MemoryMiB: 1024, ComputePercent: 10}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := kubeinterface.EncodeAllocation(a)
	if err != nil {
		t.Fatal(err)
	}
	rt := &fakeRuntime{sandboxes: []*runtimeapi.PodSandbox{{Id: "p", Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "ns", Name: "p", Uid: "uid-p"},
		Annotations: map[string]string{kubeinterface.AnnotationAllocation: v}}}}
	hang := make(chan struct{})
	defer close(hang)
	p := &prover{hang: hang}
	served := true
	modules := func() []rewrite.Module {
		if !served {
			return nil
		}
		return []rewrite.Module{{Name: "nvidia", Plugin: p, Devices: map[string]types.Device{"gpu0": {ID: "gpu0", UUID: "GPU-0", SliceEnforcer: types.EnforcerMPS}}}}
	}
	pods := &fakePods{}
	c := New(Options{Node: "n1", Rewriter: &rewrite.Rewriter{Node: "n1", Keys: kubeinterface.NewKeySet(key), Modules: modules},
		Runtime: rt, Pods: pods, Metrics: metrics.New(), ProveTimeout: 50 * time.Millisecond})
	ctx := t.Context()
	for round := 1; round <= UnprovenRounds; round++ {
		if err := c.Check(ctx); err != nil {
			t.Fatal(err)
		}
		if stopped := len(rt.stopped) > 0; stopped != (round == UnprovenRounds) {
			t.Fatalf("round %d: stopped %v", round, rt.stopped)
		}
	}
	if last := pods.patches[len(pods.patches)-1]; !strings.Contains(last, "Unproven") {
		t.Errorf("a module that does not answer: %q, want Unproven", last)
	}

	served, rt.stopped = false, nil
	c = New(Options{Node: "n1", Rewriter: &rewrite.Rewriter{Node: "n1", Keys: kubeinterface.NewKeySet(key), Modules: modules, Failed: []string{"nvidia.so"}},
		Runtime: rt, Pods: pods, Metrics: metrics.New()})
	for range UnprovenRounds + 1 {
		if err := c.Check(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(rt.stopped) != 0 {
		t.Errorf("a module that did not load stopped containers: %v", rt.stopped)
	}
	if last := pods.patches[len(pods.patches)-1]; !strings.Contains(last, "Unproven") || !strings.Contains(last, "nvidia.so") {
		t.Errorf("a module that did not load: %q, want Unproven naming it", last)
	}
}
