package devicescheduler

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"
	"weak"

	"github.com/kubegpu/kubegpu/plugins/simgpu"
	"github.com/kubegpu/kubegpu/types"
)

// TestLearnerForgetsPods: a pod's weight leaves the mix when it is
// forgotten, and observing a pod twice counts it once.
func TestLearnerForgetsPods(t *testing.T) {
	e := newEngine(t, PolicyKubegpu)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sl, wh := request(t, e, slice(30, 0)), request(t, e, whole(1))
	for i := 0; i < 30; i++ {
		e.ObservePod(fmt.Sprint("slice-", i), sl, at)
		e.ObservePod(fmt.Sprint("slice-", i), sl, at) // again: counted once
	}
	for i := 0; i < 10; i++ {
		e.ObservePod(fmt.Sprint("whole-", i), wh, at)
	}
	if got := e.LearnedPods(); got != 40 {
		t.Fatalf("LearnedPods = %d, want 40", got)
	}
	ts := e.Workload().Types()
	if len(ts) != 2 || math.Abs(ts[0].Weight-0.75) > 0.01 {
		t.Fatalf("mix = %+v, want the slice at 0.75 and the whole GPU at 0.25", ts)
	}
	for i := 0; i < 30; i++ {
		e.ForgetPod(fmt.Sprint("slice-", i))
	}
	ts = e.Workload().Types()
	if len(ts) != 1 || ts[0].Count != 1 || !ts[0].Exclusive {
		t.Errorf("after the slices went, mix = %+v, want only the whole GPU", ts)
	}
	for i := 0; i < 10; i++ {
		e.ForgetPod(fmt.Sprint("whole-", i))
	}
	if ts := e.Workload().Types(); len(ts) != 0 || e.LearnedPods() != 0 {
		t.Errorf("after every pod went, mix = %+v and %d pods, want nothing", ts, e.LearnedPods())
	}
}

