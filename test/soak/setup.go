package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubegpu/kubegpu/crishim/advertiser"
	"github.com/kubegpu/kubegpu/device-scheduler/sim"
	"github.com/kubegpu/kubegpu/internal/gpunode"
	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/internal/tracegpus"
	"github.com/kubegpu/kubegpu/types"
)

const (
	// soakNamespace is the tenant's namespace.
	soakNamespace = "soak"
	soakTenant    = "soak-tenant"
	// realNode is the real node's name; realNodeTaint keeps the trace's
	// pods off it: only the pods written for it tolerate the taint.
	realNode      = "real-node"
	realNodeTaint = "soak.kubegpu.io/real-node"
	// simLabel marks the simulated nodes; the trace's pods select them.
	simLabel = "soak.kubegpu.io/simulated"
	// highPriority is the PriorityClass of the pods that preempt.
	highPriority = "soak-high"
	// heartbeatStaleness is the plugin's, as shipped.
	heartbeatStaleness = 40 * time.Second
)

// soak is the running system under test.
type soak struct {
	o   options
	dir string
	// stopping is closed when the soak tears down: the replicas' supervisor
	// stops restarting them.
	stopping chan struct{}

	cluster     *localcluster.Cluster
	tenant      *localcluster.Identity
	viewer      *localcluster.Identity
	keys        *keyring
	real        *gpunode.Node
	realMetrics string
	proxies     *proxies
	replicas    []*replica

	simKubelets *simKubelets

	simMu    sync.Mutex
	simNodes map[string]*simNode
	simNames []string
}

// simNode is a simulated GPU node: its kubelet stand-in and its devices.
type simNode struct {
	kubelet *localcluster.SimKubelet
	clock   *skewClock
	inv     types.Inventory
}

func (s *soak) setUp(ctx context.Context) error {
	var err error
	logf("starting etcd, kube-apiserver and kube-controller-manager")
	s.cluster, err = localcluster.Start(ctx, localcluster.Options{Dir: s.dir, APIServer: filepath.Join(s.o.binDir, "kube-apiserver"),
		ControllerManager: filepath.Join(s.o.binDir, "kube-controller-manager")})
	if err != nil {
		return err
	}
	if s.keys, err = newKeyring(filepath.Join(s.dir, "keys")); err != nil {
		return err
	}
	logf("installing kubegpu's RBAC, admission policies and DeviceClass (cluster-admin)")
	if err := s.install(ctx); err != nil {
		return err
	}
	logf("installing the Helm chart over them (its Deployment's pods have no node to run on)")
	if err := s.installChart(ctx); err != nil {
		return err
	}
	logf("starting %d simulated GPU nodes from the openb trace", s.o.nodes)
	if err := s.addSimNodes(ctx); err != nil {
		return err
	}
	logf("starting the real node: kubelet -> kubegpu-crishim -> containerd")
	if s.realMetrics, err = freeAddr(); err != nil {
		return err
	}
	s.real, err = gpunode.Start(ctx, s.cluster, gpunode.Options{Name: realNode, BinDir: s.o.binDir, NodeBinDir: s.o.nodeBinDir,
		PluginDir: s.o.pluginDir, AllocationKey: s.keys.trusted(), MetricsAddress: s.realMetrics,
		PluginOptions: []string{"simgpu.preset=t4x4", "simgpu.enforcer-root=" + filepath.Join(s.dir, "enforcer")},
		Taint:         &corev1.Taint{Key: realNodeTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}})
	if err != nil {
		return err
	}
	logf("starting two kubegpu-scheduler replicas under leader election, each behind a proxy")
	if s.proxies, err = newProxies(s.cluster); err != nil {
		return err
	}
	for _, name := range []string{"a", "b"} {
		r, err := s.startReplica(ctx, name)
		if err != nil {
			return err
		}
		s.replicas = append(s.replicas, r)
	}
	for _, r := range s.replicas {
		go r.supervise(context.WithoutCancel(ctx), s.stopping)
	}
	return nil
}

