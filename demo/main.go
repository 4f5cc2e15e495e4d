// Command demo runs kubegpu end to end on loopback in a temporary
// directory, on a control plane configured as in production (etcd,
// kube-apiserver with Node and RBAC authorization, NodeRestriction and the
// default admission plugins, kube-controller-manager): it installs kubegpu's
// RBAC and admission policies as cluster-admin, then runs every component
// with its own identity: kubegpu-scheduler as the only scheduler
// (system:kube-scheduler), simulated GPU nodes (kubegpu-crishim advertisers
// with the simgpu module, 2 × DGX-1, 1 × DGX H100, 2 × 4-T4 box, with the
// AMD module on a recorded 8 × MI300X tree and the Intel module on a
// recorded 4 × Max 1550 tree, each with its node's credentials and a simulated kubelet renewing its Lease) and a
// real node (kubelet -> kubegpu-crishim -> containerd). A tenant applies
// the pods in examples/; the CLI, bound to the read-only kubegpu-viewer
// role, prints the cluster's GPUs and why the pod that cannot fit is
// pending. `make demo` runs it; KEEP=1 leaves the cluster running.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/kubegpu/kubegpu/internal/gpunode"
	"github.com/kubegpu/kubegpu/internal/keyfiles"
	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
)

type options struct {
	binDir, pluginDir, examples, nodeBinDir string
	keep                                    bool
	timeout                                 time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.binDir, "bin-dir", "_output/bin", "kubegpu and Kubernetes binaries")
	flag.StringVar(&o.pluginDir, "plugin-dir", "_output/plugins", "device modules")
	flag.StringVar(&o.examples, "examples", "examples", "directory of example pods")
	flag.StringVar(&o.nodeBinDir, "node-bin-dir", "_output/tools/bin", "containerd, ctr and crictl for the real node")
	flag.BoolVar(&o.keep, "keep", false, "leave the cluster running until Ctrl-C and print its kubeconfig")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Minute, "how long the demo may take")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }

