package localcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Scheduler is a running kube-scheduler (stock or kubegpu-scheduler).
type Scheduler struct {
	*Process
	// Port is its secure port on 127.0.0.1.
	Port int
}

// StartScheduler writes config (a KubeSchedulerConfiguration) to
// Dir/NAME.yaml, starts binary with it on a free loopback port, logging to
// Dir/NAME.log, and waits until /healthz answers.
func (c *Cluster) StartScheduler(ctx context.Context, binary, config, name string, args ...string) (*Scheduler, error) {
	path := filepath.Join(c.opts.Dir, name+".yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	p, err := StartProcess(filepath.Join(c.opts.Dir, name+".log"), binary,
		append([]string{"--config=" + path, "--secure-port=" + strconv.Itoa(port), "--bind-address=127.0.0.1"}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("localcluster: start %s: %w", name, err)
	}
	err = p.WaitFor(ctx, time.Minute, healthz(port))
	if err != nil {
		_ = p.Stop()
		return nil, err
	}
	return &Scheduler{Process: p, Port: port}, nil
}

// ShippedSchedulerConfig returns the KubeSchedulerConfiguration at path
// (one of kube-scheduler/config/) pointed at this cluster: kubeconfig (the
// scheduler's identity) with the given client QPS, no leader election, the
// plugin directory and signing key given, and extra KubeGPU args
// ("heartbeatStaleness: 1m").
func (c *Cluster) ShippedSchedulerConfig(path, kubeconfig, pluginDir, keyFile string, qps int, extraArgs ...string) (string, error) {
	shipped, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	lines := strings.Split(string(shipped), "\n")
	// Extra args replace the shipped value of the same key, or are added.
	extra := map[string]string{}
	for _, a := range extraArgs {
		k, _, _ := strings.Cut(a, ":")
		extra[k] = a
	}
	present := map[string]bool{}
	for _, l := range lines {
		k, _, _ := strings.Cut(strings.TrimSpace(l), ":")
		present[k] = extra[k] != ""
	}
	var out []string
	for _, l := range lines {
		key, _, _ := strings.Cut(strings.TrimSpace(l), ":")
		indent := l[:len(l)-len(strings.TrimLeft(l, " "))]
		if a, ok := extra[key]; ok {
			out = append(out, indent+a)
			continue
		}
		switch key {
		case "kubeconfig":
			out = append(out, indent+"kubeconfig: "+kubeconfig, fmt.Sprintf("%sqps: %d", indent, qps), fmt.Sprintf("%sburst: %d", indent, qps))
		case "leaderElect":
			out = append(out, indent+"leaderElect: false")
		case "pluginDir":
			out = append(out, indent+"pluginDir: "+pluginDir)
		case "signingKeyFile":
			out = append(out, indent+"signingKeyFile: "+keyFile)
			for _, a := range extraArgs {
				if k, _, _ := strings.Cut(a, ":"); !present[k] {
					out = append(out, indent+a)
				}
			}
		default:
			out = append(out, l)
		}
	}
	if !slices.ContainsFunc(out, func(l string) bool { return strings.Contains(l, "signingKeyFile: "+keyFile) }) {
		return "", fmt.Errorf("%s has no KubeGPU signingKeyFile to point at %s", path, keyFile)
	}
	return strings.Join(out, "\n"), nil
}

// WithLeaderElection turns on leader election in a configuration from
// ShippedSchedulerConfig (which turns it off) with the given timings, as
// replicas of a Deployment run.
func WithLeaderElection(config string, leaseDuration, renewDeadline, retryPeriod time.Duration) (string, error) {
	if !strings.Contains(config, "leaderElect: false") {
		return "", fmt.Errorf("the configuration has no leaderElection to turn on")
	}
	election := fmt.Sprintf("leaderElect: true\n  leaseDuration: %s\n  renewDeadline: %s\n  retryPeriod: %s", leaseDuration, renewDeadline, retryPeriod)
	return strings.Replace(config, "leaderElect: false", election, 1), nil
}

// RegisterNode creates a Node as cluster-admin, Ready and untainted, with
// the given capacity: for benchmarks of thousands of nodes without a
// controller-manager's node lifecycle. Tests register nodes with their own
// credentials (StartSimKubelet, StartKubelet).
func (c *Cluster) RegisterNode(ctx context.Context, name string, capacity corev1.ResourceList) error {
	n, err := c.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{"kubernetes.io/hostname": name}}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("register node %s: %w", name, err)
	}
	n.Spec.Taints = nil
	if n, err = c.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("untaint node %s: %w", name, err)
	}
	n.Status.Capacity = capacity.DeepCopy()
	n.Status.Allocatable = capacity.DeepCopy()
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	if _, err := c.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node %s status: %w", name, err)
	}
	return nil
}

// NodeCapacity is a capacity of cpu, memory and pods.
func NodeCapacity(cpu, memory string, pods int) corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory),
		corev1.ResourcePods: *resource.NewQuantity(int64(pods), resource.DecimalSI),
	}
}
