package app

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache/cachetest"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// TestExplainAgreesWithTheScheduler: for 1,000 random GPU pods against
// random clusters (nodes not Ready, with stale or no Leases, short of CPU
// or memory, refusing the scheduler's key, with an unusable inventory;
// whole GPUs and slices held by bound pods), `kubegpu explain`, reading the
// cluster from the API, gives every node the verdict, reason and score the
// scheduler's Filter and Score give it: the device cache fed by the
// scheduler's informer handlers, the node's host resources counted by the
// framework's NodeInfo.
func TestExplainAgreesWithTheScheduler(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	key := cachetest.Key(t)
	keys := kubeinterface.NewKeySet(key)
	const clusters, podsPerCluster = 50, 20
	compared := 0
	for cl := range clusters {
		objs, nodes, bound := randomCluster(t, rng, key, cl)
		client := fake.NewClientset(objs...)
		s, err := loadState(context.Background(), client, keys)
		if err != nil {
			t.Fatal(err)
		}
		engine := cachetest.Engine(t)
		now := time.Now()
		sched := schedulerCache(engine, keys, nodes, objs, bound, now)
		o := &explainOptions{key: keys, staleness: 40 * time.Second}
		for i := range podsPerCluster {
			pod := randomGPUPod(rng, fmt.Sprintf("p%d-%d", cl, i))
			req, err := objects.PodRequest(pod)
			if err != nil {
				t.Fatal(err)
			}
			cpu, mem := objects.HostRequest(pod)
			r, err := engine.NewRequest(req, devicescheduler.Host{CPUMilli: cpu, MemoryMiB: mem})
			if err != nil {
				t.Fatal(err)
			}
			rows := o.evaluate(engine, s, r, pod, now)
			want := schedulerRows(sched, nodes, bound, r)
			if !slices.Equal(rows, want) {
				t.Fatalf("cluster %d, pod %s (%+v):\nexplain   %+v\nscheduler %+v", cl, pod.Name, req, rows, want)
			}
			compared++
		}
	}
	if compared < 1000 {
		t.Fatalf("compared %d pods, want 1,000", compared)
	}
}

// randomCluster makes the API objects of a cluster of a few nodes: their
// Leases and the pods bound there with signed allocations.
func randomCluster(t *testing.T, rng *rand.Rand, key *kubeinterface.Key, cl int) ([]runtime.Object, []*corev1.Node, []*corev1.Pod) {
	now := time.Now()
	presets := []string{"dgx1", "t4x4", "dgx-a100", "dgx-h100"}
	var objs []runtime.Object
	var nodes []*corev1.Node
	var bound []*corev1.Pod
	scratch := devicecache.New(devicecache.Config{Engine: cachetest.Engine(t), Keys: kubeinterface.NewKeySet(key), Staleness: time.Hour})
	for i := range 2 + rng.IntN(5) {
		n := cachetest.Node(t, fmt.Sprintf("c%d-n%d", cl, i), presets[rng.IntN(len(presets))])
		n.Status.Allocatable = corev1.ResourceList{
			corev1.ResourceCPU:    *resource.NewMilliQuantity(int64(1000*(1+rng.IntN(64))), resource.DecimalSI),
			corev1.ResourceMemory: *resource.NewQuantity(int64(1+rng.IntN(512))<<30+int64(rng.IntN(1<<20)), resource.BinarySI),
		}
		switch rng.IntN(12) {
		case 0:
			n.Status.Conditions[0].Status, n.Status.Conditions[0].Reason = corev1.ConditionFalse, "KubeletNotReady"
		case 1:
			n.Annotations[kubeinterface.AnnotationInventory] = "{"
		case 2:
			inv, _ := objects.NodeInventory(n)
			inv.KeyIDs = []string{"ed25519:0123456789abcdef"}
			if err := objects.SetNodeInventory(n, inv); err != nil {
				t.Fatal(err)
			}
		}
		nodes = append(nodes, n)
		objs = append(objs, n)
		switch rng.IntN(10) {
		case 0: // no Lease
		case 1:
			objs = append(objs, cachetest.Lease(n.Name, now.Add(-2*time.Minute)))
		default:
			objs = append(objs, cachetest.Lease(n.Name, now.Add(-time.Duration(rng.IntN(20))*time.Second)))
		}
		scratch.UpdateNode(klog.Background(), n)
		scratch.UpdateLease(cachetest.Lease(n.Name, now), false)
		for j := range rng.IntN(6) {
			p := randomGPUPod(rng, fmt.Sprintf("%s-b%d", n.Name, j))
			req, err := objects.PodRequest(p)
			if err != nil {
				t.Fatal(err)
			}
			r, err := scratch.Engine().NewRequest(req, devicescheduler.Host{})
			if err != nil {
				t.Fatal(err)
			}
			alloc, err := scratch.Reserve(p, n.Name, r, devicescheduler.Host{}, devicescheduler.Host{}, nil)
			if err != nil {
				continue // full
			}
			b := cachetest.BoundWith(t, key, p, alloc)
			b.Status.Phase = corev1.PodRunning
			bound = append(bound, b)
			objs = append(objs, b)
		}
	}
	return objs, nodes, bound
}

