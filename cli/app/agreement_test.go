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
	"github.com/kubegpu/kubegpu/plugins/amd"
	"github.com/kubegpu/kubegpu/types"
)

// TestExplainAgreesWithTheScheduler: for 1,000 random GPU pods against
// random clusters (nodes not Ready, with stale, old or no Leases, short of
// CPU or memory, refusing the scheduler's key, with an unusable inventory,
// with GPUs in MIG mode; whole GPUs, slices and MIG instances held by bound
// pods, some signed with a key the scheduler does not hold, some borrowing
// under a namespace budget (PriorityClass kubegpu-borrowed), some being
// evicted by preemption; pods nominated to nodes by preemption, of higher
// and lower priorities, in namespaces of both enforcement policies),
// `kubegpu explain`, reading the cluster from the API, gives every node the
// verdict, the Filter status, the score and the rank that
// kubegpu-scheduler's plugin gives it: its PreFilter, Filter (with the
// framework's first pass over the node with its nominated pods added, as
// RunFilterPluginsWithNominatedPods makes it), AddPod, Score and
// NormalizeScore run over a device cache fed by its informer handlers, on
// the framework's NodeInfos.
func TestExplainAgreesWithTheScheduler(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	key := cachetest.Key(t)
	keys := kubeinterface.NewKeySet(key)
	const clusters, podsPerCluster = 50, 24
	compared := 0
	indexer := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{})
	for _, ns := range namespaces() {
		if err := indexer.Add(ns); err != nil {
			t.Fatal(err)
		}
	}
	lister := corelisters.NewNamespaceLister(indexer)
	args := plugin.DefaultArgs()
	ctx := context.Background()
	nominatedNodes := 0
	for cl := range clusters {
		objs, nodes, bound, nominated := randomCluster(t, rng, key, cl)
		for _, ns := range namespaces() {
			objs = append(objs, ns)
		}
		client := fake.NewClientset(objs...)
		s, err := loadState(ctx, client, keys)
		if err != nil {
			t.Fatal(err)
		}
		s.policies = namespacePolicies(ctx, client, s.nominated, args.Enforcement)
		engine := cachetest.Engine(t)
		now := time.Now()
		sched := schedulerCache(engine, keys, nodes, objs, bound, now)
		p := plugin.NewOverCache(ctx, args, sched, lister)
		o := &explainOptions{key: keys, staleness: 40 * time.Second}
		// A scheduler of one profile, or of two (its configuration file
		// given to explain): one nominator for all its profiles.
		profiles := []string{""}
		if cl%2 == 1 {
			o.schedulerNames = []string{"", "another-profile"}
			profiles = o.schedulerNames
		}
		for i := range podsPerCluster {
			pod := randomGPUPod(rng, fmt.Sprintf("p%d-%d", cl, i))
			pod.Namespace = []string{"ns", "strict"}[rng.IntN(2)]
			cpu, mem := objects.HostRequest(pod)
			policy, err := objects.EnforcementPolicy(namespaces()[slices.IndexFunc(namespaces(), func(n *corev1.Namespace) bool { return n.Name == pod.Namespace })], args.Enforcement)
			if err != nil {
				t.Fatal(err)
			}
			r, req, err := devicecache.CompileRequest(engine, pod, devicescheduler.Host{CPUMilli: cpu, MemoryMiB: mem}, policy)
			if err != nil {
				// A slice without memory under Required: refused before
				// any node is judged, by both.
				if _, st := p.PreFilter(ctx, framework.NewCycleState(), pod, nil); st.Code() != fwk.UnschedulableAndUnresolvable {
					t.Fatalf("pod %s: explain refuses its request (%v), the scheduler's PreFilter says %v", pod.Name, err, st)
				}
				continue
			}
			rows := o.evaluate(engine, s, r, pod, now)
			want, withNominated := schedulerRows(t, p, nodes, bound, nominated, profiles, pod)
			nominatedNodes += withNominated
			for i := range rows {
				rows[i].reason, rows[i].devices, rows[i].refusal = "", "", nil // explain's own words and error
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
	// The random states must reach what they are there for.
	if nominatedNodes < 100 {
		t.Fatalf("only %d nodes were judged with pods nominated to them", nominatedNodes)
	}
}

// namespaces are the test's namespaces: one under the scheduler's default
// enforcement policy, one that requires enforced slices.
func namespaces() []*corev1.Namespace {
	return []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "ns"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "strict", Labels: map[string]string{kubeinterface.LabelEnforcement: string(types.EnforcementRequired)}}},
	}
}

