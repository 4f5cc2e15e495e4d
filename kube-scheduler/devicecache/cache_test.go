package devicecache

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache/cachetest"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/plugins/simgpu"
	"github.com/kubegpu/kubegpu/types"
)

// The objects the tests feed the cache (see package cachetest).
var (
	testNow   = cachetest.Now
	named     = cachetest.Named
	testNode  = cachetest.Node
	testLease = cachetest.Lease
	testPod   = cachetest.Pod
	boundWith = cachetest.BoundWith
	gpuPod    = cachetest.GPUPod
	noHost    devicescheduler.Host
)

func testCache(t *testing.T) (*Cache, *kubeinterface.Key) {
	t.Helper()
	key := cachetest.Key(t)
	c := New(Config{Engine: cachetest.Engine(t), Keys: kubeinterface.NewKeySet(key), Staleness: 40 * time.Second,
		Now: func() time.Time { return testNow }})
	// Whatever the test did, no node's memo may be left behind its
	// devices (see devicesChanged).
	t.Cleanup(func() {
		for name, s := range c.Snapshot() {
			if strings.HasPrefix(s.Usable, "memo out of date") {
				t.Errorf("node %s: %s", name, s.Usable)
			}
		}
	})
	return c, key
}

func wholeRequest(t *testing.T, c *Cache, count int) *devicescheduler.Request {
	return cachetest.WholeRequest(t, c.engine, count)
}