// randomGPUPod asks for whole GPUs or slices, with CPU and memory.
func randomGPUPod(rng *rand.Rand, name string) *corev1.Pod {
	cores := int64(0)
	if rng.IntN(3) == 0 {
		cores = int64(10 * (1 + rng.IntN(9)))
	}
	p := cachetest.GPUPod(name, int64(1+rng.IntN(4)), cores, cachetest.Now)
	p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(int64(100*rng.IntN(80)), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(int64(rng.IntN(64))<<30+int64(rng.IntN(1<<20)), resource.BinarySI),
	}
	return p
}

// schedulerCache is the scheduler's device cache fed by its informer
// handlers with objs, each Lease seen renewed when it was written.
func schedulerCache(engine *devicescheduler.Engine, keys *kubeinterface.KeySet, nodes []*corev1.Node, objs []runtime.Object, bound []*corev1.Pod, now time.Time) *devicecache.Cache {
	clock := now
	c := devicecache.New(devicecache.Config{Engine: engine, Keys: keys, SigningKey: keys.IDs()[0], Staleness: 40 * time.Second,
		Now: func() time.Time { return clock }})
	logger := klog.Background().V(10)
	for _, n := range nodes {
		c.UpdateNode(logger, n)
	}
	for _, obj := range objs {
		if lease, ok := obj.(*coordinationv1.Lease); ok {
			clock = lease.Spec.RenewTime.Time
			c.UpdateLease(lease, false)
		}
	}
	clock = now
	for _, p := range bound {
		c.UpdatePod(logger, p)
	}
	return c
}

// schedulerRows is what Filter and Score say of r on every node, in
// explain's order: fitting nodes best first, then the others by name.
func schedulerRows(c *devicecache.Cache, nodes []*corev1.Node, bound []*corev1.Pod, r *devicescheduler.Request) []explainRow {
	in := c.InputOnce(r)
	var rows []explainRow
	for _, n := range nodes {
		var here []*corev1.Pod
		for _, p := range bound {
			if p.Spec.NodeName == n.Name {
				here = append(here, p)
			}
		}
		ni := framework.NewNodeInfo(here...)
		ni.SetNode(n)
		a, req := ni.GetAllocatable(), ni.GetRequested()
		capacity, free := devicecache.NodeHost(a.GetMilliCPU(), a.GetMemory(), req.GetMilliCPU(), req.GetMemory())
		var pl devicescheduler.Placement
		row := explainRow{node: n.Name}
		score, err := c.Evaluate(n, &in, capacity, free, &pl)
		if err != nil {
			row.reason = devicecache.Classify(err).Detail()
		} else {
			row.fits, row.score, row.devices = true, score, allocationDevices(pl.Allocation())
		}
		rows = append(rows, row)
	}
	sortRows(rows)
	return rows
}