// install applies what an operator installs, as cluster-admin, and makes
// the soak's tenant (the edit role in its namespace) and viewer (the
// read-only kubegpu-viewer and kubegpu-metrics-reader roles).
func (s *soak) install(ctx context.Context) error {
	c := s.cluster
	root := repoRoot()
	var manifests []string
	for _, m := range []string{"kube-scheduler/deploy/rbac.yaml", "kube-scheduler/deploy/capacity.yaml", "cli/deploy/rbac.yaml",
		"deploy/prometheus/kubegpu-metrics-reader.yaml", "deploy/admission/kubegpu-policies.yaml", "deploy/dra/kubegpu-deviceclass.yaml"} {
		manifests = append(manifests, filepath.Join(root, m))
	}
	if err := c.Apply(ctx, manifests...); err != nil {
		return err
	}
	if err := c.EnsureNamespace(ctx, soakNamespace); err != nil {
		return err
	}
	_, err := c.Client.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{
		ObjectMeta: metav1.ObjectMeta{Name: highPriority}, Value: 1000,
		Description: "the soak's pods that preempt"}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	bindings := []struct{ ns, role, user string }{
		{soakNamespace, "edit", soakTenant}, {"", "kubegpu-viewer", "soak-viewer"}, {"", "kubegpu-metrics-reader", "soak-viewer"}}
	for _, b := range bindings {
		ref := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: b.role}
		subjects := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: b.user}}
		meta := metav1.ObjectMeta{Name: b.role + "-" + b.user}
		if b.ns != "" {
			_, err = c.Client.RbacV1().RoleBindings(b.ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: meta, RoleRef: ref, Subjects: subjects}, metav1.CreateOptions{})
		} else {
			_, err = c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: meta, RoleRef: ref, Subjects: subjects}, metav1.CreateOptions{})
		}
		if err != nil {
			return err
		}
	}
	if s.tenant, err = c.Identity(soakTenant); err != nil {
		return err
	}
	if s.viewer, err = c.Identity("soak-viewer"); err != nil {
		return err
	}
	// RBAC's cache takes a moment to see the new bindings.
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err1 := s.tenant.Client.CoreV1().Pods(soakNamespace).List(ctx, metav1.ListOptions{Limit: 1})
		_, err2 := s.viewer.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
		return err1 == nil && err2 == nil, nil
	})
}

// addSimNodes registers o.nodes nodes drawn from the trace's GPU nodes by
// the seed, each with a simulated kubelet (its own credentials, a clock
// the faults may skew) and its devices published as the advertiser
// publishes them.
func (s *soak) addSimNodes(ctx context.Context) error {
	all, err := sim.ReadNodes(filepath.Join(s.o.openb, "openb_node_list_gpu_node.csv"))
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(uint64(s.o.seed), 1))
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	specs := all[:min(s.o.nodes, len(all))]
	s.simNodes = map[string]*simNode{}
	var g errgroup.Group
	g.SetLimit(8)
	for _, spec := range specs {
		name := "sim-" + spec.Name
		s.simNames = append(s.simNames, name)
		g.Go(func() error { return s.addSimNode(ctx, name, spec) })
	}
	return g.Wait()
}

func (s *soak) addSimNode(ctx context.Context, name string, spec sim.NodeSpec) error {
	clk := &skewClock{}
	k, err := s.cluster.StartSimKubelet(ctx, localcluster.SimKubeletOptions{Node: name, Clock: clk, Capacity: corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(spec.CPUMilli, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(spec.MemoryMiB<<20, resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(250, resource.DecimalSI),
	}})
	if err != nil {
		return err
	}
	inv := tracegpus.Inventory(name, spec.Model, spec.GPUs)
	client, err := advertiser.NewClient(k.Identity.Config)
	if err != nil {
		return err
	}
	if err := advertiser.PublishInventory(ctx, client, name, inv, advertiser.Capacity(inv, advertiser.DefaultSlicesPerDevice)); err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:"true"}}}`, simLabel)
	if _, err := s.cluster.Client.CoreV1().Nodes().Patch(ctx, name, ktypes.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label node %s: %w", name, err)
	}
	s.simMu.Lock()
	s.simNodes[name] = &simNode{kubelet: k, clock: clk, inv: inv}
	s.simMu.Unlock()
	return nil
}

// simNode returns a simulated node by name.
func (s *soak) simNode(name string) *simNode {
	s.simMu.Lock()
	defer s.simMu.Unlock()
	return s.simNodes[name]
}

// stop stops everything, the schedulers first.
func (s *soak) stop() {
	close(s.stopping)
	for _, r := range s.replicas {
		_ = r.stop()
	}
	if s.proxies != nil {
		s.proxies.stop()
	}
	for _, n := range s.simNodes {
		n.kubelet.Pause()
	}
	if s.real != nil {
		if s.o.keep {
			if err := s.real.KeepLogs(s.dir); err != nil {
				logf("keep the real node's logs: %v", err)
			}
		}
		s.real.Stop()
	}
	if s.cluster != nil {
		s.cluster.Stop()
	}
}
