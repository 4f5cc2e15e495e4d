package devicescheduler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kubegpu/kubegpu/plugins/simgpu"
	"github.com/kubegpu/kubegpu/types"
)

func newEngine(t testing.TB, policy string) *Engine {
	t.Helper()
	sp, err := simgpu.NewModule().SchedulerPlugin(context.Background(), types.PluginConfig{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Plugins: []types.SchedulerPlugin{sp}, Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// simNode builds a node from a simgpu preset; unhealthy lists GPU indexes.
func simNode(t testing.TB, e *Engine, preset string, unhealthy ...int) *Node {
	t.Helper()
	topo, err := simgpu.Preset(preset)
	if err != nil {
		t.Fatal(err)
	}
	inv := simgpu.Inventory(topo, "node-"+preset)
	for _, i := range unhealthy {
		inv.Devices[i].Health = types.Unhealthy
	}
	n, err := e.NewNode("node-"+preset, inv, Host{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func whole(count int) types.ContainerRequest {
	return types.ContainerRequest{Name: "c", Count: count}
}

func slice(percent int, memMiB int64) types.ContainerRequest {
	return types.ContainerRequest{Name: "c", Count: 1, ComputePercent: percent, MemoryMiB: memMiB}
}

func request(t testing.TB, e *Engine, cs ...types.ContainerRequest) *Request {
	t.Helper()
	for i := range cs {
		if cs[i].Name == "c" && len(cs) > 1 {
			cs[i].Name = fmt.Sprintf("c%d", i)
		}
	}
	r, err := e.NewRequest(types.PodRequest{Containers: cs}, Host{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// place evaluates r on n, assumes it under key and returns each container's
// device indexes.
func place(t testing.TB, e *Engine, n *Node, key string, r *Request) [][]int {
	t.Helper()
	var p Placement
	if err := e.Evaluate(n, r, &p); err != nil {
		t.Fatalf("Evaluate(%s) error = %v", key, err)
	}
	if err := n.Assume(key, p.Allocation(), r.Host); err != nil {
		t.Fatalf("Assume(%s) error = %v", key, err)
	}
	var out [][]int
	for i := range r.Containers {
		d := p.Devices(i, nil)
		slices.Sort(d)
		out = append(out, d)
	}
	return out
}

func TestDGX1Quads(t *testing.T) {
	e := newEngine(t, PolicyKubegpu)
	n := simNode(t, e, "dgx1")
	first := place(t, e, n, "a", request(t, e, whole(4)))[0]
	quads := [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
	if !slices.ContainsFunc(quads, func(q []int) bool { return slices.Equal(q, first) }) {
		t.Fatalf("4-GPU pod on an empty DGX-1 got %v, want an all-NVLink quad", first)
	}
	second := place(t, e, n, "b", request(t, e, whole(4)))[0]
	if slices.Equal(first, second) || !slices.ContainsFunc(quads, func(q []int) bool { return slices.Equal(q, second) }) {
		t.Errorf("second 4-GPU pod got %v, want the other quad", second)
	}
}

func TestDGX1Pairs(t *testing.T) {
	e := newEngine(t, PolicyKubegpu)
	n := simNode(t, e, "dgx1")
	// Two links beat one: the pairs joined by NV2.
	nv2 := [][]int{{0, 3}, {0, 4}, {1, 2}, {1, 5}, {2, 3}, {4, 7}, {5, 6}, {6, 7}}
	for i := 0; i < 4; i++ {
		got := place(t, e, n, fmt.Sprint(i), request(t, e, whole(2)))[0]
		if !slices.ContainsFunc(nv2, func(p []int) bool { return slices.Equal(p, got) }) {
			t.Errorf("pair %d got %v, want an NV2 pair", i, got)
		}
	}
	if s := n.State(); s.Exclusive != 0xff {
		t.Errorf("four pairs left %08b taken, want all", s.Exclusive)
	}
}

func TestSingleGPUsKeepQuadsWhole(t *testing.T) {
	e := newEngine(t, PolicyKubegpu)
	n := simNode(t, e, "dgx1")
	var taken []int
	for i := 0; i < 4; i++ {
		taken = append(taken, place(t, e, n, fmt.Sprint(i), request(t, e, whole(1)))[0]...)
	}
	slices.Sort(taken)
	// Four single GPUs fill one quad, leaving the other for a 4-GPU job.
	if !slices.Equal(taken, []int{0, 1, 2, 3}) && !slices.Equal(taken, []int{4, 5, 6, 7}) {
		t.Errorf("four single-GPU pods took %v, want one whole quad", taken)
	}
	req := request(t, e, whole(4))
	req.Containers[0].Topology = types.TopologyRequired
	place(t, e, n, "quad", req)
}

func TestTopologyRequiredVsPreferred(t *testing.T) {
	e := newEngine(t, PolicyKubegpu)
	n := simNode(t, e, "dgx1")
	// Break both quads.
	alloc := func(ids ...string) types.PodAllocation {
		var shares []types.DeviceShare
		for _, id := range ids {
			d, _ := n.Inventory().DeviceByID(id)
			shares = append(shares, types.DeviceShare{ID: id, UUID: d.UUID, Exclusive: true})
		}
		return types.PodAllocation{Node: n.Name(), Containers: []types.ContainerAllocation{{Name: "c", Devices: shares}}}
	}
	if err := n.Assume("blocker", alloc("gpu0", "gpu4"), Host{}); err != nil {
		t.Fatal(err)
	}
	required := request(t, e, whole(4))
	required.Containers[0].Topology = types.TopologyRequired
	var p Placement
	err := e.Evaluate(n, required, &p)
	if !errors.Is(err, ErrDoesNotFit) || !strings.Contains(err.Error(), "no 4 devices are all joined by NVLink or NVSwitch") {
		t.Errorf("required quad on a broken DGX-1: error = %v", err)
	}
	preferred := request(t, e, whole(4))
	preferred.Containers[0].Topology = types.TopologyPreferred
	got := place(t, e, n, "p", preferred)[0]
	if len(got) != 4 || slices.Contains(got, 0) || slices.Contains(got, 4) {
		t.Errorf("preferred quad got %v", got)
	}
	// PCIe-only box: required pairs never fit; preferred takes a PCIe-switch pair.
	t4 := simNode(t, e, "t4x4")
	req2 := request(t, e, whole(2))
	req2.Containers[0].Topology = types.TopologyRequired
	if err := e.Evaluate(t4, req2, &p); !errors.Is(err, ErrDoesNotFit) {
		t.Errorf("required pair on t4x4: error = %v, want ErrDoesNotFit", err)
	}
	pair := place(t, e, t4, "pair", request(t, e, whole(2)))[0]
	if !slices.Equal(pair, []int{0, 1}) && !slices.Equal(pair, []int{2, 3}) {
		t.Errorf("preferred pair on t4x4 got %v, want a same-switch pair", pair)
	}
}

func TestSlices(t *testing.T) {
	for _, tt := range []struct {
		policy string
		want   [][]int // device of each of three 30% slices
	}{
		{PolicyBinpack, [][]int{{0}, {0}, {0}}},
		{PolicySpread, [][]int{{0}, {1}, {2}}},
	} {
		t.Run(tt.policy, func(t *testing.T) {
			e := newEngine(t, tt.policy)
			n := simNode(t, e, "t4x4")
			var got [][]int
			for i := 0; i < 3; i++ {
				got = append(got, place(t, e, n, fmt.Sprint(i), request(t, e, slice(30, 4096)))...)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("slices went to %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSplitNodeAndDevicePolicies(t *testing.T) {
	// Node-level spread, device-level binpack: two slices on the same node
	// share one device.
	sp, err := simgpu.NewModule().SchedulerPlugin(context.Background(), types.PluginConfig{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Plugins: []types.SchedulerPlugin{sp}, Policy: PolicySpread, DevicePolicy: PolicyBinpack})
	if err != nil {
		t.Fatal(err)
	}
	n := simNode(t, e, "t4x4")
	var got [][]int
	for i := 0; i < 2; i++ {
		got = append(got, place(t, e, n, fmt.Sprint(i), request(t, e, slice(30, 4096)))...)
	}
	if want := [][]int{{0}, {0}}; !reflect.DeepEqual(got, want) {
		t.Errorf("slices went to %v, want %v", got, want)
	}
	if _, err := New(Config{DevicePolicy: "tetris"}); err == nil || !strings.Contains(err.Error(), `unknown device policy "tetris"`) {
		t.Errorf("New with an unknown device policy: %v", err)
	}
}

func TestSliceCapacityAndExclusivity(t *testing.T) {
	e := newEngine(t, PolicyBinpack)
	n := simNode(t, e, "t4x4", 1, 2, 3) // only gpu0 is healthy
	place(t, e, n, "a", request(t, e, slice(60, 8192)))
	var p Placement
	// Compute would overflow.
	if err := e.Evaluate(n, request(t, e, slice(50, 1024)), &p); !errors.Is(err, ErrDoesNotFit) {
		t.Errorf("60%%+50%% on one GPU: error = %v, want ErrDoesNotFit", err)
	}
	// Memory would overflow (15360 MiB per T4).
	if err := e.Evaluate(n, request(t, e, slice(10, 8192)), &p); !errors.Is(err, ErrDoesNotFit) {
		t.Errorf("8192+8192 MiB on a 15360 MiB GPU: error = %v, want ErrDoesNotFit", err)
	}
	// A whole GPU cannot be taken while a slice uses it.
	if err := e.Evaluate(n, request(t, e, whole(1)), &p); !errors.Is(err, ErrDoesNotFit) ||
		!strings.Contains(err.Error(), "0 whole devices free, 1 needed") {
		t.Errorf("whole GPU over a slice: error = %v", err)
	}
	place(t, e, n, "b", request(t, e, slice(40, 7168)))
	n.Release("a")
	n.Release("b")
	// Everything back: a whole GPU fits, and then no slice does.
	place(t, e, n, "w", request(t, e, whole(1)))
	if err := e.Evaluate(n, request(t, e, slice(1, 1)), &p); !errors.Is(err, ErrDoesNotFit) {
		t.Errorf("slice on an exclusive GPU: error = %v, want ErrDoesNotFit", err)
	}
}

func TestSelectorsAndHealth(t *testing.T) {
	e := newEngine(t, PolicyKubegpu)
	n := simNode(t, e, "t4x4", 0)
	uuid1 := n.Inventory().Devices[1].UUID
	tests := []struct {
		name    string
		sel     types.Selector
		count   int
		want    []int
		wantErr string
	}{
		{name: "unhealthy skipped", count: 3, want: []int{1, 2, 3}},
		{name: "too many for healthy", count: 4, wantErr: "3 healthy devices, 4 needed"},
		{name: "model included (case-insensitive)", sel: types.Selector{IncludeModels: []string{"tesla t4"}}, count: 1},
		{name: "model excluded", sel: types.Selector{ExcludeModels: []string{"Tesla T4"}}, count: 1,
			wantErr: "0 of 3 healthy devices match the pod's model/UUID selectors, 1 needed"},
		{name: "uuid included", sel: types.Selector{IncludeUUIDs: []string{strings.ToUpper(uuid1)}}, count: 1, want: []int{1}},
		{name: "uuid excluded", sel: types.Selector{ExcludeUUIDs: []string{uuid1}}, count: 2, want: []int{2, 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := whole(tt.count)
			c.Selector = tt.sel
			r := request(t, e, c)
			var p Placement
			err := e.Evaluate(n, r, &p)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrDoesNotFit) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := p.Devices(0, nil)
			slices.Sort(got)
			if tt.want != nil && !slices.Equal(got, tt.want) {
				t.Errorf("devices = %v, want %v", got, tt.want)
			}
			if slices.Contains(got, 0) {
				t.Errorf("got the unhealthy gpu0")
			}
		})
	}
}

func TestMultipleContainers(t *testing.T) {
	e := newEngine(t, PolicyKubegpu)
	n := simNode(t, e, "dgx1")
	got := place(t, e, n, "pod", request(t, e, whole(4), whole(3), slice(50, 1024)))
	all := append(append(slices.Clone(got[0]), got[1]...), got[2]...)
	slices.Sort(all)
	if !slices.Equal(all, []int{0, 1, 2, 3, 4, 5, 6, 7}) {
		t.Errorf("containers got %v, want disjoint devices covering the node", got)
	}
	var p Placement
	if err := e.Evaluate(n, request(t, e, slice(10, 1)), &p); err != nil {
		t.Errorf("a slice beside the pod's own slice: %v", err)
	}
}

func TestAssumeIsDerivedFromAllocations(t *testing.T) {
	e := newEngine(t, PolicyKubegpu)
	n := simNode(t, e, "dgx1")
	var p Placement
	r := request(t, e, whole(2), slice(25, 2048))
	if err := e.Evaluate(n, r, &p); err != nil {
		t.Fatal(err)
	}
	a := p.Allocation()
	if err := n.Assume("pod", a, Host{}); err != nil {
		t.Fatal(err)
	}
	if err := n.Assume("pod", a, Host{}); err != nil {
		t.Fatalf("re-assuming the same pod: %v", err)
	}
	if err := n.Assume("thief", a, Host{}); !errors.Is(err, ErrConflict) {
		t.Errorf("the same whole GPUs for a second pod: error = %v, want ErrConflict", err)
	}
	other := simNode(t, e, "dgx1")
	if err := other.AssumePlacement("pod", &p, Host{}); err == nil {
		t.Error("AssumePlacement on another node succeeded")
	}
	// Rebuilt from the same allocation, a fresh node has the same state.
	fresh := simNode(t, e, "dgx1")
	if err := fresh.Assume("pod", a, Host{}); err != nil {
		t.Fatal(err)
	}
	if fresh.State() != n.State() {
		t.Error("state rebuilt from the allocation differs")
	}
	n.Release("pod")
	n.Release("pod")
	if n.State() != simNode(t, e, "dgx1").State() {
		t.Error("releasing the pod did not give everything back")
	}
	uuid0 := n.Inventory().Devices[0].UUID
	for name, d := range map[string]types.DeviceShare{
		"unknown device":  {ID: "gpu9", UUID: "x", Exclusive: true},
		"empty share":     {ID: "gpu0", UUID: uuid0},
		"negative share":  {ID: "gpu0", UUID: uuid0, ComputePercent: -50, MemoryMiB: 1},
		"oversized share": {ID: "gpu0", UUID: uuid0, ComputePercent: 1 << 30},
	} {
		bad := a
		bad.Containers = []types.ContainerAllocation{{Name: "c", Devices: []types.DeviceShare{d}}}
		if err := n.Assume("bad", bad, Host{}); !errors.Is(err, ErrConflict) {
			t.Errorf("%s: error = %v, want ErrConflict", name, err)
		}
	}
	if n.State() != simNode(t, e, "dgx1").State() {
		t.Error("refused allocations changed the state")
	}
	// A failed evaluation cannot be assumed.
	var failed Placement
	if err := e.Evaluate(n, request(t, e, whole(9)), &failed); !errors.Is(err, ErrDoesNotFit) {
		t.Fatalf("9 GPUs on a DGX-1: error = %v", err)
	}
	if err := n.AssumePlacement("failed", &failed, Host{}); err == nil {
		t.Error("a failed placement was assumed")
	}
}

func TestHostResources(t *testing.T) {
	e := newEngine(t, PolicyKubegpu)
	topo, _ := simgpu.Preset("t4x4")
	n, err := e.NewNode("n", simgpu.Inventory(topo, "n"), Host{CPUMilli: 4000, MemoryMiB: 8192})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := e.NewRequest(types.PodRequest{Containers: []types.ContainerRequest{whole(1)}}, Host{CPUMilli: 3000, MemoryMiB: 1024})
	var p Placement
	if err := e.Evaluate(n, r, &p); err != nil {
		t.Fatal(err)
	}
	if err := n.AssumePlacement("a", &p, r.Host); err != nil {
		t.Fatal(err)
	}
	if err := e.Evaluate(n, r, &p); !errors.Is(err, ErrDoesNotFit) || !strings.Contains(err.Error(), "insufficient CPU") {
		t.Errorf("second pod: error = %v, want insufficient CPU", err)
	}
}

func TestFragmentationPolicyPacksSlices(t *testing.T) {
	// With whole-GPU jobs in the mix, slices should share a GPU rather than
	// strand a second one.
	sp, _ := simgpu.NewModule().SchedulerPlugin(context.Background(), types.PluginConfig{})
	w, err := NewWorkload([]TaskType{
		{Count: 1, Exclusive: true, Weight: 1},
		{Count: 1, Milli: 300, Weight: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Plugins: []types.SchedulerPlugin{sp}, Workload: w})
	if err != nil {
		t.Fatal(err)
	}
	n := simNode(t, e, "t4x4")
	a := place(t, e, n, "a", request(t, e, slice(30, 0)))[0]
	b := place(t, e, n, "b", request(t, e, slice(30, 0)))[0]
	if !slices.Equal(a, b) {
		t.Errorf("two slices went to %v and %v, want the same GPU", a, b)
	}
}

// TestStrandedAndDevicePods: with whole GPUs the only task of the mix, a
// slice on each of two GPUs strands both GPUs' free share (0.7 each);
// packed on one GPU it strands 0.4. DevicePods counts the pods per GPU.
func TestStrandedAndDevicePods(t *testing.T) {
	sp, _ := simgpu.NewModule().SchedulerPlugin(context.Background(), types.PluginConfig{})
	w, err := NewWorkload([]TaskType{{Count: 1, Exclusive: true, Weight: 1}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Plugins: []types.SchedulerPlugin{sp}, Workload: w, Policy: PolicySpread})
	if err != nil {
		t.Fatal(err)
	}
	n := simNode(t, e, "t4x4")
	if got := strandedNow(e, n); got != 0 {
		t.Errorf("idle node strands %v GPUs, want 0", got)
	}
	place(t, e, n, "a", request(t, e, slice(30, 0)))
	place(t, e, n, "b", request(t, e, slice(30, 0)))
	if got := strandedNow(e, n); math.Abs(got-1.4) > 1e-9 {
		t.Errorf("two slices spread: %v GPUs stranded, want 1.4", got)
	}
	pods := n.DevicePods()
	if total := pods[0] + pods[1] + pods[2] + pods[3]; total != 2 || max(pods[0], pods[1], pods[2], pods[3]) != 1 {
		t.Errorf("pods per GPU %v, want one on each of two", pods[:4])
	}
}

func strandedNow(e *Engine, n *Node) float64 {
	s := n.State()
	return e.Stranded(n, &s)
}

func TestNewErrors(t *testing.T) {
	sp, _ := simgpu.NewModule().SchedulerPlugin(context.Background(), types.PluginConfig{})
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{Policy: "fastest"}, `unknown policy "fastest" (known: binpack, kubegpu, spread)`},
		{Config{DefaultTopology: "strict"}, `unknown default topology policy "strict"`},
		{Config{Plugins: []types.SchedulerPlugin{sp, sp}}, "rate vendor"},
	} {
		if _, err := New(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) error = %v, want %q", tt.cfg, err, tt.want)
		}
	}
}

func TestKubegpuPolicyNodeScores(t *testing.T) {
	e, _ := mixEngine(t,
		TaskType{Count: 1, Exclusive: true, Weight: 2},
		TaskType{Count: 1, Milli: 500, Weight: 1},
		TaskType{Count: 0, Host: Host{CPUMilli: 1000}, Weight: 1}, // CPU-only pods
	)
	topo, _ := simgpu.Preset("t4x4")
	newNode := func(name string) *Node {
		n, err := e.NewNode(name, simgpu.Inventory(topo, name), Host{CPUMilli: 32000, MemoryMiB: 65536})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	busy, idle := newNode("busy"), newNode("idle")
	for i := 0; i < 3; i++ {
		place(t, e, busy, fmt.Sprint(i), request(t, e, whole(1)))
	}
	// score is the policy's part of the node's score, without the tie-break.
	score := func(n *Node, r *Request) int64 {
		var p Placement
		if err := e.Evaluate(n, r, &p); err != nil {
			t.Fatal(err)
		}
		return p.Score() >> tieBreakBits
	}
	cpuOnly, err := e.NewRequest(types.PodRequest{}, Host{CPUMilli: 2000})
	if err != nil {
		t.Fatal(err)
	}
	if sb, si := score(busy, cpuOnly), score(idle, cpuOnly); sb <= si {
		t.Errorf("CPU-only pod: busy node scores %d, idle node %d; want it kept off the idle GPUs", sb, si)
	}
	// A half-GPU slice on the busy node's last GPU or on a fresh GPU of the
	// idle node strands the other half for whole-GPU pods either way: the
	// fragmentation grows alike, and the scores tie.
	sl := request(t, e, slice(50, 0))
	if sb, si := score(busy, sl), score(idle, sl); sb != si {
		t.Errorf("slice: busy node scores %d, idle node %d; want a tie", sb, si)
	}
	// Scores come in FragQuantum buckets: equal placements tie exactly, and
	// the per-node tie-break orders them.
	other := newNode("other")
	if a, b := score(idle, sl), score(other, sl); a != b {
		t.Errorf("identical nodes score %d and %d", a, b)
	}
	idle.SetPreference(2)
	other.SetPreference(1)
	var pi, po Placement
	if e.Evaluate(idle, sl, &pi) != nil || e.Evaluate(other, sl, &po) != nil || pi.Score() <= po.Score() {
		t.Errorf("the preferred of two equal nodes scores %d, the other %d", pi.Score(), po.Score())
	}
	for _, bad := range []TaskType{{Count: -1, Weight: 1}, {Count: 1, Weight: math.NaN()}, {Count: 1, Weight: math.Inf(1)}, {Count: 1, MemoryMiB: -1, Weight: 1}, {Count: 1, Host: Host{CPUMilli: -1}, Weight: 1}} {
		if _, err := NewWorkload([]TaskType{bad}); err == nil {
			t.Errorf("task type %+v was accepted", bad)
		}
	}
}

func TestLearnedWorkload(t *testing.T) {
	e := newEngine(t, PolicyKubegpu)
	if got := len(e.Workload().Types()); got != 0 {
		t.Fatalf("a new engine knows %d task types, want none", got)
	}
	sl := request(t, e, slice(30, 0))
	cpuOnly, _ := e.NewRequest(types.PodRequest{}, Host{CPUMilli: 500, MemoryMiB: 1024})
	cpuOnlyBig, _ := e.NewRequest(types.PodRequest{}, Host{CPUMilli: 500, MemoryMiB: 3072})
	e.Observe(cpuOnlyBig)
	for i := 0; i < 60; i++ {
		e.Observe(sl)
	}
	for i := 0; i < 39; i++ {
		e.Observe(cpuOnly)
	}
	e.Observe(request(t, e, whole(8))) // 1% of the pods: below the 95% cut
	ts := e.Workload().Types()
	if len(ts) != 2 {
		t.Fatalf("learned %d types (%+v), want the slice and the CPU-only pod", len(ts), ts)
	}
	if ts[0].Count != 1 || ts[0].Milli != 300 || math.Abs(ts[0].Weight-0.6) > 0.05 {
		t.Errorf("first type = %+v, want 1 slice of 300‰ at weight about 0.6", ts[0])
	}
	if ts[1].Count != 0 || ts[1].Host.CPUMilli != 500 || math.Abs(ts[1].Weight-0.4) > 0.05 {
		t.Errorf("second type = %+v, want a CPU-only pod of 500m at weight about 0.4", ts[1])
	}
	// A type's host memory is its pods' mean, (3072 + 39·1024) / 40 = 1075,
	// within the 1% the mix is rounded to.
	if got := e.learner.snapshot().Types()[1].Host.MemoryMiB; got < 1064 || got > 1075 {
		t.Errorf("CPU-only type's memory = %d MiB, want the mean 1075 within 1%%", got)
	}
}

// TestKubegpuPolicyHostStranding checks that the kubegpu policy counts the
// idle GPUs a node's host CPU and memory cannot feed: a pod with more CPU
// (or memory) per GPU than the mix goes where it leaves enough beside the
// idle GPUs, although one pod of every type fits on either node.
func TestKubegpuPolicyHostStranding(t *testing.T) {
	// The mix: whole GPUs with 8 cores and 32 GiB each.
	e, w := mixEngine(t, TaskType{Count: 1, Exclusive: true, Host: Host{CPUMilli: 8000, MemoryMiB: 32768}, Weight: 1})
	topo, _ := simgpu.Preset("t4x4")
	score := func(name string, host, ask Host) int64 {
		t.Helper()
		n, err := e.NewNode(name, simgpu.Inventory(topo, name), host)
		if err != nil {
			t.Fatal(err)
		}
		r, err := e.NewRequest(types.PodRequest{Containers: []types.ContainerRequest{whole(1)}}, ask)
		if err != nil {
			t.Fatal(err)
		}
		var p Placement
		if err := e.Evaluate(n, r, &p); err != nil {
			t.Fatal(err)
		}
		// The same host given by the caller for a node that does not
		// track it scores the same.
		untracked, err := e.NewNode(name, simgpu.Inventory(topo, name), Host{})
		if err != nil {
			t.Fatal(err)
		}
		var q Placement
		if err := e.EvaluateHost(untracked, r, host, host, &q); err != nil {
			t.Fatal(err)
		}
		if host != (Host{}) && q.Score() != p.Score() {
			t.Errorf("EvaluateHost(%+v) scores %d, a node tracking the same host %d", host, q.Score(), p.Score())
		}
		if got := untracked.State().Host; got != (Host{}) {
			t.Errorf("EvaluateHost changed the node's host state to %+v", got)
		}
		return p.Score() >> tieBreakBits
	}
	plenty := Host{CPUMilli: 64000, MemoryMiB: 256 << 10}
	for _, tc := range []struct {
		name       string
		tight, ask Host
	}{
		// 24 cores feed 3 of the 4 GPUs; a 12-core pod leaves 12 cores
		// for 3 idle GPUs, which feed 1.5 of them.
		{"CPU", Host{CPUMilli: 24000, MemoryMiB: 256 << 10}, Host{CPUMilli: 12000, MemoryMiB: 32768}},
		{"memory", Host{CPUMilli: 64000, MemoryMiB: 96 << 10}, Host{CPUMilli: 8000, MemoryMiB: 48 << 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if st, sp := score("tight", tc.tight, tc.ask), score("plenty", plenty, tc.ask); st >= sp {
				t.Errorf("pod asking %+v: node with %+v scores %d, node with %+v scores %d; want the latter higher", tc.ask, tc.tight, st, plenty, sp)
			}
			// A pod asking the mix's own share strands nothing more.
			if st, sp := score("tight", tc.tight, w.types[0].Host), score("plenty", plenty, w.types[0].Host); st != sp {
				t.Errorf("pod asking the mix's share: scores %d and %d, want a tie", st, sp)
			}
		})
	}
	// One node evaluated with one host after another scores as nodes
	// tracking each would: nothing stale is cached between them.
	shared, _ := e.NewNode("tight", simgpu.Inventory(topo, "tight"), Host{})
	big, _ := e.NewRequest(types.PodRequest{Containers: []types.ContainerRequest{whole(1)}}, Host{CPUMilli: 12000, MemoryMiB: 32768})
	for _, h := range []Host{plenty, {CPUMilli: 24000, MemoryMiB: 256 << 10}, plenty, {CPUMilli: 20000, MemoryMiB: 256 << 10}} {
		var p Placement
		if err := e.EvaluateHost(shared, big, h, h, &p); err != nil {
			t.Fatal(err)
		}
		if want := score("tight", h, big.Host); p.Score()>>tieBreakBits != want {
			t.Errorf("EvaluateHost after others, host %+v: score %d, want %d", h, p.Score()>>tieBreakBits, want)
		}
	}
	// Without host resources tracked, the nodes tie.
	if a, b := score("a", Host{}, Host{}), score("b", Host{}, Host{}); a != b {
		t.Errorf("untracked host: scores %d and %d, want a tie", a, b)
	}
	// A host request beyond what the caller says is free does not fit.
	n, _ := e.NewNode("small", simgpu.Inventory(topo, "small"), Host{})
	r, _ := e.NewRequest(types.PodRequest{Containers: []types.ContainerRequest{whole(1)}}, Host{CPUMilli: 9000})
	var p Placement
	var nf *NotFitError
	if err := e.EvaluateHost(n, r, Host{CPUMilli: 16000, MemoryMiB: 1 << 20}, Host{CPUMilli: 8000, MemoryMiB: 1 << 20}, &p); !errors.As(err, &nf) || nf.Reason != ReasonHostResources {
		t.Errorf("EvaluateHost with too little CPU free: error = %v, want %s", err, ReasonHostResources)
	}
}

func TestRequiredSlicesFindTheQuad(t *testing.T) {
	// Partly used GPUs steer a greedy search across the quads (0-4 is NV2):
	// four slices with topology required must still find an all-NVLink quad.
	for _, policy := range []string{PolicyBinpack, PolicySpread, PolicyKubegpu} {
		e := newEngine(t, policy)
		n := simNode(t, e, "dgx1")
		for i, g := range []int{0, 4, 5, 6} {
			d := n.Inventory().Devices[g]
			a := types.PodAllocation{Node: n.Name(), Containers: []types.ContainerAllocation{{Name: "c", Devices: []types.DeviceShare{
				{ID: d.ID, UUID: d.UUID, ComputePercent: 10 * (i + 1), MemoryMiB: 1}}}}}
			if err := n.Assume(fmt.Sprint("busy", i), a, Host{}); err != nil {
				t.Fatal(err)
			}
		}
		c := types.ContainerRequest{Name: "c", Count: 4, ComputePercent: 20, Topology: types.TopologyRequired}
		got := place(t, e, n, "quad", request(t, e, c))[0]
		if !slices.Equal(got, []int{0, 1, 2, 3}) && !slices.Equal(got, []int{4, 5, 6, 7}) {
			t.Errorf("%s: four required slices got %v, want an all-NVLink quad", policy, got)
		}
	}
}

// TestLearnedWorkloadKeepsDeviceTypes: pods without devices, however many
// and of however many sizes, are one type and never push the device types
// out of the learned mix; a pod's host request is shared among its device
// containers.
func TestLearnedWorkloadKeepsDeviceTypes(t *testing.T) {
	e := newEngine(t, PolicyKubegpu)
	for i := 0; i < 1500; i++ {
		r, _ := e.NewRequest(types.PodRequest{}, Host{CPUMilli: int64(500 * (1 + i%5)), MemoryMiB: 1024})
		e.Observe(r)
	}
	for i := 0; i < 20; i++ {
		for _, r := range []*Request{request(t, e, whole(1)), request(t, e, slice(50, 0)), request(t, e, whole(2))} {
			r.Host = Host{CPUMilli: 8000, MemoryMiB: 16384}
			e.Observe(r)
		}
	}
	ts := e.learner.snapshot().Types()
	var devices, none int
	for _, tt := range ts {
		if tt.Count == 0 {
			none++
			if tt.Host.CPUMilli < 1485 || tt.Host.CPUMilli > 1500 || tt.Host.MemoryMiB != 1024 {
				t.Errorf("pods without devices learned as %+v, want their mean 1500m and 1024 MiB", tt.Host)
			}
		} else {
			devices++
		}
	}
	if devices != 3 || none != 1 {
		t.Errorf("learned %d device types and %d without devices (%+v), want 3 and 1", devices, none, ts)
	}
	if e.learner.snapshot().cpuPerMilli == 0 {
		t.Error("the learned mix has no CPU per device share: the host term is off")
	}

	two := newEngine(t, PolicyKubegpu)
	r := request(t, two, whole(1), whole(1))
	r.Host = Host{CPUMilli: 8000, MemoryMiB: 4096}
	two.Observe(r)
	if ts := two.learner.snapshot().Types(); len(ts) != 1 || ts[0].Host != (Host{CPUMilli: 4000, MemoryMiB: 2048}) {
		t.Errorf("a pod with two device containers learned as %+v, want one type with half its host request", ts)
	}
}

// mixEngine is a kubegpu engine over simulated GPUs given the mix tts.
func mixEngine(t *testing.T, tts ...TaskType) (*Engine, *Workload) {
	t.Helper()
	sp, err := simgpu.NewModule().SchedulerPlugin(context.Background(), types.PluginConfig{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorkload(tts)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Plugins: []types.SchedulerPlugin{sp}, Workload: w})
	if err != nil {
		t.Fatal(err)
	}
	return e, w
}

// TestNodeClone: a clone's state changes apart from the node's.
func TestNodeClone(t *testing.T) {
	e := newEngine(t, PolicyKubegpu)
	n := simNode(t, e, "dgx1")
	var p Placement
	if err := e.Evaluate(n, request(t, e, whole(4)), &p); err != nil {
		t.Fatal(err)
	}
	if err := n.AssumePlacement("a", &p, Host{}); err != nil {
		t.Fatal(err)
	}
	c := n.Clone()
	c.Release("a")
	if !n.Holds("a") || c.Holds("a") {
		t.Fatalf("releasing in the clone: node holds a %v, clone %v; want true, false", n.Holds("a"), c.Holds("a"))
	}
	if err := e.Evaluate(c, request(t, e, whole(8)), &p); err != nil {
		t.Errorf("8 GPUs on the clone without a: %v", err)
	}
	if err := e.Evaluate(n, request(t, e, whole(8)), &p); err == nil {
		t.Error("8 GPUs fit on the node that still holds a")
	}
}
