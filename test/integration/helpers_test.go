package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/crishim/advertiser"
	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/plugins/simgpu"
	"github.com/kubegpu/kubegpu/types"
)

// heartbeatStaleness outlasts the API server outage test's ten seconds;
// simulated kubelets renew their Leases every simLeaseDuration/4.
const (
	heartbeatStaleness = 20 * time.Second
	simLeaseDuration   = 4 * time.Second
)

// startScheduler runs _output/bin/kubegpu-scheduler with the shipped
// configuration (kube-scheduler/config/kubegpu-scheduler.yaml) as the
// cluster's only scheduler, as system:kube-scheduler, and waits until it is
// healthy.
func startScheduler(ctx context.Context, t *testing.T, extraArgs ...string) *localcluster.Scheduler {
	t.Helper()
	return startSchedulerWriting(ctx, t, "Bind", extraArgs...)
}

// startSchedulerWriting starts the scheduler with the plugin's
// writeAllocation set to mode (Bind or PreBind) and extra plugin args
// ("heartbeatStaleness: 5s").
func startSchedulerWriting(ctx context.Context, t *testing.T, mode string, extraArgs ...string) *localcluster.Scheduler {
	t.Helper()
	return startSchedulerSigning(ctx, t, keyFile, append([]string{"writeAllocation: " + mode}, extraArgs...)...)
}

// startSchedulerSigning starts the scheduler signing with the key in
// signingKeyFile, with extra plugin args.
func startSchedulerSigning(ctx context.Context, t *testing.T, signingKeyFile string, extraArgs ...string) *localcluster.Scheduler {
	t.Helper()
	args := append([]string{"heartbeatStaleness: " + heartbeatStaleness.String()}, extraArgs...)
	config, err := cluster.ShippedSchedulerConfig(filepath.Join(repoRoot, "kube-scheduler/config/kubegpu-scheduler.yaml"),
		schedulerID.Kubeconfig, pluginDir, signingKeyFile, 500, args...)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cluster.StartScheduler(ctx, filepath.Join(binDir, "kubegpu-scheduler"), config, "kubegpu-scheduler", "--v=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	return s
}

// simNodes are nodes without kubelets: a simulated kubelet registers each
// with the node's own credentials and renews its Lease, and its devices are
// published with those credentials exactly as kubegpu-crishim's advertiser
// publishes them.
type simNodes struct {
	mu       sync.Mutex
	names    []string
	kubelets map[string]*localcluster.SimKubelet
	invs     map[string]types.Inventory
}

// addNodes creates nodes name-0..name-(count-1) with a simgpu preset.
func addNodes(ctx context.Context, t *testing.T, prefix, preset string, count int, opts ...nodeOptions) *simNodes {
	t.Helper()
	sn := &simNodes{kubelets: map[string]*localcluster.SimKubelet{}, invs: map[string]types.Inventory{}}
	t.Cleanup(func() {
		sn.mu.Lock()
		defer sn.mu.Unlock()
		for _, n := range sn.names {
			sn.kubelets[n].Pause()
			_ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{})
			_ = cluster.Client.CoordinationV1().Leases(kubeinterface.LeaseNamespace).Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	})
	var o nodeOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	sn.addWith(ctx, t, prefix, preset, count, o)
	return sn
}

func (sn *simNodes) add(ctx context.Context, t *testing.T, prefix, preset string, count int) {
	t.Helper()
	sn.addWith(ctx, t, prefix, preset, count, nodeOptions{})
}

// nodeOptions are what addWith may change of a simulated node.
type nodeOptions struct {
	// capacity is its CPU, memory and pods (default 96 CPUs, 768Gi, 250).
	capacity corev1.ResourceList
	// clock is its kubelet's clock (default the real one).
	clock clock.Clock
}

// addWith adds nodes with opts; with no preset, one node named prefix
// without GPUs.
func (sn *simNodes) addWith(ctx context.Context, t *testing.T, prefix, preset string, count int, opts nodeOptions) {
	t.Helper()
	if opts.capacity == nil {
		opts.capacity = localcluster.NodeCapacity("96", "768Gi", 250)
	}
	var topo simgpu.Topology
	if preset != "" {
		var err error
		if topo, err = simgpu.Preset(preset); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < count; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		if count == 1 && preset == "" {
			name = prefix
		}
		k, err := cluster.StartSimKubelet(ctx, localcluster.SimKubeletOptions{Node: name, Capacity: opts.capacity,
			LeaseDuration: simLeaseDuration, Clock: opts.clock})
		if err != nil {
			t.Fatal(err)
		}
		sn.mu.Lock()
		sn.names = append(sn.names, name)
		sn.kubelets[name] = k
		sn.mu.Unlock()
		if preset == "" {
			continue // a node without GPUs
		}
		client, err := advertiser.NewClient(k.Identity.Config)
		if err != nil {
			t.Fatal(err)
		}
		inv := simgpu.Inventory(topo, name)
		if err := advertiser.PublishInventory(ctx, client, name, inv, advertiser.Capacity(inv, advertiser.DefaultSlicesPerDevice)); err != nil {
			t.Fatal(err)
		}
		sn.mu.Lock()
		sn.invs[name] = inv
		sn.mu.Unlock()
	}
}

// pause stops renewing a node's Lease, as a node that died would.
func (sn *simNodes) pause(name string) {
	sn.mu.Lock()
	k := sn.kubelets[name]
	sn.mu.Unlock()
	k.Pause()
}

// resume renews a node's Lease again.
func (sn *simNodes) resume(name string) {
	sn.mu.Lock()
	k := sn.kubelets[name]
	sn.mu.Unlock()
	k.Resume()
}

// tenants are the identities of the tests' namespaces.
var (
	tenantsMu sync.Mutex
	tenants   = map[string]*localcluster.Identity{}
)

// namespace makes a fresh namespace with a tenant of its own (user
// tenant-NAME, bound to the built-in edit role there), deleted (pods first,
// at once) when the test ends.
func namespace(ctx context.Context, t *testing.T, name string) string {
	t.Helper()
	if err := cluster.EnsureNamespace(ctx, name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = cluster.Client.CoreV1().Pods(name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
		_ = cluster.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	})
	user := "tenant-" + name
	_, err := cluster.Client.RbacV1().RoleBindings(name).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	id, err := cluster.Identity(user)
	if err != nil {
		t.Fatal(err)
	}
	waitAllowed(ctx, t, id, name)
	tenantsMu.Lock()
	tenants[name] = id
	tenantsMu.Unlock()
	return name
}

// tenant is the identity of namespace ns's tenant.
func tenant(t *testing.T, ns string) kubernetes.Interface {
	t.Helper()
	tenantsMu.Lock()
	defer tenantsMu.Unlock()
	id, ok := tenants[ns]
	if !ok {
		t.Fatalf("namespace %s has no tenant (make it with namespace())", ns)
	}
	return id.Client
}

// gpuPod asks for count devices per its container: whole devices, or slices
// of cores percent and memMiB each.
func gpuPod(name string, count, cores int, memMiB int64, annotations map[string]string) *corev1.Pod {
	limits := corev1.ResourceList{kubeinterface.ResourceGPU: *resource.NewQuantity(int64(count), resource.DecimalSI)}
	if cores > 0 {
		limits[kubeinterface.ResourceGPUCores] = *resource.NewQuantity(int64(cores), resource.DecimalSI)
	}
	if memMiB > 0 {
		limits[kubeinterface.ResourceGPUMemory] = *resource.NewQuantity(memMiB, resource.DecimalSI)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Image: "busybox",
			Resources: corev1.ResourceRequirements{
				Limits:   limits,
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			},
		}}},
	}
}