func run(ctx context.Context, o options) (err error) {
	start := time.Now()
	dir, err := makeDemoDir()
	if err != nil {
		return err
	}
	var procs []*localcluster.Process
	var c *localcluster.Cluster
	defer func() {
		step("Tearing down")
		for i := len(procs) - 1; i >= 0; i-- {
			_ = procs[i].Stop()
		}
		if c != nil {
			c.Stop()
		}
		if err == nil {
			os.RemoveAll(dir)
			fmt.Println("removed", dir)
		} else if kerr := keepLogs(dir); kerr != nil {
			fmt.Println("logs kept in", dir, "but removing the rest failed (it holds private keys: remove it):", kerr)
		} else {
			fmt.Println("logs kept in", dir, "(keys and data removed)")
		}
	}()
	runCtx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if o.keep {
		runCtx = ctx
	}

	step("Starting etcd, kube-apiserver and kube-controller-manager on loopback (in %s)", dir)
	c, err = localcluster.Start(runCtx, localcluster.Options{Dir: dir, APIServer: filepath.Join(o.binDir, "kube-apiserver"),
		ControllerManager: filepath.Join(o.binDir, "kube-controller-manager")})
	if err != nil {
		return err
	}
	keyFile, pubFile, err := keyfiles.WriteEd25519(dir)
	if err != nil {
		return err
	}
	step("Installing kubegpu's RBAC and admission policies (cluster-admin)")
	ids, err := install(runCtx, c)
	if err != nil {
		return err
	}

	step("Starting kubegpu-scheduler (upstream kube-scheduler + the KubeGPU plugin) as %s", localcluster.SchedulerUser)
	sched, err := startScheduler(runCtx, c, o, ids.scheduler, keyFile)
	if err != nil {
		return err
	}
	procs = append(procs, sched.Process)

	step("Starting %d simulated GPU nodes: kubegpu-crishim with the simgpu module, or the AMD or Intel module on a tree recorded from sysfs, each with its node's credentials", len(simNodes))
	shimMetrics := map[string]string{} // node -> its shim's metrics address
	for _, n := range simNodes {
		plugins, option, err := simNodeModule(dir, o.pluginDir, n.module, n.option)
		if err != nil {
			return err
		}
		shimMetrics[n.name] = metricsAddr()
		k, err := c.StartSimKubelet(runCtx, localcluster.SimKubeletOptions{Node: n.name, Capacity: localcluster.NodeCapacity("64", "512Gi", 110)})
		if err != nil {
			return err
		}
		defer k.Pause()
		p, err := localcluster.StartProcess(filepath.Join(dir, "kubegpu-crishim-"+n.name+".log"), filepath.Join(o.binDir, "kubegpu-crishim"),
			"--node-name="+n.name, "--plugin-dir="+plugins, "--plugin-option="+option,
			"--listen="+filepath.Join(dir, n.name+".sock"), "--runtime-endpoint=unix://"+filepath.Join(dir, "no-runtime.sock"),
			"--allocation-key="+pubFile, "--kubeconfig="+k.Identity.Kubeconfig, "--interval=5s", "--metrics-bind-address="+shimMetrics[n.name],
			"--kubelet-root-dir="+filepath.Join(dir, n.name, "kubelet"), "--claims-dir="+filepath.Join(dir, n.name, "claims"))
		if err != nil {
			return err
		}
		procs = append(procs, p)
		fmt.Printf("    %-10s %-40s as %s\n", n.name, option, k.Identity.User)
	}

	step("Starting a real node: kubelet -> kubegpu-crishim -> containerd + runc (4 simulated T4s)")
	shimMetrics["real-node"] = metricsAddr()
	stopReal, err := startRealNode(runCtx, c, o, pubFile, shimMetrics["real-node"])
	defer stopReal()
	if err != nil {
		return err
	}
	if err := waitForInventories(runCtx, ids.viewer, len(simNodes)+1); err != nil {
		return err
	}

	step("Applying %s/ as the tenant %s (bound to the edit role in %s)", o.examples, ids.tenant.User, metav1.NamespaceDefault)
	pods, err := applyExamples(runCtx, ids.tenant, o.examples)
	if err != nil {
		return err
	}
	pending, err := waitForPods(runCtx, ids.viewer, pods)
	if err != nil {
		return err
	}

	step("kubegpu gpus (as %s, bound to the read-only kubegpu-viewer role)", ids.viewer.User)
	if err := kubegpu(runCtx, o, ids.viewer, pubFile, "gpus"); err != nil {
		return err
	}
	for _, name := range pending {
		step("kubegpu explain %s", name)
		if err := kubegpu(runCtx, o, ids.viewer, pubFile, "explain", name); err != nil {
			return err
		}
	}
	step("The container on the real node: its env, as kubectl logs shows it to the tenant (the pod asked for NVIDIA_VISIBLE_DEVICES=all)")
	if err := showEnv(runCtx, ids.tenant, "show-my-gpus"); err != nil {
		return err
	}
	step("The claim-based container on the real node: its env (its ResourceClaim allocated by kubegpu-scheduler, prepared by kubegpu-crishim)")
	if err := showRunningEnv(runCtx, ids.tenant, "claim-my-gpus"); err != nil {
		return err
	}
	if err := showClaim(runCtx, ids.tenant, "two-gpus"); err != nil {
		return err
	}
	step("The real node's GPUs as ResourceSlices of driver %s, published by its shim with the node's credentials", dra.DriverName)
	if err := showSlices(runCtx, c.Client, "real-node"); err != nil {
		return err
	}
	step("Metrics: kubegpu-scheduler's /metrics as %s (bound to kubegpu-metrics-reader), each shim's on its node", ids.viewer.User)
	if err := showMetrics(runCtx, dir, ids.viewer, sched.Port, shimMetrics); err != nil {
		return err
	}
	step("kubegpu ui: the live page of the cluster's GPUs (as %s)", ids.viewer.User)
	url, ui, err := startUI(runCtx, dir, o, ids.viewer, pubFile, len(simNodes)+1)
	if err != nil {
		return err
	}
	procs = append(procs, ui)
	fmt.Printf("\nDemo ran in %s.\n", time.Since(start).Round(time.Second))
	if o.keep {
		fmt.Printf("\nThe page of the cluster's GPUs: %s\n", url)
		step("The cluster keeps running; Ctrl-C ends it")
		fmt.Printf("    export KUBECONFIG=%s   # the tenant; cluster-admin: %s\n    %s/kubectl apply -f examples/05-cannot-fit.yaml\n    %s/kubegpu --kubeconfig %s --allocation-key %s gpus\n",
			ids.tenant.Kubeconfig, c.Kubeconfig, o.binDir, o.binDir, ids.viewer.Kubeconfig, pubFile)
		<-ctx.Done()
	}
	return nil
}