// randomCluster makes the API objects of a cluster of a few nodes: their
// Leases, the pods bound there with signed allocations, and pods nominated
// to them, not bound yet (also among the objects).
func randomCluster(t *testing.T, rng *rand.Rand, key *kubeinterface.Key, cl int) (objs []runtime.Object, nodes []*corev1.Node, bound, nominated []*corev1.Pod) {
	now := time.Now()
	presets := []string{"dgx1", "t4x4", "dgx-a100", "dgx-h100"}
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
		case 3, 4:
			withMIG(t, rng, n)
		case 5, 6:
			asAMD(t, n)
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
			if rng.IntN(6) == 0 {
				// Evicted for a preemptor, still running out its grace.
				b.DeletionTimestamp = &metav1.Time{Time: now}
				b.Status.Conditions = append(b.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget,
					Status: corev1.ConditionTrue, Reason: corev1.PodReasonPreemptionByScheduler})
			}
			bound = append(bound, b)
			objs = append(objs, b)
		}
	}
	// Pods nominated by preemption, some asking for no GPUs, some in a
	// namespace that does not exist (the scheduler places no devices for
	// them), in the order of their creation.
	for i := range rng.IntN(5) {
		p := randomGPUPod(rng, fmt.Sprintf("c%d-nominated%d", cl, i))
		p.CreationTimestamp = metav1.NewTime(cachetest.Now.Add(time.Duration(i) * time.Second))
		switch rng.IntN(6) {
		case 0:
			p.Spec.Containers[0].Resources.Limits = nil
		case 1:
			p.Namespace = "gone"
		case 2, 3:
			p.Namespace = "strict"
		}
		switch rng.IntN(8) {
		case 0:
			p.Status.Phase = corev1.PodFailed // the scheduler's informer leaves it out
		case 1:
			p.Spec.SchedulerName = "another-profile" // the scheduler's second profile, in some clusters
		}
		p.Status.NominatedNodeName = nodes[rng.IntN(len(nodes))].Name
		nominated = append(nominated, p)
		objs = append(objs, p)
	}
	return objs, nodes, bound, nominated
}

// withMIG puts one or two of n's GPUs in MIG mode: each carved into two to
// four instances, which the inventory lists after their parent.
func withMIG(t *testing.T, rng *rand.Rand, n *corev1.Node) {
	t.Helper()
	inv, err := objects.NodeInventory(n)
	if err != nil {
		t.Fatal(err)
	}
	for g := range 1 + rng.IntN(2) {
		parent := inv.Devices[g]
		for i := range 2 + rng.IntN(3) {
			d := parent
			d.ID, d.UUID = fmt.Sprintf("%s-mig%d", parent.ID, i), fmt.Sprintf("MIG-%s-%d", parent.UUID, i)
			d.Model, d.MemoryMiB, d.Parent = parent.Model+" MIG 1g", parent.MemoryMiB/8, parent.ID
			inv.Devices = append(inv.Devices, d)
		}
	}
	if err := objects.SetNodeInventory(n, inv); err != nil {
		t.Fatal(err)
	}
}

// asAMD makes n's GPUs AMD's: served as amd.com/gpu and rated by the AMD
// module, links and all.
func asAMD(t *testing.T, n *corev1.Node) {
	t.Helper()
	inv, err := objects.NodeInventory(n)
	if err != nil {
		t.Fatal(err)
	}
	for i := range inv.Devices {
		inv.Devices[i].Vendor, inv.Devices[i].Resource = amd.Vendor, types.ResourceAMDGPU
	}
	if err := objects.SetNodeInventory(n, inv); err != nil {
		t.Fatal(err)
	}
}