// createPods creates pods as the namespace's tenant.
func createPods(ctx context.Context, t *testing.T, ns string, pods ...*corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		if _, err := tenant(t, ns).CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// settle waits until every pod in ns is bound or marked unschedulable and
// the count of bound pods has not changed for quiet, and returns the pods.
func settle(ctx context.Context, t *testing.T, ns string, quiet, timeout time.Duration) []corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	lastBound, since := -1, time.Now()
	for {
		list, err := viewer.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			bound, decided := 0, 0
			for i := range list.Items {
				p := &list.Items[i]
				switch {
				case p.Spec.NodeName != "":
					bound++
					decided++
				case unschedulable(p):
					decided++
				}
			}
			if bound != lastBound {
				lastBound, since = bound, time.Now()
			}
			if decided == len(list.Items) && time.Since(since) >= quiet {
				return list.Items
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pods in %s did not settle within %s (last error: %v, bound %d)", ns, timeout, err, lastBound)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// judged waits until the scheduler has decided on pod ns/name: bound, or
// marked unschedulable. A test that asserts a pod is not placed asserts it
// on the scheduler's decision, not after a guessed delay.
func judged(ctx context.Context, t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	return waitPod(ctx, t, ns, name, "judged by the scheduler", func(p *corev1.Pod) bool { return p.Spec.NodeName != "" || unschedulable(p) })
}

func unschedulable(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return true
		}
	}
	return false
}

// checkAllocations verifies every bound pod's allocation (signature, pod,
// node) and that no device is over-committed, and returns the allocations by
// pod name.
func checkAllocations(t *testing.T, pods []corev1.Pod, invs map[string]types.Inventory) map[string]kubeinterface.Allocation {
	t.Helper()
	type use struct {
		exclusive   int
		shared      int
		cores       int
		memMiB      int64
		capacityMiB int64
	}
	uses := map[string]*use{} // node/device ID
	out := map[string]kubeinterface.Allocation{}
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == "" {
			continue
		}
		a, err := objects.PodAllocation(p)
		if err != nil {
			t.Errorf("bound pod %s: %v", p.Name, err)
			continue
		}
		if err := signingKey.Verify(a); err != nil {
			t.Errorf("bound pod %s: %v", p.Name, err)
		}
		if a.Pod.Name != p.Name || a.Pod.Namespace != p.Namespace || a.Pod.UID != p.UID || a.Node != p.Spec.NodeName {
			t.Errorf("bound pod %s/%s (%s) on %s carries the allocation of %+v on %s", p.Namespace, p.Name, p.UID, p.Spec.NodeName, a.Pod, a.Node)
		}
		out[p.Name] = a
		for _, c := range append(append([]types.ContainerAllocation{}, a.InitContainers...), a.Containers...) {
			for _, d := range c.Devices {
				key := a.Node + "/" + d.ID
				u := uses[key]
				if u == nil {
					u = &use{}
					for _, dev := range invs[a.Node].Devices {
						if dev.ID == d.ID {
							u.capacityMiB = dev.MemoryMiB
						}
					}
					uses[key] = u
				}
				if d.Exclusive {
					u.exclusive++
				} else {
					u.shared++
					u.cores += d.ComputePercent
					u.memMiB += d.MemoryMiB
				}
			}
		}
	}
	for key, u := range uses {
		if u.exclusive > 1 || (u.exclusive == 1 && u.shared > 0) || u.cores > 100 || u.memMiB > u.capacityMiB {
			t.Errorf("device %s over-committed: %d exclusive, %d shares with %d%% and %d of %d MiB", key, u.exclusive, u.shared, u.cores, u.memMiB, u.capacityMiB)
		}
	}
	return out
}