// identities are the demo's users besides cluster-admin.
type identities struct {
	scheduler, viewer, tenant *localcluster.Identity
}

// realNodeTaint keeps the examples not written for the real node off it.
const realNodeTaint = "demo.kubegpu.io/real-node"

// demoTenant and demoViewer are the demo's people.
const (
	demoTenant = "demo-tenant"
	demoViewer = "demo-viewer"
)

// install applies kubegpu's shipped RBAC, admission policies and
// DeviceClass, binds the CLI's read-only role to the viewer and the
// built-in edit role in the default namespace to the tenant: what an
// operator installs.
func install(ctx context.Context, c *localcluster.Cluster) (identities, error) {
	if err := c.Apply(ctx, "kube-scheduler/deploy/rbac.yaml", "kube-scheduler/deploy/capacity.yaml", "cli/deploy/rbac.yaml", "deploy/prometheus/kubegpu-metrics-reader.yaml",
		"deploy/admission/kubegpu-policies.yaml", "deploy/dra/kubegpu-deviceclass.yaml"); err != nil {
		return identities{}, err
	}
	// The API server takes a moment to load new admission policies: wait
	// until it refuses a GPU pod created with an allocation.
	probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "policy-probe", Annotations: map[string]string{"kubegpu.io/allocation": "x"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}}}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil, nil
	}); err != nil {
		return identities{}, fmt.Errorf("kubegpu's admission policies not in force: %w", err)
	}
	rb := rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: demoTenant},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: demoTenant}},
	}
	if _, err := c.Client.RbacV1().RoleBindings(metav1.NamespaceDefault).Create(ctx, &rb, metav1.CreateOptions{}); err != nil {
		return identities{}, err
	}
	for _, role := range []string{"kubegpu-viewer", "kubegpu-metrics-reader"} {
		crb := rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: role + "-" + demoViewer},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: demoViewer}},
		}
		if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &crb, metav1.CreateOptions{}); err != nil {
			return identities{}, err
		}
	}
	var ids identities
	var err error
	if ids.scheduler, err = c.Identity(localcluster.SchedulerUser); err != nil {
		return ids, err
	}
	if ids.viewer, err = c.Identity(demoViewer); err != nil {
		return ids, err
	}
	if ids.tenant, err = c.Identity(demoTenant); err != nil {
		return ids, err
	}
	// RBAC's cache takes a moment to see the new bindings.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err1 := ids.tenant.Client.CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{Limit: 1})
		_, err2 := ids.viewer.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
		return err1 == nil && err2 == nil, nil
	})
	return ids, err
}

