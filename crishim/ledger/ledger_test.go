package ledger

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// runtime is a fake container list; unit tests only (the integration tests
// run the ledger against containerd).
type runtime struct {
	containers []*runtimeapi.Container
	err        error
	// gone lists pods whose sandbox is not ready; the sandboxes of the
	// others (pods "a" to "z") are.
	gone map[string]bool
	// sandboxErr fails the listing of sandboxes alone.
	sandboxErr error
}

func (r *runtime) LivePods(context.Context) (map[string]bool, error) {
	if r.err != nil {
		return nil, r.err
	}
	if r.sandboxErr != nil {
		return nil, r.sandboxErr
	}
	live := map[string]bool{}
	for c := 'a'; c <= 'z'; c++ {
		live[string(c)] = !r.gone[string(c)]
	}
	return live, nil
}

func (r *runtime) ListContainers(_ context.Context, f *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	if r.err != nil {
		return nil, r.err
	}
	var out []*runtimeapi.Container
	for _, c := range r.containers {
		if c.Labels[kubeinterface.LabelContainerLedger] == f.GetLabelSelector()[kubeinterface.LabelContainerLedger] {
			out = append(out, c)
		}
	}
	return out, nil
}

// create is what the runtime does with a claimed container.
func (r *runtime) create(t *testing.T, c Claim, state runtimeapi.ContainerState) {
	t.Helper()
	labels, annotations, err := Labels(c)
	if err != nil {
		t.Fatal(err)
	}
	r.containers = append(r.containers, &runtimeapi.Container{Id: c.PodUID + "-" + c.Container, State: state,
		Metadata: &runtimeapi.ContainerMetadata{Name: c.Container, Attempt: c.Attempt}, Labels: labels, Annotations: annotations})
}

var gpus = map[string]types.Device{"gpu0": {ID: "gpu0", MemoryMiB: 16000}, "gpu1": {ID: "gpu1", MemoryMiB: 16000}}

func whole(id string) types.DeviceShare {
	return types.DeviceShare{ID: id, Exclusive: true, MemoryMiB: 16000, ComputePercent: 100}
}

func slice(id string, mem int64, pct int) types.DeviceShare {
	return types.DeviceShare{ID: id, MemoryMiB: mem, ComputePercent: pct}
}

func newLedger(rt *runtime, now *time.Time) *Ledger {
	return New(Options{Runtime: rt, Capacity: func(id string) (types.Device, bool) { d, ok := gpus[id]; return d, ok },
		Now: func() time.Time { return *now }})
}

