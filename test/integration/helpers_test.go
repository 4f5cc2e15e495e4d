package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/crishim/advertiser"
	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/plugins/simgpu"
	"github.com/kubegpu/kubegpu/types"
)

// heartbeatStaleness outlasts the API server outage test's ten seconds
// and the restart after it.
const heartbeatStaleness = 60 * time.Second

// startScheduler runs _output/bin/kubegpu-scheduler with the shipped
// configuration (kube-scheduler/config/kubegpu-scheduler.yaml) as the
// cluster's only scheduler, and waits until it is healthy.
func startScheduler(ctx context.Context, t *testing.T) *localcluster.Scheduler {
	t.Helper()
	return startSchedulerWriting(ctx, t, "Bind")
}

// startSchedulerWriting starts the scheduler with the plugin's
// writeAllocation set to mode (Bind or PreBind).
func startSchedulerWriting(ctx context.Context, t *testing.T, mode string) *localcluster.Scheduler {
	t.Helper()
	config, err := cluster.ShippedSchedulerConfig(filepath.Join(repoRoot, "kube-scheduler/config/kubegpu-scheduler.yaml"), pluginDir, keyFile, 500,
		"heartbeatStaleness: "+heartbeatStaleness.String(), "writeAllocation: "+mode)
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

// simNodes are Node objects without kubelets whose devices are published
// exactly as kubegpu-crishim's advertiser publishes them, with heartbeats
// renewed until the test ends.
type simNodes struct {
	mu      sync.Mutex
	names   []string
	paused  map[string]bool
	invs    map[string]types.Inventory
	stopped chan struct{}
}

// addNodes creates nodes name-0..name-(count-1) with a simgpu preset.
func addNodes(ctx context.Context, t *testing.T, prefix, preset string, count int) *simNodes {
	t.Helper()
	sn := &simNodes{paused: map[string]bool{}, invs: map[string]types.Inventory{}, stopped: make(chan struct{})}
	sn.add(ctx, t, prefix, preset, count)
	t.Cleanup(func() {
		close(sn.stopped)
		for _, n := range sn.names {
			_ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{})
			_ = cluster.Client.CoordinationV1().Leases(kubeinterface.LeaseNamespace).Delete(context.Background(), kubeinterface.LeaseName(n), metav1.DeleteOptions{})
		}
	})
	go func() {
		tick := time.NewTicker(3 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-sn.stopped:
				return
			case <-tick.C:
			}
			sn.mu.Lock()
			names := append([]string(nil), sn.names...)
			sn.mu.Unlock()
			for _, n := range names {
				sn.mu.Lock()
				paused := sn.paused[n]
				sn.mu.Unlock()
				if !paused {
					_ = advertiser.RenewLease(context.Background(), nodeClient, n, heartbeatStaleness, time.Now())
				}
			}
		}
	}()
	return sn
}

func (sn *simNodes) add(ctx context.Context, t *testing.T, prefix, preset string, count int) {
	t.Helper()
	topo, err := simgpu.Preset(preset)
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.EnsureNamespace(ctx, kubeinterface.LeaseNamespace); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < count; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		if err := cluster.RegisterNode(ctx, name, localcluster.NodeCapacity("96", "768Gi", 250)); err != nil {
			t.Fatal(err)
		}
		inv := simgpu.Inventory(topo, name)
		if err := advertiser.PublishInventory(ctx, nodeClient, name, inv, advertiser.Capacity(inv, advertiser.DefaultSlicesPerDevice)); err != nil {
			t.Fatal(err)
		}
		if err := advertiser.RenewLease(ctx, nodeClient, name, heartbeatStaleness, time.Now()); err != nil {
			t.Fatal(err)
		}
		sn.mu.Lock()
		sn.names = append(sn.names, name)
		sn.invs[name] = inv
		sn.mu.Unlock()
	}
}

// pause stops renewing a node's heartbeat and backdates it by d.
func (sn *simNodes) pause(ctx context.Context, t *testing.T, name string, d time.Duration) {
	t.Helper()
	sn.mu.Lock()
	sn.paused[name] = true
	sn.mu.Unlock()
	if err := advertiser.RenewLease(ctx, nodeClient, name, heartbeatStaleness, time.Now().Add(-d)); err != nil {
		t.Fatal(err)
	}
}

func (sn *simNodes) resume(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	sn.mu.Lock()
	sn.paused[name] = false
	sn.mu.Unlock()
	if err := advertiser.RenewLease(ctx, nodeClient, name, heartbeatStaleness, time.Now()); err != nil {
		t.Fatal(err)
	}
}

// namespace makes a fresh namespace that is deleted (pods first, at once)
// when the test ends.
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
	return name
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

func createPods(ctx context.Context, t *testing.T, ns string, pods ...*corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
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
		list, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
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

// events returns the FailedScheduling messages of a pod.
func failedScheduling(ctx context.Context, ns, pod string) []string {
	list, err := cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
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