func startScheduler(ctx context.Context, c *localcluster.Cluster, o options, id *localcluster.Identity, keyFile string) (*localcluster.Scheduler, error) {
	// The shipped configuration, pointed at this cluster.
	config, err := c.ShippedSchedulerConfig("kube-scheduler/config/kubegpu-scheduler.yaml", id.Kubeconfig, mustAbs(o.pluginDir), keyFile, 200)
	if err != nil {
		return nil, err
	}
	// Its /metrics behind the API server's delegated authentication and
	// authorization, as on a kubeadm control plane.
	return c.StartScheduler(ctx, filepath.Join(o.binDir, "kubegpu-scheduler"), config, "kubegpu-scheduler", "--v=2",
		"--authentication-kubeconfig="+id.Kubeconfig, "--authorization-kubeconfig="+id.Kubeconfig)
}

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

func waitForInventories(ctx context.Context, c *localcluster.Identity, want int) error {
	return wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		published := 0
		for _, n := range nodes.Items {
			if _, ok := n.Annotations["kubegpu.io/inventory"]; ok {
				published++
			}
		}
		return published == want, nil
	})
}

// applyExamples creates every pod in the YAML files of dir, as tenant.
func applyExamples(ctx context.Context, tenant *localcluster.Identity, dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no example pods in %s", dir)
	}
	sort.Strings(files)
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for i, doc := range strings.Split(string(data), "\n---\n") {
			var kind metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &kind); err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", f, i+1, err)
			}
			if kind.Kind == "ResourceClaim" {
				if err := createClaim(ctx, tenant, doc); err != nil {
					return nil, fmt.Errorf("%s: document %d: %w", f, i+1, err)
				}
				continue
			}
			var pod corev1.Pod
			if err := yaml.UnmarshalStrict([]byte(doc), &pod); err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", f, i+1, err)
			}
			if _, err := tenant.Client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, &pod, metav1.CreateOptions{}); err != nil {
				return nil, fmt.Errorf("%s: create pod %s: %w", f, pod.Name, err)
			}
			fmt.Printf("    pod/%s created (%s)\n", pod.Name, filepath.Base(f))
			names = append(names, pod.Name)
		}
	}
	return names, nil
}

// waitForPods waits until every pod is bound or refused, and returns the
// refused ones.
func waitForPods(ctx context.Context, c *localcluster.Identity, names []string) ([]string, error) {
	var pending []string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pending = nil
		for _, name := range names {
			p, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			switch {
			case p.Spec.NodeName != "":
			case unschedulable(p):
				pending = append(pending, name)
			default:
				return false, nil
			}
		}
		return true, nil
	})
	return pending, err
}

func unschedulable(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return true
		}
	}
	return false
}

func kubegpu(ctx context.Context, o options, id *localcluster.Identity, pubFile string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(o.binDir, "kubegpu"), append([]string{"--kubeconfig", id.Kubeconfig, "--allocation-key", pubFile}, args...)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

// startRealNode starts containerd (with the busybox image), kubegpu-crishim
// in front of it (serving metrics on metricsAddr) and a kubelet on the
// shim, registered as real-node and tainted so that only the example
// written for it (06) goes there: the others land on the simulated nodes
// whatever the scores, and their busybox image would not be pulled here.
// The returned function stops them, in reverse order.
func startRealNode(ctx context.Context, c *localcluster.Cluster, o options, pubFile, metricsAddr string) (func(), error) {
	n, err := gpunode.Start(ctx, c, gpunode.Options{Name: "real-node", BinDir: o.binDir, NodeBinDir: o.nodeBinDir, PluginDir: o.pluginDir,
		PluginOptions: []string{"simgpu.preset=t4x4"}, AllocationKey: pubFile, MetricsAddress: metricsAddr,
		Taint: &corev1.Taint{Key: realNodeTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}})
	if err != nil {
		return func() {}, err
	}
	shim, kubelet, containerd := n.Logs()
	fmt.Printf("    %-10s kubelet %s, kubegpu-crishim %s, containerd %s\n", "real-node", kubelet, shim, containerd)
	return n.Stop, nil
}