func TestLedger(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1000, 0)
	rt := &runtime{}
	l := newLedger(rt, &now)
	claim := func(uid, ctr string, d ...types.DeviceShare) Claim {
		return Claim{PodUID: uid, Pod: "ns/" + uid, Container: ctr, Devices: d}
	}

	a := claim("a", "main", whole("gpu0"))
	if _, err := l.Claim(ctx, a); err != nil {
		t.Fatal(err)
	}
	// Pending (not yet listed): the same device for another pod is refused.
	if _, err := l.Claim(ctx, claim("b", "main", whole("gpu0"))); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "gpu0 is held whole") {
		t.Fatalf("second claim of gpu0 while pending: %v, want ErrConflict", err)
	}
	rt.create(t, a, runtimeapi.ContainerState_CONTAINER_RUNNING)
	// Listed: still refused, also as a slice; the same pod's containers are not.
	for _, c := range []Claim{claim("b", "main", whole("gpu0")), claim("b", "main", slice("gpu0", 1000, 10))} {
		if _, err := l.Claim(ctx, c); !errors.Is(err, ErrConflict) {
			t.Errorf("claim %+v of held gpu0: %v, want ErrConflict", c.Devices, err)
		}
	}
	sidecar := claim("a", "sidecar", whole("gpu0"))
	if _, err := l.Claim(ctx, sidecar); err != nil {
		t.Errorf("the pod's own container: %v", err)
	}
	rt.create(t, sidecar, runtimeapi.ContainerState_CONTAINER_RUNNING)
	// A new ledger (a restarted shim) reads the same from the runtime.
	if _, err := newLedger(rt, &now).Claim(ctx, claim("b", "main", whole("gpu0"))); !errors.Is(err, ErrConflict) {
		t.Errorf("after a restart: %v, want ErrConflict", err)
	}

	// Slices: within compute and memory fit, beyond do not.
	for i, c := range []struct {
		claim Claim
		ok    bool
	}{
		{claim("c", "main", slice("gpu1", 8000, 50)), true},
		{claim("d", "main", slice("gpu1", 8000, 50)), true},
		{claim("e", "main", slice("gpu1", 100, 1)), false}, // compute over 100%
		{claim("f", "main", slice("gpu1", 0, 0)), true},    // nothing more
		{claim("g", "main", whole("gpu1")), false},         // whole over slices
		{claim("h", "main", slice("gpu0", 0, 0)), false},   // slice of a whole
	} {
		_, err := l.Claim(ctx, c.claim)
		if c.ok != (err == nil) || (err != nil && !errors.Is(err, ErrConflict)) {
			t.Errorf("claim %d %+v: %v, want ok=%v", i, c.claim.Devices, err, c.ok)
		}
		if err == nil {
			rt.create(t, c.claim, runtimeapi.ContainerState_CONTAINER_CREATED)
		}
	}
	now2 := now
	mem := New(Options{Runtime: &runtime{}, Capacity: func(string) (types.Device, bool) { return types.Device{MemoryMiB: 1000}, true },
		Now: func() time.Time { return now2 }})
	if _, err := mem.Claim(ctx, claim("x", "m", slice("gpu0", 600, 10))); err != nil {
		t.Fatal(err)
	}
	if _, err := mem.Claim(ctx, claim("y", "m", slice("gpu0", 600, 10))); err == nil || !strings.Contains(err.Error(), "MiB of memory") {
		t.Errorf("memory over capacity: %v", err)
	}

	// Exited containers hold nothing.
	rt.containers[0].State = runtimeapi.ContainerState_CONTAINER_EXITED
	rt.containers[1].State = runtimeapi.ContainerState_CONTAINER_EXITED
	if _, err := l.Claim(ctx, claim("i", "main", whole("gpu0"))); err != nil {
		t.Errorf("gpu0 after its holder exited: %v", err)
	}
}

