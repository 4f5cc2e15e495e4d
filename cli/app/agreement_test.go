package app

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/kubegpu/kubegpu/kube-scheduler/plugin"

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
// random clusters (nodes not Ready, with stale, old or no Leases, short of
// CPU or memory, refusing the scheduler's key, with an unusable inventory;
// whole GPUs and slices held by bound pods, some signed with a key the
// scheduler does not hold), `kubegpu explain`, reading the cluster from the
// API, gives every node the verdict, the Filter status, the score and the
// rank that kubegpu-scheduler's plugin gives it: its PreFilter, Filter,
// Score and NormalizeScore run over a device cache fed by its informer
// handlers, on the framework's NodeInfos.
func TestExplainAgreesWithTheScheduler(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	key := cachetest.Key(t)
	keys := kubeinterface.NewKeySet(key)
	const clusters, podsPerCluster = 50, 20
	compared := 0
	indexer := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{})
	if err := indexer.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}); err != nil {
		t.Fatal(err)
	}
	namespaces := corelisters.NewNamespaceLister(indexer)
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
		p := plugin.NewOverCache(context.Background(), plugin.DefaultArgs(), sched, namespaces)
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
			want := schedulerRows(t, p, nodes, bound, pod)
			for i := range rows {
				rows[i].reason, rows[i].devices = "", "" // explain's own words
			}
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
	otherKey, err := kubeinterface.NewHMACKey([]byte(strings.Repeat("o", 32)))
	if err != nil {
		t.Fatal(err)
	}
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
			signer := key
			if rng.IntN(8) == 0 {
				signer = otherKey // holds nothing: the scheduler does not verify it
			}
			b := cachetest.BoundWith(t, signer, p, alloc)
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

// schedulerRows is what the plugin's Filter and Score say of pod on every
// node, in explain's order: fitting nodes by their score, best first (the
// order NormalizeScore keeps), then the others by name.
func schedulerRows(t *testing.T, p *plugin.Plugin, nodes []*corev1.Node, bound []*corev1.Pod, pod *corev1.Pod) []explainRow {
	ctx := context.Background()
	cs := framework.NewCycleState()
	if _, st := p.PreFilter(ctx, cs, pod, nil); !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	var rows []explainRow
	var scores fwk.NodeScoreList
	for _, n := range nodes {
		var here []*corev1.Pod
		for _, b := range bound {
			if b.Spec.NodeName == n.Name {
				here = append(here, b)
			}
		}
		ni := framework.NewNodeInfo(here...)
		ni.SetNode(n)
		row := explainRow{node: n.Name}
		if st := p.Filter(ctx, cs, pod, ni); !st.IsSuccess() {
			row.status = st.Message()
		} else {
			score, st := p.Score(ctx, cs, pod, ni)
			if !st.IsSuccess() {
				t.Fatalf("Score: %v", st)
			}
			row.fits, row.score = true, score
			scores = append(scores, fwk.NodeScore{Name: n.Name, Score: score})
		}
		rows = append(rows, row)
	}
	sortRows(rows)
	// NormalizeScore ranks as explain orders: by the raw scores.
	normalized := slices.Clone(scores)
	if st := p.NormalizeScore(ctx, cs, pod, normalized); !st.IsSuccess() {
		t.Fatalf("NormalizeScore: %v", st)
	}
	for i := range scores {
		for j := range scores {
			if scores[i].Score > scores[j].Score && normalized[i].Score <= normalized[j].Score {
				t.Fatalf("NormalizeScore ranks %s (%d) no higher than %s (%d)", scores[i].Name, scores[i].Score, scores[j].Name, scores[j].Score)
			}
		}
	}
	return rows
}