// assertNothingFits checks, with an engine over the final state, that no
// pending pod fits on any node: the scheduler left nothing schedulable.
func assertNothingFits(t *testing.T, pods []corev1.Pod, allocs map[string]kubeinterface.Allocation, invs map[string]types.Inventory) {
	t.Helper()
	sp, err := simgpu.NewModule().SchedulerPlugin(context.Background(), types.PluginConfig{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := devicescheduler.New(devicescheduler.Config{Plugins: []types.SchedulerPlugin{sp}})
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]*devicescheduler.Node{}
	for name, inv := range invs {
		if nodes[name], err = e.NewNode(name, inv, devicescheduler.Host{}); err != nil {
			t.Fatal(err)
		}
	}
	for pod, a := range allocs {
		if err := nodes[a.Node].Assume(pod, a.PodAllocation, devicescheduler.Host{}); err != nil {
			t.Errorf("pod %s: %v", pod, err)
		}
	}
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName != "" {
			continue
		}
		req, err := objects.PodRequest(p)
		if err != nil {
			t.Fatal(err)
		}
		r, err := e.NewRequest(req, devicescheduler.Host{})
		if err != nil {
			t.Fatal(err)
		}
		var pl devicescheduler.Placement
		for name, n := range nodes {
			if err := e.Evaluate(n, r, &pl); err == nil {
				t.Errorf("pending pod %s fits on node %s", p.Name, name)
			}
		}
	}
}

// failedScheduling returns the FailedScheduling messages of a pod, as its
// tenant reads them.
func failedScheduling(ctx context.Context, t *testing.T, ns, pod string) []string {
	list, err := tenant(t, ns).CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range list.Items {
		if e.Reason == "FailedScheduling" {
			out = append(out, e.Message)
		}
	}
	return out
}

// failedSchedulingAll returns every FailedScheduling message in ns.
func failedSchedulingAll(ctx context.Context, t *testing.T, ns string) []string {
	list, err := tenant(t, ns).CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=FailedScheduling"})
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Message)
	}
	return out
}

// waitAllowed waits until id may list pods in ns: RBAC's cache takes a
// moment to see a new binding.
func waitAllowed(ctx context.Context, t *testing.T, id *localcluster.Identity, ns string) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := id.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("%s cannot list pods in %s: %v", id.User, ns, err)
	}
}