func TestLedgerPendingExpires(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1000, 0)
	l := newLedger(&runtime{}, &now)
	if _, err := l.Claim(ctx, Claim{PodUID: "a", Container: "main", Devices: []types.DeviceShare{whole("gpu0")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Claim(ctx, Claim{PodUID: "b", Container: "main", Devices: []types.DeviceShare{whole("gpu1")}}); err != nil {
		t.Fatal(err)
	}
	// Never released (their calls were reset), both hold until the TTL.
	now = now.Add(DefaultPendingTTL - time.Second)
	if _, err := l.Claim(ctx, Claim{PodUID: "c", Container: "main", Devices: []types.DeviceShare{whole("gpu0")}}); !errors.Is(err, ErrConflict) {
		t.Errorf("gpu0 before the TTL: %v, want ErrConflict", err)
	}
	now = now.Add(DefaultPendingTTL + time.Second)
	if _, err := l.Claim(ctx, Claim{PodUID: "c", Container: "main", Devices: []types.DeviceShare{whole("gpu1")}}); err != nil {
		t.Errorf("claim after the pending one expired: %v", err)
	}
}

func TestLedgerRuntimeDown(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newLedger(&runtime{err: errors.New("connection refused")}, &now)
	if _, err := l.Claim(context.Background(), Claim{PodUID: "a", Devices: []types.DeviceShare{whole("gpu0")}}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("runtime down: %v, want ErrUnavailable", err)
	}
}

func TestLedgerIgnoresDamagedEntries(t *testing.T) {
	now := time.Unix(1000, 0)
	rt := &runtime{containers: []*runtimeapi.Container{{Id: "x", State: runtimeapi.ContainerState_CONTAINER_RUNNING,
		Labels:      map[string]string{kubeinterface.LabelContainerLedger: kubeinterface.LedgerVersion, kubeinterface.LabelContainerPodUID: "z"},
		Annotations: map[string]string{kubeinterface.AnnotationContainerHeld: "{not json"}}}}
	if _, err := newLedger(rt, &now).Claim(context.Background(), Claim{PodUID: "a", Devices: []types.DeviceShare{whole("gpu0")}}); err != nil {
		t.Errorf("damaged entry: %v", err)
	}
}

// TestLedgerClaimEndsWithItsCall: a claim released (its call answered)
// holds nothing, whether or not its container was ever listed, and a
// release does not drop a later claim of the same container.
func TestLedgerClaimEndsWithItsCall(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1000, 0)
	rt := &runtime{}
	l := newLedger(rt, &now)
	a := Claim{PodUID: "a", Container: "main", Devices: []types.DeviceShare{whole("gpu0")}}
	release, err := l.Claim(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	// The container was created, ran and was removed with its pod before
	// any other container was created on the node.
	release()
	if _, err := l.Claim(ctx, Claim{PodUID: "b", Container: "main", Devices: []types.DeviceShare{whole("gpu0")}}); err != nil {
		t.Errorf("gpu0 once pod a's call was answered: %v", err)
	}

	// Retries of the same container (same attempt) each keep their claim:
	// the first call, reset by its client, may still be creating the
	// container when the retry is answered (say, "name is reserved").
	first, err := l.Claim(ctx, Claim{PodUID: "c", Container: "main", Devices: []types.DeviceShare{whole("gpu1")}})
	if err != nil {
		t.Fatal(err)
	}
	retry, err := l.Claim(ctx, Claim{PodUID: "c", Container: "main", Devices: []types.DeviceShare{whole("gpu1")}})
	if err != nil {
		t.Fatal(err)
	}
	retry()
	if _, err := l.Claim(ctx, Claim{PodUID: "d", Container: "main", Devices: []types.DeviceShare{whole("gpu1")}}); !errors.Is(err, ErrConflict) {
		t.Errorf("gpu1 while pod c's first call is in flight: %v, want ErrConflict", err)
	}
	first()
	if _, err := l.Claim(ctx, Claim{PodUID: "d", Container: "main", Devices: []types.DeviceShare{whole("gpu1")}}); err != nil {
		t.Errorf("gpu1 once both of pod c's calls were answered: %v", err)
	}
}

// TestLedgerDropsClaimsOfGonePods: a claim never released (its call was
// reset, or the shim lost the connection) ends with its pod's sandbox,
// long before its TTL.
func TestLedgerDropsClaimsOfGonePods(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1000, 0)
	rt := &runtime{gone: map[string]bool{}}
	l := newLedger(rt, &now)
	if _, err := l.Claim(ctx, Claim{PodUID: "a", Container: "main", Devices: []types.DeviceShare{whole("gpu0")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Claim(ctx, Claim{PodUID: "b", Container: "main", Devices: []types.DeviceShare{whole("gpu0")}}); !errors.Is(err, ErrConflict) {
		t.Fatalf("gpu0 while pod a's sandbox is ready: %v, want ErrConflict", err)
	}
	rt.gone["a"] = true // deleted: kubelet stopped its sandbox
	if _, err := l.Claim(ctx, Claim{PodUID: "b", Container: "main", Devices: []types.DeviceShare{whole("gpu0")}}); err != nil {
		t.Errorf("gpu0 after pod a's sandbox stopped: %v", err)
	}
	held, err := l.Held(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := held["gpu0"]; len(got) != 1 || got[0] != "b" {
		t.Errorf("gpu0 held by %v, want [b]", got)
	}
	// Sandboxes that cannot be listed: the ledger cannot tell, and says so.
	rt.sandboxErr = errors.New("connection refused")
	if _, err := l.Claim(ctx, Claim{PodUID: "c", Container: "main", Devices: []types.DeviceShare{whole("gpu1")}}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("sandboxes unlisted: %v, want ErrUnavailable", err)
	}
}

// TestLedgerDRAHoldings: a device a pod holds through another DRA driver's
// claim is shared with other pods holding it the same way (a shared
// claim), and never with a container that holds it through kubegpu, whole
// or a slice, in either order.
func TestLedgerDRAHoldings(t *testing.T) {
	now := time.Unix(0, 0)
	rt := &runtime{}
	l := newLedger(rt, &now)
	ctx := context.Background()
	rt.create(t, Claim{PodUID: "a", Container: "main", DRA: []string{"gpu0"}}, runtimeapi.ContainerState_CONTAINER_RUNNING)
	if release, err := l.Claim(ctx, Claim{PodUID: "b", Container: "main", DRA: []string{"gpu0"}}); err != nil {
		t.Errorf("a second pod of the same DRA claim: %v", err)
	} else {
		release()
	}
	for _, d := range []types.DeviceShare{whole("gpu0"), slice("gpu0", 1000, 10)} {
		if _, err := l.Claim(ctx, Claim{PodUID: "c", Container: "main", Devices: []types.DeviceShare{d}}); !errors.Is(err, ErrConflict) ||
			!strings.Contains(err.Error(), "through a DRA claim") {
			t.Errorf("kubegpu's %+v of a GPU a DRA claim holds: %v, want a conflict", d, err)
		}
	}
	if release, err := l.Claim(ctx, Claim{PodUID: "a", Container: "side", Devices: []types.DeviceShare{whole("gpu1")}, DRA: []string{"gpu0"}}); err != nil {
		t.Errorf("the claim's own pod, another GPU through kubegpu: %v", err)
	} else {
		release()
	}
	rt.create(t, Claim{PodUID: "d", Container: "main", Devices: []types.DeviceShare{slice("gpu1", 1000, 10)}}, runtimeapi.ContainerState_CONTAINER_RUNNING)
	if _, err := l.Claim(ctx, Claim{PodUID: "e", Container: "main", DRA: []string{"gpu1"}}); !errors.Is(err, ErrConflict) ||
		!strings.Contains(err.Error(), "through kubegpu") {
		t.Errorf("a DRA claim's container on a GPU a kubegpu slice holds: %v, want a conflict", err)
	}
	held, err := l.Held(ctx)
	if err != nil || len(held["gpu0"]) != 1 || held["gpu0"][0] != "a" {
		t.Errorf("Held() = %v, %v", held, err)
	}
}

// TestLedgerClaimSlices: a kubegpu claim's slice counts as an
// allocation's, per pod (the scheduler gives a slice claim one pod at a
// time: each pod's limits are its own), and a container's own shares of
// one GPU are summed.
func TestLedgerClaimSlices(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1000, 0)
	rt := &runtime{}
	l := newLedger(rt, &now)
	of := func(claim string, s types.DeviceShare) []kubeinterface.HeldDevice {
		return []kubeinterface.HeldDevice{{DeviceShare: s, Claim: claim}}
	}
	a := Claim{PodUID: "a", Pod: "ns/a", Container: "main", ClaimDevices: of("claim-1", slice("gpu0", 6000, 60))}
	if _, err := l.Claim(ctx, a); err != nil {
		t.Fatal(err)
	}
	rt.create(t, a, runtimeapi.ContainerState_CONTAINER_RUNNING)
	if _, err := l.Claim(ctx, Claim{PodUID: "b", Pod: "ns/b", Container: "main", ClaimDevices: of("claim-1", slice("gpu0", 6000, 60))}); !errors.Is(err, ErrConflict) {
		t.Errorf("a second pod's 60%% of the same claim beside the first's: %v, want ErrConflict", err)
	}
	forty := Claim{PodUID: "c", Container: "main", Devices: []types.DeviceShare{slice("gpu0", 1000, 40)}}
	if _, err := l.Claim(ctx, forty); err != nil {
		t.Fatalf("40%% beside the claim's 60%%: %v", err)
	}
	// 50% of gpu1 through the allocation and 60% through a claim: 110%.
	both := Claim{PodUID: "d", Container: "main", Devices: []types.DeviceShare{slice("gpu1", 1000, 50)}, ClaimDevices: of("claim-2", slice("gpu1", 1000, 60))}
	if _, err := l.Claim(ctx, both); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "110% more") {
		t.Errorf("a container's own 50%% and 60%% of one GPU: %v, want ErrConflict for 110%%", err)
	}
}

// TestLedgerSharedClaimWholeGPU: a kubegpu claim's whole GPU is held as
// DRA claims' are: shared by the claim's pods, never with kubegpu's
// holdings; it is recorded with the container beside its claim.
func TestLedgerSharedClaimWholeGPU(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1000, 0)
	rt := &runtime{}
	l := newLedger(rt, &now)
	sharer := func(uid string) Claim {
		return Claim{PodUID: uid, Pod: "ns/" + uid, Container: "main", DRA: []string{"gpu0"},
			ClaimDevices: []kubeinterface.HeldDevice{{DeviceShare: whole("gpu0"), Claim: "claim-1"}}}
	}
	for _, uid := range []string{"a", "b"} {
		c := sharer(uid)
		if _, err := l.Claim(ctx, c); err != nil {
			t.Fatalf("pod %s of the shared claim: %v", uid, err)
		}
		rt.create(t, c, runtimeapi.ContainerState_CONTAINER_RUNNING)
	}
	for _, c := range []Claim{
		{PodUID: "c", Container: "main", Devices: []types.DeviceShare{whole("gpu0")}},
		{PodUID: "c", Container: "main", Devices: []types.DeviceShare{slice("gpu0", 1000, 10)}},
	} {
		if _, err := l.Claim(ctx, c); !errors.Is(err, ErrConflict) {
			t.Errorf("%+v beside the claim's whole gpu0: %v, want ErrConflict", c.Devices, err)
		}
	}
	held, err := kubeinterface.DecodeHeld(rt.containers[0].Annotations[kubeinterface.AnnotationContainerHeld])
	if err != nil || len(held) != 1 || held[0].Claim != "claim-1" {
		t.Errorf("the container's held devices %+v (%v), want the claim's GPU with its claim", held, err)
	}
}

// TestLedgerClaimSliceOneContainer: a claim's slice is held by one
// container at a time, whatever the pod: another container of the same
// pod, or another pod, is refused even where the GPU has room; the same
// container's next attempt is not, nor another request's slice.
func TestLedgerClaimSliceOneContainer(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1000, 0)
	rt := &runtime{}
	l := newLedger(rt, &now)
	user := func(uid, ctr string, attempt uint32) Claim {
		return Claim{PodUID: uid, Pod: "ns/" + uid, Container: ctr, Attempt: attempt,
			ClaimDevices: []kubeinterface.HeldDevice{{DeviceShare: slice("gpu0", 1000, 20), Claim: "claim-1", Request: "gpus"}}}
	}
	first := user("a", "main", 0)
	if _, err := l.Claim(ctx, first); err != nil {
		t.Fatal(err)
	}
	rt.create(t, first, runtimeapi.ContainerState_CONTAINER_RUNNING)
	for _, c := range []Claim{user("a", "sidecar", 0), user("b", "main", 0)} {
		if _, err := l.Claim(ctx, c); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "serves one container at a time") {
			t.Errorf("container %s of pod %s beside the claim's holder: %v, want ErrConflict", c.Container, c.PodUID, err)
		}
	}
	// The same container's next attempt, the last one listed as created
	// (never started) or exited: the same holder.
	rt.containers[0].State = runtimeapi.ContainerState_CONTAINER_CREATED
	if _, err := l.Claim(ctx, user("a", "main", 1)); err != nil {
		t.Errorf("the holder's next attempt: %v", err)
	}
	// Another request of the claim is another slice.
	other := user("b", "main", 0)
	other.ClaimDevices[0].Request = "other"
	if _, err := l.Claim(ctx, other); err != nil {
		t.Errorf("another request's slice of the claim: %v", err)
	}
}

// TestLedgerClaimWholeGPUOnlyInHeld: a claim's whole GPU listed in a
// container's held devices but not among its DRA holdings still holds the
// GPU, as a DRA claim does.
func TestLedgerClaimWholeGPUOnlyInHeld(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1000, 0)
	rt := &runtime{}
	rt.create(t, Claim{PodUID: "a", Container: "main", ClaimDevices: []kubeinterface.HeldDevice{{DeviceShare: whole("gpu0"), Claim: "claim-1"}}},
		runtimeapi.ContainerState_CONTAINER_RUNNING)
	l := newLedger(rt, &now)
	if _, err := l.Claim(ctx, Claim{PodUID: "b", Container: "main", Devices: []types.DeviceShare{slice("gpu0", 1000, 10)}}); !errors.Is(err, ErrConflict) ||
		!strings.Contains(err.Error(), "through a DRA claim") {
		t.Errorf("a slice of the claim's whole GPU: %v, want ErrConflict", err)
	}
	if _, err := l.Claim(ctx, Claim{PodUID: "c", Container: "main", DRA: []string{"gpu0"}}); err != nil {
		t.Errorf("another pod of the claim: %v", err)
	}
}