// randomGPUPod asks for whole GPUs or slices (of NVIDIA's or AMD's), with CPU and memory, at a
// high, the default or the borrowers' priority (a pod over its namespace's
// GPU budget).
func randomGPUPod(rng *rand.Rand, name string) *corev1.Pod {
	cores := int64(0)
	if rng.IntN(3) == 0 {
		cores = int64(10 * (1 + rng.IntN(9)))
	}
	p := cachetest.GPUPod(name, int64(1+rng.IntN(4)), cores, cachetest.Now)
	if rng.IntN(4) == 0 {
		limits := p.Spec.Containers[0].Resources.Limits
		limits[types.ResourceAMDGPU] = limits[kubeinterface.ResourceGPU]
		delete(limits, kubeinterface.ResourceGPU)
	}
	if cores > 0 && rng.IntN(3) > 0 {
		p.Spec.Containers[0].Resources.Limits[kubeinterface.ResourceGPUMemory] = *resource.NewQuantity(int64(1024*(1+rng.IntN(16))), resource.DecimalSI)
	}
	p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(int64(100*rng.IntN(80)), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(int64(rng.IntN(64))<<30+int64(rng.IntN(1<<20)), resource.BinarySI),
	}
	prio := []int32{1000, 0, kubeinterface.BorrowedPriority}[rng.IntN(3)]
	p.Spec.Priority = &prio
	if prio == kubeinterface.BorrowedPriority {
		p.Spec.PriorityClassName = kubeinterface.PriorityClassBorrowed
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
// order NormalizeScore keeps), then the others by name. It also returns on
// how many nodes pods nominated there were counted.
func schedulerRows(t *testing.T, p *plugin.Plugin, nodes []*corev1.Node, bound, nominated []*corev1.Pod, profiles []string, pod *corev1.Pod) ([]explainRow, int) {
	ctx := context.Background()
	infos := make([]fwk.NodeInfo, len(nodes))
	for i, n := range nodes {
		var here []*corev1.Pod
		for _, b := range bound {
			if b.Spec.NodeName == n.Name {
				here = append(here, b)
			}
		}
		ni := framework.NewNodeInfo(here...)
		ni.SetNode(n)
		infos[i] = ni
	}
	// The framework's order: PreFilter, Filter on every node, PreScore,
	// then Score on the nodes that passed.
	cs := framework.NewCycleState()
	if _, st := p.PreFilter(ctx, cs, pod, infos); !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	rows := make([]explainRow, len(nodes))
	var passed []fwk.NodeInfo
	withNominated := 0
	for i, ni := range infos {
		rows[i] = explainRow{node: nodes[i].Name}
		st := filterWithNominated(t, p, cs, pod, ni, nominated, profiles)
		if st.added {
			withNominated++
		}
		if !st.status.IsSuccess() {
			rows[i].status = st.status.Message()
		} else {
			passed = append(passed, ni)
		}
	}
	if st := p.PreScore(ctx, cs, pod, passed); !st.IsSuccess() {
		t.Fatalf("PreScore: %v", st)
	}
	var scores fwk.NodeScoreList
	for i, ni := range infos {
		if rows[i].status != "" {
			continue
		}
		score, st := p.Score(ctx, cs, pod, ni)
		if !st.IsSuccess() {
			t.Fatalf("Score: %v", st)
		}
		rows[i].fits, rows[i].score = true, score
		scores = append(scores, fwk.NodeScore{Name: nodes[i].Name, Score: score})
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
	return rows, withNominated
}

type filtered struct {
	status *fwk.Status
	added  bool
}

// filterWithNominated runs the plugin's Filter as the framework's
// RunFilterPluginsWithNominatedPods (k8s.io/kubernetes
// pkg/scheduler/framework/runtime) does: when pods of at least pod's
// priority are nominated to the node, first on a copy of the cycle state
// and of the NodeInfo with them added (the NodeInfo's AddPodInfo, then the
// plugin's AddPod, in the order they were nominated), then, if that
// passed, as it is. Here they were nominated in the order of nominated, and
// the nominator holds the pods of the scheduler's profiles that its
// informer lists (not the finished ones).
func filterWithNominated(t *testing.T, p *plugin.Plugin, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo, nominated []*corev1.Pod, profiles []string) filtered {
	ctx := context.Background()
	prio := func(p *corev1.Pod) int32 { return *p.Spec.Priority }
	stateOut, niOut := cs.Clone(), ni.Snapshot()
	added := false
	for _, np := range nominated {
		if np.Status.NominatedNodeName != ni.Node().Name || prio(np) < prio(pod) || np.Status.Phase == corev1.PodFailed || !slices.Contains(profiles, np.Spec.SchedulerName) {
			continue
		}
		pi, err := framework.NewPodInfo(np)
		if err != nil {
			t.Fatal(err)
		}
		niOut.AddPodInfo(pi)
		if st := p.AddPod(ctx, stateOut, pod, pi, niOut); !st.IsSuccess() {
			t.Fatalf("AddPod: %v", st)
		}
		added = true
	}
	if added {
		if st := p.Filter(ctx, stateOut, pod, niOut); !st.IsSuccess() {
			return filtered{st, true}
		}
	}
	return filtered{p.Filter(ctx, cs, pod, ni), added}
}

// TestExplainEngineRatesEveryVendor: explain's engine has the scheduler
// side of every module kubegpu ships, so that it judges an AMD node's
// GPUs as the scheduler (which loads amd.so) does.
func TestExplainEngineRatesEveryVendor(t *testing.T) {
	e, err := newEngine(context.Background(), plugin.DefaultArgs())
	if err != nil {
		t.Fatal(err)
	}
	topo, err := amd.Discover("../../plugins/amd/testdata/mi300x-8")
	if err != nil {
		t.Fatal(err)
	}
	n, err := e.NewNode("mi300x", topo.Inventory, devicescheduler.Host{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := e.NewRequest(types.PodRequest{Containers: []types.ContainerRequest{{Name: "c", Count: 8, Selector: types.Selector{Resource: types.ResourceAMDGPU}}}}, devicescheduler.Host{})
	if err != nil {
		t.Fatal(err)
	}
	var p devicescheduler.Placement
	if err := e.Evaluate(n, r, &p); err != nil {
		t.Errorf("8 AMD GPUs on an 8 x MI300X node: %v", err)
	}
}