func TestCacheReserveBindRelease(t *testing.T) {
	c, key := testCache(t)
	logger := klog.Background()
	c.UpdateNode(logger, testNode(t, "n1", "dgx1"))
	r := wholeRequest(t, c, 4)

	var p devicescheduler.Placement
	if _, err := c.Evaluate(named("n1"), ptr(c.Input(ShapeKey{4}, r)), noHost, noHost, &p); !errors.Is(err, errNoLease) {
		t.Fatalf("Evaluate without a Lease: %v", err)
	}
	var activated []string
	c.activate = func(pods map[string]*corev1.Pod) {
		for name := range pods {
			activated = append(activated, name)
		}
	}
	c.WaitForHeartbeat(testPod("waiting"))
	c.UpdateLease(testLease("n1", testNow.Add(-time.Second)), false)
	c.UpdateLease(testLease("n1", testNow), false) // live to live: nothing to do
	if !reflect.DeepEqual(activated, []string{"ns/waiting"}) {
		t.Fatalf("activated %v when the node became live, want [ns/waiting]", activated)
	}
	if _, err := c.Evaluate(named("missing"), ptr(c.Input(ShapeKey{4}, r)), noHost, noHost, &p); !errors.Is(err, ErrNoInventory) {
		t.Fatalf("Evaluate on an unknown node: %v", err)
	}

	// Filter results are remembered until the node changes.
	first, err := c.Evaluate(named("n1"), ptr(c.Input(ShapeKey{4}, r)), noHost, noHost, &p)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := c.Evaluate(named("n1"), ptr(c.Input(ShapeKey{4}, r)), noHost, noHost, &p); err != nil || again != first {
		t.Fatalf("second Evaluate = %d, %v; want %d", again, err, first)
	}

	a, b := testPod("a"), testPod("b")
	allocA, err := c.Reserve(a, "n1", r, noHost, noHost, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(b, "n1", r, noHost, noHost, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(testPod("c"), "n1", r, noHost, noHost, nil); err == nil {
		t.Fatal("a third 4-GPU pod was reserved on an 8-GPU node")
	}
	if _, err := c.Evaluate(named("n1"), ptr(c.Input(ShapeKey{4}, r)), noHost, noHost, &p); !errors.Is(err, devicescheduler.ErrDoesNotFit) {
		t.Fatalf("Evaluate on the full node = %v, want ErrDoesNotFit (a stale memo?)", err)
	}
	c.Unreserve(b.UID)
	// b's devices are free again: the memo must not keep "full".
	if _, err := c.Evaluate(named("n1"), ptr(c.Input(ShapeKey{4}, r)), noHost, noHost, &p); err != nil {
		t.Fatalf("Evaluate once b was unreserved = %v, want a fit (a stale memo?)", err)
	}
	// a is seen bound: confirmed, and Unreserve no longer forgets it.
	c.UpdatePod(logger, boundWith(t, key, a, allocA))
	c.Unreserve(a.UID)
	if got := c.Snapshot()["n1"].Pods; !reflect.DeepEqual(got, []string{"uid-a"}) {
		t.Fatalf("pods on n1 = %v, want [uid-a]", got)
	}
	// a finishes: its devices return.
	done := boundWith(t, key, a, allocA)
	done.Status.Phase = corev1.PodSucceeded
	c.UpdatePod(logger, done)
	if s := c.Snapshot()["n1"]; len(s.Pods) != 0 || s.State.Used != 0 {
		t.Fatalf("after a finished: %+v", s)
	}
}

func TestCacheIgnoresForgedAndMismatched(t *testing.T) {
	c, key := testCache(t)
	logger := klog.Background()
	c.UpdateNode(logger, testNode(t, "n1", "dgx1"))
	c.UpdateLease(testLease("n1", testNow), false)
	alloc, err := c.Reserve(testPod("x"), "n1", wholeRequest(t, c, 8), noHost, noHost, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Unreserve("uid-x")

	other, _ := kubeinterface.NewHMACKey([]byte(strings.Repeat("o", 32)))
	forged := boundWith(t, other, testPod("forged"), alloc)
	c.UpdatePod(logger, forged)
	// Signed for pod x, copied onto pod y.
	copied := boundWith(t, key, testPod("x"), alloc)
	copied.Name, copied.UID = "y", "uid-y"
	c.UpdatePod(logger, copied)
	// Signed for node n1, but the pod is bound to n2.
	moved := boundWith(t, key, testPod("z"), alloc)
	moved.Spec.NodeName = "n2"
	c.UpdatePod(logger, moved)
	if s := c.Snapshot()["n1"]; len(s.Pods) != 0 || s.State.Used != 0 {
		t.Fatalf("forged or mismatched allocations were counted: %+v", s)
	}
}

// TestCacheRebuildsTheSameState feeds the same objects in random orders, as
// a restarted scheduler's informers might, and gets the same state.
func TestCacheRebuildsTheSameState(t *testing.T) {
	ref, key := testCache(t)
	logger := klog.Background()
	var objects []any
	for _, n := range []*corev1.Node{testNode(t, "n1", "dgx1"), testNode(t, "n2", "t4x4")} {
		ref.UpdateNode(logger, n)
		ref.UpdateLease(testLease(n.Name, testNow), false)
		objects = append(objects, n, testLease(n.Name, testNow))
	}
	slice, err := ref.engine.NewRequest(types.PodRequest{Containers: []types.ContainerRequest{{Name: "main", Count: 1, ComputePercent: 30}}}, devicescheduler.Host{})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range []*devicescheduler.Request{wholeRequest(t, ref, 2), slice, slice, wholeRequest(t, ref, 1), wholeRequest(t, ref, 4)} {
		pod := testPod(string(rune('a' + i)))
		node := []string{"n1", "n2"}[i%2]
		alloc, err := ref.Reserve(pod, node, r, noHost, noHost, nil)
		if err != nil {
			t.Fatal(err)
		}
		bound := boundWith(t, key, pod, alloc)
		ref.UpdatePod(logger, bound)
		objects = append(objects, bound)
	}
	want := ref.Snapshot()
	for seed := uint64(0); seed < 20; seed++ {
		c, _ := testCache(t)
		rng := rand.New(rand.NewPCG(seed, 1))
		rng.Shuffle(len(objects), func(i, j int) { objects[i], objects[j] = objects[j], objects[i] })
		for _, o := range objects {
			switch o := o.(type) {
			case *corev1.Node:
				c.UpdateNode(logger, o)
			case *coordinationv1.Lease:
				c.UpdateLease(o, false)
			case *corev1.Pod:
				c.UpdatePod(logger, o)
			}
		}
		if got := c.Snapshot(); !reflect.DeepEqual(got, want) {
			t.Fatalf("order %d: state %+v, want %+v", seed, got, want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestCacheNodeChanges: a rebuilt inventory invalidates remembered Filter
// results, and a node deleted and re-added counts its pods again.
func TestCacheNodeChanges(t *testing.T) {
	c, key := testCache(t)
	logger := klog.Background()
	healthy := testNode(t, "n1", "t4x4")
	c.UpdateNode(logger, healthy)
	c.UpdateLease(testLease("n1", testNow), false)
	var p devicescheduler.Placement
	r := wholeRequest(t, c, 4)
	in := c.Input(ShapeKey{4}, r)
	if _, err := c.Evaluate(named("n1"), &in, noHost, noHost, &p); err != nil {
		t.Fatal(err)
	}
	// One GPU turns unhealthy: the idle node's version is 0 again, but the
	// 4-GPU pod must no longer fit, whether the node is looked up by the
	// new object, by the object the scheduler held before (it may not have
	// taken in the update yet) or by name.
	topo, _ := simgpu.Preset("t4x4")
	inv := simgpu.Inventory(topo, "n1")
	inv.Devices[3].Health = types.Unhealthy
	sick := testNode(t, "n1", "t4x4")
	if err := objects.SetNodeInventory(sick, inv); err != nil {
		t.Fatal(err)
	}
	c.UpdateNode(logger, sick)
	for _, n := range []*corev1.Node{sick, healthy, named("n1")} {
		if _, err := c.Evaluate(n, &in, noHost, noHost, &p); !errors.Is(err, devicescheduler.ErrDoesNotFit) {
			t.Fatalf("after a GPU turned unhealthy: %v, want ErrDoesNotFit (a stale memo, or the old object's state?)", err)
		}
	}
	if len(c.byObject) != 1 {
		t.Errorf("the cache holds %d Node objects for one node", len(c.byObject))
	}

	c.UpdateNode(logger, testNode(t, "n2", "t4x4"))
	c.UpdateLease(testLease("n2", testNow), false)
	alloc, err := c.Reserve(testPod("a"), "n2", wholeRequest(t, c, 2), noHost, noHost, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.UpdatePod(logger, boundWith(t, key, testPod("a"), alloc))
	c.DeleteNode("n2")
	if len(c.byObject) != 1 {
		t.Errorf("after n2's deletion the cache holds %d Node objects, want n1's", len(c.byObject))
	}
	c.UpdateNode(logger, testNode(t, "n2", "t4x4"))
	if got := c.Snapshot()["n2"].Pods; !reflect.DeepEqual(got, []string{"uid-a"}) {
		t.Fatalf("pods on the re-added node = %v, want [uid-a]", got)
	}
	// Removing the annotation of the running pod does not free its GPUs.
	stripped := boundWith(t, key, testPod("a"), alloc)
	stripped.Annotations = nil
	c.UpdatePod(logger, stripped)
	if got := c.Snapshot()["n2"].Pods; !reflect.DeepEqual(got, []string{"uid-a"}) {
		t.Fatalf("pods after the annotation was removed = %v, want [uid-a]", got)
	}
}

// noHost leaves the node's host resources untracked.
// TestCacheLearnsTheSameMix: a scheduler that starts (or takes over) and
// learns the mix from the pods running holds the mix of one that learned
// it pod by pod as it scheduled them, pods since gone included; and a
// pod's weight leaves the mix when the pod goes.
func TestCacheLearnsTheSameMix(t *testing.T) {
	ref, key := testCache(t)
	logger := klog.Background()
	ref.learnState = learned
	n1 := testNode(t, "n1", "dgx1")
	ref.UpdateNode(logger, n1)
	ref.UpdateLease(testLease("n1", testNow), false)
	var running []*corev1.Pod
	for i := range 60 {
		pod := gpuPod(fmt.Sprint("p", i), int64(1+i%2), int64(10*(i%3)), testNow.Add(time.Duration(i)*time.Hour))
		req, err := objects.PodRequest(pod)
		if err != nil {
			t.Fatal(err)
		}
		r, err := ref.engine.NewRequest(req, devicescheduler.Host{})
		if err != nil {
			t.Fatal(err)
		}
		// As Reserve does.
		ref.engine.ObservePod(string(pod.UID), r, pod.CreationTimestamp.Time)
		alloc, err := ref.Reserve(pod, "n1", r, noHost, noHost, nil)
		if err != nil {
			// The node is full: the pod is unreserved.
			ref.engine.ForgetPod(string(pod.UID))
			continue
		}
		bound := boundWith(t, key, pod, alloc)
		ref.UpdatePod(logger, bound)
		if i%4 == 0 {
			ref.Forget(logger, pod.UID) // deleted
			continue
		}
		running = append(running, bound)
	}
	if got, want := ref.engine.LearnedPods(), len(running); got != want {
		t.Fatalf("the mix holds %d pods, want the %d running", got, want)
	}
	// A pod bound without a valid allocation holds no devices: not learned.
	forged := gpuPod("forged", 8, 0, testNow)
	forged.Spec.NodeName = "n1"
	c, _ := testCache(t)
	c.UpdateNode(logger, n1)
	// The informers' initial lists, then the mix from the pods listed.
	for _, p := range append(running, forged) {
		c.UpdatePod(logger, p)
	}
	c.listPods = func() ([]*corev1.Pod, error) { return append(running, forged), nil }
	c.LearnPods(logger)
	if got, want := fmt.Sprint(c.engine.Workload().Types()), fmt.Sprint(ref.engine.Workload().Types()); got != want {
		t.Errorf("mix learned at start =\n%s\nwant the mix learned pod by pod\n%s", got, want)
	}
	for _, p := range running {
		c.Forget(logger, p.UID)
	}
	if n := c.engine.LearnedPods(); n != 0 || len(c.engine.Workload().Types()) != 0 {
		t.Errorf("after every pod went the mix holds %d pods and %d types, want none", n, len(c.engine.Workload().Types()))
	}
}

// TestCacheForgetsPodsGoneWhileLearning: a pod deleted while the mix is
// learned from a list that still holds it is not left in the mix.
func TestCacheForgetsPodsGoneWhileLearning(t *testing.T) {
	c, key := testCache(t)
	logger := klog.Background()
	c.UpdateNode(logger, testNode(t, "n1", "dgx1"))
	c.UpdateLease(testLease("n1", testNow), false)
	pod := gpuPod("p", 1, 0, testNow)
	r := wholeRequest(t, c, 1)
	alloc, err := c.Reserve(pod, "n1", r, noHost, noHost, nil)
	if err != nil {
		t.Fatal(err)
	}
	bound := boundWith(t, key, pod, alloc)
	c.UpdatePod(logger, bound)
	c.listPods = func() ([]*corev1.Pod, error) {
		c.Forget(logger, bound.UID) // the informer's delete, meanwhile
		return []*corev1.Pod{bound}, nil
	}
	c.LearnPods(logger)
	if c.engine.HasPod(string(bound.UID)) || c.engine.LearnedPods() != 0 {
		t.Errorf("the mix holds %d pods after the only one went while it was learned", c.engine.LearnedPods())
	}
}

// TestHostOnlyMemo: a pod without devices' score on a node is remembered
// for its CPU and memory request until the node's devices, its host
// resources or the request change, and a node rebuilt from a new inventory
// starts afresh.
func TestHostOnlyMemo(t *testing.T) {
	c, _ := testCache(t)
	logger := klog.Background()
	c.UpdateNode(logger, testNode(t, "n1", "dgx1"))
	c.UpdateLease(testLease("n1", testNow), false)
	// A mix of GPU pods that need CPU beside their GPUs: how much CPU a
	// pod without devices takes changes its score.
	gpuPod, err := c.engine.NewRequest(types.PodRequest{Containers: []types.ContainerRequest{{Name: "main", Count: 1}}}, devicescheduler.Host{CPUMilli: 8000, MemoryMiB: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		c.engine.Observe(gpuPod)
	}
	input := func(cpu int64) *Input {
		host := devicescheduler.Host{CPUMilli: cpu, MemoryMiB: 1024}
		r, err := c.engine.NewRequest(types.PodRequest{}, host)
		if err != nil {
			t.Fatal(err)
		}
		return &Input{request: r, workload: c.engine.Workload(), now: testNow, host: host}
	}
	capacity := devicescheduler.Host{CPUMilli: 64000, MemoryMiB: 512 << 10}
	var p devicescheduler.Placement
	score := func(in *Input, free devicescheduler.Host) int64 {
		t.Helper()
		s, err := c.EvaluateHostOnly(named("n1"), in, capacity, free, &p)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	want := func(in *Input, free devicescheduler.Host) int64 {
		t.Helper()
		c.mu.Lock()
		c.nodes["n1"].memo.clear()
		c.mu.Unlock()
		return score(in, free)
	}
	small, large := input(1000), input(60000)
	if s, w := score(small, capacity), want(small, capacity); s != w {
		t.Fatalf("remembered %d, evaluated %d", s, w)
	}
	// Another request on the same node: not the remembered score.
	if s, w := score(large, capacity), want(large, capacity); s != w || s == want(small, capacity) {
		t.Fatalf("a larger request got %d, evaluated %d (the smaller one's: %d)", s, w, want(small, capacity))
	}
	// Its free CPU changes: evaluated again (half the GPUs keep the CPU
	// they need with all of it free, one with less).
	mid := input(30000)
	less := devicescheduler.Host{CPUMilli: 31000, MemoryMiB: 512 << 10}
	score(mid, capacity)
	if s, w := score(mid, less), want(mid, less); s != w || s == want(mid, capacity) {
		t.Fatalf("with less CPU free: %d, evaluated %d (with all free: %d)", s, w, want(mid, capacity))
	}
	// So does its capacity.
	bigger := devicescheduler.Host{CPUMilli: 128000, MemoryMiB: 1 << 20}
	score(mid, capacity)
	if s, err := c.EvaluateHostOnly(named("n1"), mid, bigger, bigger, &p); err != nil || s == want(mid, capacity) {
		t.Fatalf("on a node with more CPU: %d, %v; the same as with less (%d)", s, err, want(mid, capacity))
	}
	// The workload mix changes: evaluated again.
	oldMix := want(mid, capacity)
	score(mid, capacity)
	bigGPUPod, err := c.engine.NewRequest(types.PodRequest{Containers: []types.ContainerRequest{{Name: "main", Count: 1}}}, devicescheduler.Host{CPUMilli: 30000, MemoryMiB: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		c.engine.Observe(bigGPUPod)
	}
	mid.workload = c.engine.Workload()
	if s, w := score(mid, capacity), want(mid, capacity); s != w || s == oldMix {
		t.Fatalf("under a new workload mix: %d, evaluated %d (under the old one: %d)", s, w, oldMix)
	}
	large = input(60000)
	// The node's devices change: evaluated again.
	before := score(large, capacity)
	if _, err := c.Reserve(testPod("a"), "n1", wholeRequest(t, c, 8), noHost, noHost, nil); err != nil {
		t.Fatal(err)
	}
	if after := score(large, capacity); after != want(large, capacity) || after == before {
		t.Fatalf("after the node filled up: %d (before %d), evaluated %d", after, before, want(large, capacity))
	}

	// Rebuilt from a new inventory: the memo starts afresh, though the new
	// devices start at the version the memo's results are for.
	c.Unreserve("uid-a")
	c.DeleteNode("n1")
	c.UpdateNode(logger, testNode(t, "n1", "dgx1"))
	eight := score(large, capacity)
	c.UpdateNode(logger, testNode(t, "n1", "t4x4"))
	if s, w := score(large, capacity), want(large, capacity); s != w || s == eight {
		t.Fatalf("after the inventory changed: %d, evaluated %d (8 GPUs: %d)", s, w, eight)
	}
}

// TestCacheForgetsGoneNodes: a node's state goes once its Node and Lease
// are deleted and no pod is counted there, whatever the order, so that a
// cluster whose nodes come and go keeps none for the gone ones.
func TestCacheForgetsGoneNodes(t *testing.T) {
	c, key := testCache(t)
	logger := klog.Background()
	for _, name := range []string{"n1", "n2"} {
		c.UpdateNode(logger, testNode(t, name, "dgx1"))
		c.UpdateLease(testLease(name, testNow), false)
	}
	c.warmed.Store(true)
	a := testPod("a")
	alloc, err := c.Reserve(a, "n1", wholeRequest(t, c, 1), noHost, noHost, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.UpdatePod(logger, boundWith(t, key, a, alloc))
	known := func(name string) bool {
		c.mu.RLock()
		defer c.mu.RUnlock()
		_, ok := c.nodes[name]
		return ok
	}
	c.DeleteNode("n1")
	c.DeleteLease(testLease("n1", testNow))
	if !known("n1") {
		t.Fatal("n1 was forgotten while pod a is counted there")
	}
	c.Forget(logger, a.UID)
	if known("n1") {
		t.Error("n1 is kept after its Node, Lease and last pod went")
	}
	c.DeleteLease(testLease("n2", testNow))
	if !known("n2") {
		t.Fatal("n2 was forgotten while its Node exists")
	}
	c.DeleteNode("n2")
	if known("n2") {
		t.Error("n2 is kept after its Lease and Node went")
	}
	// A Lease that comes back makes the node known again.
	c.UpdateLease(testLease("n2", testNow), false)
	if !known("n2") {
		t.Error("a new Lease of n2 is not taken in")
	}
}