// TestLearnerAges: a pod created a half-life later weighs twice as much.
func TestLearnerAges(t *testing.T) {
	e, err := New(Config{Plugins: simPlugins(t), Learn: LearnConfig{HalfLife: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sl, wh := request(t, e, slice(30, 0)), request(t, e, whole(1))
	e.ObservePod("old", sl, at)
	e.ObservePod("new", wh, at.Add(time.Hour))
	ts := e.Workload().Types()
	if len(ts) != 2 || !ts[0].Exclusive || math.Abs(ts[0].Weight-2.0/3) > 0.01 {
		t.Errorf("mix = %+v, want the newer whole GPU at 2/3", ts)
	}
	// Far apart in time: weights are rescaled, nothing overflows.
	for i := 0; i < 200; i++ {
		e.ObservePod(fmt.Sprint("later-", i), sl, at.Add(time.Duration(i)*time.Hour*10))
	}
	for _, tt := range e.Workload().Types() {
		if math.IsNaN(tt.Weight) || math.IsInf(tt.Weight, 0) {
			t.Fatalf("weight %v after 2000 half-lives", tt.Weight)
		}
	}
}

// TestLearnerBounded: however many distinct shapes and however large their
// selectors, the learner tracks at most MaxTypes types and publishes at
// most maxLearnedTypes; the pods' weight stays in the total.
func TestLearnerBounded(t *testing.T) {
	e, err := New(Config{Plugins: simPlugins(t), Learn: LearnConfig{MaxTypes: 128}})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	models := strings.Repeat("m", 4000)
	for i := 0; i < 2000; i++ {
		r, err := e.NewRequest(types.PodRequest{Containers: []types.ContainerRequest{{
			Name: "c", Count: 1, ComputePercent: 10, Selector: types.Selector{IncludeModels: []string{fmt.Sprint(models, i)}},
		}}}, Host{CPUMilli: int64(i)})
		if err != nil {
			t.Fatal(err)
		}
		e.ObservePod(fmt.Sprint(i), r, at)
	}
	e.learner.mu.Lock()
	n, other := len(e.learner.types), e.learner.other
	e.learner.mu.Unlock()
	if n > 128 || other == 0 {
		t.Errorf("learner tracks %d types (other %v), want at most 128 and the rest in other", n, other)
	}
	if got := len(e.Workload().Types()); got > maxLearnedTypes {
		t.Errorf("published %d types, want at most %d", got, maxLearnedTypes)
	}
	for i := 0; i < 2000; i++ {
		e.ForgetPod(fmt.Sprint(i))
	}
	e.learner.mu.Lock()
	n, other = len(e.learner.types), e.learner.other
	e.learner.mu.Unlock()
	if n != 0 || other != 0 || e.LearnedPods() != 0 {
		t.Errorf("after every pod went: %d types, other %v, %d pods; want nothing held", n, other, e.LearnedPods())
	}
}

// TestLearnerOrderFree: two learners given the same pods in different
// orders publish the same mix, so that a scheduler that rebuilds its mix
// from the pods on restart scores as one that never restarted.
func TestLearnerOrderFree(t *testing.T) {
	base := newEngine(t, PolicyKubegpu)
	type pod struct {
		id string
		r  *Request
		at time.Time
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(1, 2))
	var pods []pod
	for i := 0; i < 3000; i++ {
		var r *Request
		switch rng.IntN(4) {
		case 0:
			r = request(t, base, whole(1+rng.IntN(8)))
		case 1:
			r = request(t, base, slice(10*(1+rng.IntN(9)), 0))
		case 2:
			r, _ = base.NewRequest(types.PodRequest{}, Host{})
		default:
			r = request(t, base, slice(25, 0))
		}
		r.Host = Host{CPUMilli: int64(1000 * (1 + rng.IntN(4))), MemoryMiB: int64(512 * (1 + rng.IntN(64)))}
		pods = append(pods, pod{fmt.Sprint(i), r, at.Add(time.Duration(rng.IntN(1000)) * time.Minute)})
	}
	a, b := newEngine(t, PolicyKubegpu), newEngine(t, PolicyKubegpu)
	for _, p := range pods {
		a.ObservePod(p.id, p.r, p.at)
	}
	// a forgets a third of the pods; b never saw them.
	for i := 0; i < len(pods); i += 3 {
		a.ForgetPod(pods[i].id)
	}
	for _, i := range rng.Perm(len(pods)) {
		if i%3 != 0 {
			b.ObservePod(pods[i].id, pods[i].r, pods[i].at)
		}
	}
	ta, tb := a.Workload().Types(), b.Workload().Types()
	if len(ta) != len(tb) {
		t.Fatalf("learned %d and %d types from the same pods", len(ta), len(tb))
	}
	for i := range ta {
		if fmt.Sprint(ta[i]) != fmt.Sprint(tb[i]) {
			t.Errorf("type %d: %+v and %+v from the same pods", i, ta[i], tb[i])
		}
	}
}

func simPlugins(t testing.TB) []types.SchedulerPlugin {
	t.Helper()
	sp, err := simgpu.NewModule().SchedulerPlugin(context.Background(), types.PluginConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return []types.SchedulerPlugin{sp}
}

// TestLearnerKeepsTypesOfRunningPods: a much newer pod of a shape that
// older running pods share comes and goes; the shape stays, with the older
// pods' weight.
func TestLearnerKeepsTypesOfRunningPods(t *testing.T) {
	e := newEngine(t, PolicyKubegpu) // 24h half-life
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sl, wh := request(t, e, slice(30, 0)), request(t, e, whole(1))
	for i := range 100 {
		e.ObservePod(fmt.Sprint("svc-", i), sl, at)
	}
	for i := range 10 {
		e.ObservePod(fmt.Sprint("train-", i), wh, at)
	}
	e.ObservePod("ci", sl, at.Add(40*24*time.Hour))
	e.ForgetPod("ci")
	ts := e.Workload().Types()
	if len(ts) != 2 || ts[0].Exclusive || math.Abs(ts[0].Weight-100.0/110) > 0.01 {
		t.Errorf("mix = %+v, want the 100 slices' type at 100/110 and the whole GPUs'", ts)
	}
}

// TestLearnerTypeLeavesAndComes: a type pushed out of a full table and
// tracked again later; its old pods' weight, counted in the other bucket
// since, leaves the other bucket when they go, not the new type.
func TestLearnerTypeLeavesAndComes(t *testing.T) {
	e, err := New(Config{Plugins: simPlugins(t), Learn: LearnConfig{MaxTypes: 64, HalfLife: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sl := request(t, e, slice(30, 0))
	for i := range 10 {
		e.ObservePod(fmt.Sprint("old-", i), sl, at)
	}
	// 64 heavier shapes push the slices' type out.
	for i := range 64 {
		r := request(t, e, types.ContainerRequest{Name: "c", Count: 1, ComputePercent: 10, Selector: types.Selector{IncludeModels: []string{fmt.Sprint("m", i)}}})
		e.ObservePod(fmt.Sprint("flood-", i), r, at.Add(4*time.Hour))
	}
	e.ForgetPod("flood-0")
	e.ObservePod("new", sl, at.Add(4*time.Hour)) // tracked again
	for i := 1; i < 64; i++ {
		e.ForgetPod(fmt.Sprint("flood-", i))
	}
	e.ObservePod("whole", request(t, e, whole(2)), at.Add(4*time.Hour))
	for i := range 10 {
		e.ForgetPod(fmt.Sprint("old-", i))
	}
	ts := e.Workload().Types()
	if len(ts) != 2 || math.Abs(ts[0].Weight-0.5) > 0.01 || math.Abs(ts[1].Weight-0.5) > 0.01 {
		t.Errorf("mix = %+v, want the two live pods' types at 1/2 each", ts)
	}
	e.learner.mu.Lock()
	other := e.learner.other
	e.learner.mu.Unlock()
	if other > 1e-9 {
		t.Errorf("other bucket holds %v with no pod in it", other)
	}
}

// TestWorkloadIdentity: an engine numbers the mixes it uses, from 1, each
// engine its own, and leaves a given Workload as it was; a node that has
// seen a mix does not keep it alive once the engine has moved on.
func TestWorkloadIdentity(t *testing.T) {
	w, err := NewWorkload([]TaskType{{Count: 1, Exclusive: true, Weight: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		e, err := New(Config{Plugins: simPlugins(t), Workload: w})
		if err != nil {
			t.Fatal(err)
		}
		if got := e.Workload(); got.ID() != 1 || got == w || fmt.Sprint(got.Types()) != fmt.Sprint(w.Types()) {
			t.Errorf("engine's mix %p is #%d with %v, want #1 with %v, a copy of %p", got, got.ID(), got.Types(), w.Types(), w)
		}
	}
	if w.ID() != 0 {
		t.Errorf("given Workload numbered %d, want 0: no engine numbers what it was given", w.ID())
	}

	e := newEngine(t, PolicyKubegpu)
	n := simNode(t, e, "t4x4")
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e.ObservePod("a", request(t, e, slice(30, 0)), at)
	first := e.Workload()
	if first.ID() != 2 { // #1 is the empty mix of New
		t.Fatalf("mix after the first pod is #%d, want #2", first.ID())
	}
	place(t, e, n, "a", request(t, e, slice(30, 0)))
	strandedNow(e, n)
	seen := weak.Make(first)
	first = nil
	e.ObservePod("b", request(t, e, whole(1)), at)
	if id := e.Workload().ID(); id != 3 {
		t.Fatalf("mix after the second pod is #%d, want #3", id)
	}
	runtime.GC()
	if seen.Value() != nil {
		t.Error("the node keeps the mix it saw alive after the engine moved on")
	}
}
