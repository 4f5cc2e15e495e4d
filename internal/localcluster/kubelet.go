package localcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KubeletOptions configure a kubelet.
type KubeletOptions struct {
	// Kubelet is the kubelet binary.
	Kubelet string
	// Node is the node name the kubelet registers.
	Node string
	// RuntimeEndpoint is the CRI endpoint, e.g. unix:///run/kubegpu/crishim.sock.
	RuntimeEndpoint string
	// Dir holds the kubelet's root directory, configuration and log.
	Dir string
	// LeaseDuration is nodeLeaseDurationSeconds: the node's Lease is
	// renewed every quarter of it (default 40s, kubelet's default).
	LeaseDuration time.Duration
	// IP is the node's address: kubelet serves there and reports it as
	// the node's InternalIP, for the API server to reach it (logs, exec).
	// Not a loopback address, which kubelet refuses as a node address.
	IP string
	// MaxContainerRestartPeriod caps the crash-loop back-off between a
	// container's restarts (crashLoopBackOff.maxContainerRestartPeriod;
	// default kubelet's, 5 minutes).
	MaxContainerRestartPeriod time.Duration
}

// Kubelet is a running kubelet.
type Kubelet struct {
	*Process
	Node string
}

// StartKubelet starts a kubelet registered as opts.Node with the node's own
// credentials (system:node:NODE, as kubelet's kubeconfig has them), and
// waits until its Node is Ready and kube-controller-manager has removed the
// not-ready taint.
//
// Settings for a VM like the CI's: cgroup v1 allowed, cgroupfs driver, swap
// allowed, no eviction thresholds, healthz on loopback. As in production,
// kubelet's API (logs, exec) asks the API server who may use it: a
// certificate of the cluster's CA is not enough.
func (c *Cluster) StartKubelet(ctx context.Context, opts KubeletOptions) (*Kubelet, error) {
	if _, err := os.Stat(opts.Kubelet); err != nil {
		return nil, fmt.Errorf("localcluster: kubelet binary: %w (run make kube-binaries)", err)
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	healthz, err := FreePort()
	if err != nil {
		return nil, err
	}
	if ip := net.ParseIP(opts.IP); ip == nil || ip.IsLoopback() {
		return nil, fmt.Errorf("localcluster: kubelet's node address %q: want a non-loopback IP (the node's bridge address)", opts.IP)
	}
	if opts.LeaseDuration <= 0 {
		opts.LeaseDuration = 40 * time.Second
	}
	id, err := c.NodeIdentity(opts.Node)
	if err != nil {
		return nil, err
	}
	root := filepath.Join(opts.Dir, "kubelet")
	if err := os.MkdirAll(root, 0o750); err != nil {
		return nil, err
	}
	config := filepath.Join(opts.Dir, "kubelet-config.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %s
authorization:
  mode: Webhook
containerRuntimeEndpoint: %s
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
evictionHard:
  memory.available: "0%%"
  nodefs.available: "0%%"
  imagefs.available: "0%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
staticPodPath: ""
resolvConf: ""
enforceNodeAllocatable: []
nodeStatusUpdateFrequency: 4s
nodeLeaseDurationSeconds: %d
%s`, opts.IP, port, healthz, c.pki.caFile, opts.RuntimeEndpoint, int(opts.LeaseDuration/time.Second), restartPeriod(opts.MaxContainerRestartPeriod)), 0o600); err != nil {
		return nil, err
	}
	p, err := StartProcess(filepath.Join(opts.Dir, "kubelet.log"), opts.Kubelet,
		"--config="+config, "--kubeconfig="+id.Kubeconfig, "--root-dir="+root,
		"--cert-dir="+filepath.Join(opts.Dir, "kubelet-pki"),
		"--hostname-override="+opts.Node, "--node-ip="+opts.IP, "--v=2")
	if err != nil {
		return nil, fmt.Errorf("localcluster: start kubelet: %w", err)
	}
	k := &Kubelet{Process: p, Node: opts.Node}
	err = p.WaitFor(ctx, 2*time.Minute, func(ctx context.Context) error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, opts.Node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return errors.New("node not Ready")
	})
	if err != nil {
		_ = p.Stop()
		return nil, err
	}
	if err := c.waitSchedulable(ctx, opts.Node); err != nil {
		_ = p.Stop()
		return nil, err
	}
	return k, nil
}

// restartPeriod is the kubelet configuration's crash-loop back-off cap, if
// set.
func restartPeriod(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return fmt.Sprintf("crashLoopBackOff:\n  maxContainerRestartPeriod: %s\n", d)
}
