package gpunode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/internal/localnode"
)

// BusyboxImage is the image every node has, imported at start.
const BusyboxImage = "docker.io/library/busybox:latest"

// Options configure a node.
type Options struct {
	// Name is the node's name.
	Name string
	// BinDir holds kubegpu-crishim and kubelet; NodeBinDir containerd,
	// ctr and crictl (make node-binaries); PluginDir the device modules.
	BinDir, NodeBinDir, PluginDir string
	// PluginOptions are the shim's --plugin-option values
	// (simgpu.preset=t4x4).
	PluginOptions []string
	// AllocationKey is the file of the scheduler's public keys.
	AllocationKey string
	// MetricsAddress is where the shim serves /metrics (empty: off).
	MetricsAddress string
	// Interval is the shim's --interval (default 5s).
	Interval time.Duration
	// Taint, if not nil, is added to the Node once it is Ready.
	Taint *corev1.Taint
}

// Node is a running node. Its methods are safe for concurrent use.
type Node struct {
	opts    Options
	cluster *localcluster.Cluster
	// Dir is the node's directory: containerd's state, the shim's socket
	// and claims, kubelet's root, the logs.
	Dir string

	mu         sync.Mutex
	containerd *localnode.Node
	shim       *localcluster.Process
	kubelet    *localcluster.Kubelet
	kubeconfig string
}

// Start starts containerd, the shim and a kubelet, and waits until the Node
// is Ready and schedulable. On error nothing is left running.
func Start(ctx context.Context, c *localcluster.Cluster, opts Options) (_ *Node, err error) {
	if opts.Interval <= 0 {
		opts.Interval = 5 * time.Second
	}
	dir, err := os.MkdirTemp("", "kg-node-") // short: socket paths are limited
	if err != nil {
		return nil, err
	}
	n := &Node{opts: opts, cluster: c, Dir: dir}
	defer func() {
		if err != nil {
			n.Stop()
		}
	}()
	if n.containerd, err = localnode.Start(ctx, localnode.Options{Dir: dir, BinDir: opts.NodeBinDir}); err != nil {
		return nil, fmt.Errorf("gpunode: containerd: %w (make node-binaries builds it)", err)
	}
	archive := filepath.Join(dir, "busybox.tar")
	if err := localnode.WriteImageArchive(archive, localnode.ImageSpec{Names: []string{BusyboxImage}}); err != nil {
		return nil, err
	}
	if err := n.containerd.ImportImage(ctx, archive); err != nil {
		return nil, err
	}
	// The shim publishes the node's devices with kubelet's credentials.
	id, err := c.NodeIdentity(opts.Name)
	if err != nil {
		return nil, err
	}
	n.kubeconfig = id.Kubeconfig
	if err := n.startShim(ctx); err != nil {
		return nil, err
	}
	if err := n.startKubelet(ctx); err != nil {
		return nil, err
	}
	if opts.Taint != nil {
		if err := n.taint(ctx, *opts.Taint); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// Socket is the shim's CRI socket, kubelet's runtime endpoint.
func (n *Node) Socket() string { return filepath.Join(n.Dir, "crishim.sock") }

// ClaimsDir is where the shim keeps the CDI specs of prepared claims.
func (n *Node) ClaimsDir() string { return filepath.Join(n.Dir, "claims") }

// KubeletRootDir is kubelet's --root-dir.
func (n *Node) KubeletRootDir() string { return filepath.Join(n.Dir, "kubelet") }

// Containerd is the node's containerd.
func (n *Node) Containerd() *localnode.Node { return n.containerd }

// Logs are the paths of the shim's and kubelet's logs and containerd's.
func (n *Node) Logs() (shim, kubelet, containerd string) {
	return filepath.Join(n.Dir, "kubegpu-crishim.log"), filepath.Join(n.Dir, "kubelet.log"), n.containerd.Log
}

// KeepLogs copies the node's logs into dir (Stop removes the node's own
// directory).
func (n *Node) KeepLogs(dir string) error {
	shim, kubelet, containerd := n.Logs()
	var errs []error
	for _, f := range []string{shim, kubelet, containerd} {
		b, err := os.ReadFile(f)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, n.opts.Name+"-"+filepath.Base(f)), b, 0o600)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ShimPid is the shim's process ID (0 while it is down).
func (n *Node) ShimPid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.shim == nil {
		return 0
	}
	return n.shim.Pid()
}

func (n *Node) startShim(ctx context.Context) error {
	args := []string{"--node-name=" + n.opts.Name, "--plugin-dir=" + n.opts.PluginDir,
		"--listen=" + n.Socket(), "--runtime-endpoint=" + n.containerd.Endpoint(), "--allocation-key=" + n.opts.AllocationKey,
		"--kubeconfig=" + n.kubeconfig, "--interval=" + n.opts.Interval.String(),
		"--kubelet-root-dir=" + n.KubeletRootDir(), "--claims-dir=" + n.ClaimsDir()}
	for _, o := range n.opts.PluginOptions {
		args = append(args, "--plugin-option="+o)
	}
	if n.opts.MetricsAddress != "" {
		args = append(args, "--metrics-bind-address="+n.opts.MetricsAddress)
	}
	// A stopped shim leaves no socket behind; wait for the new one.
	_ = os.Remove(n.Socket())
	shim, err := localcluster.StartProcess(filepath.Join(n.Dir, "kubegpu-crishim.log"), filepath.Join(n.opts.BinDir, "kubegpu-crishim"), args...)
	if err != nil {
		return err
	}
	if err := shim.WaitFor(ctx, 30*time.Second, func(context.Context) error { _, err := os.Stat(n.Socket()); return err }); err != nil {
		_ = shim.Stop()
		return fmt.Errorf("gpunode: kubegpu-crishim: %w", err)
	}
	n.shim = shim
	return nil
}

func (n *Node) startKubelet(ctx context.Context) error {
	k, err := n.cluster.StartKubelet(ctx, localcluster.KubeletOptions{Kubelet: filepath.Join(n.opts.BinDir, "kubelet"), Node: n.opts.Name,
		RuntimeEndpoint: "unix://" + n.Socket(), Dir: n.Dir, IP: n.containerd.IP})
	if err != nil {
		return fmt.Errorf("gpunode: kubelet: %w", err)
	}
	n.kubelet = k
	return nil
}

// taint adds t to the Node; kubelet and the shim write the Node meanwhile.
func (n *Node) taint(ctx context.Context, t corev1.Taint) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := n.cluster.Client.CoreV1().Nodes().Get(ctx, n.opts.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Spec.Taints = append(node.Spec.Taints, t)
		_, err = n.cluster.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("gpunode: taint %s: %w", n.opts.Name, err)
	}
	return nil
}

// RestartShim stops the shim (SIGTERM) and starts it again; with
// allocationKey not empty, trusting the keys in that file from then on.
func (n *Node) RestartShim(ctx context.Context, allocationKey string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.shim != nil {
		if err := n.shim.Stop(); err != nil {
			return fmt.Errorf("gpunode: stop kubegpu-crishim: %w", err)
		}
		n.shim = nil
	}
	if allocationKey != "" {
		n.opts.AllocationKey = allocationKey
	}
	return n.startShim(ctx)
}

// RestartContainerd kills containerd, as a crash would, and starts it
// again; the containers keep running.
func (n *Node) RestartContainerd(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.containerd.Restart(ctx)
}

// RestartKubelet stops kubelet and starts it again, waiting until the Node
// is Ready.
func (n *Node) RestartKubelet(ctx context.Context) error {
	if err := n.StopKubelet(); err != nil {
		return err
	}
	return n.StartKubelet(ctx)
}

// StopKubelet stops kubelet; the containers keep running.
func (n *Node) StopKubelet() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.kubelet == nil {
		return nil
	}
	if err := n.kubelet.Stop(); err != nil {
		return fmt.Errorf("gpunode: stop kubelet: %w", err)
	}
	n.kubelet = nil
	return nil
}

// StartKubelet starts kubelet unless it runs, waiting until the Node is
// Ready.
func (n *Node) StartKubelet(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.kubelet != nil {
		return nil
	}
	return n.startKubelet(ctx)
}

// Stop stops kubelet, the shim and containerd (removing its containers)
// and removes the node's directory; KeepLogs copies the logs out first.
func (n *Node) Stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	var errs []error
	if n.kubelet != nil {
		errs = append(errs, n.kubelet.Stop())
		n.kubelet = nil
	}
	if n.shim != nil {
		errs = append(errs, n.shim.Stop())
		n.shim = nil
	}
	if n.containerd != nil {
		errs = append(errs, n.containerd.Stop())
		n.containerd = nil
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintf(os.Stderr, "gpunode: stopping %s: %v\n", n.opts.Name, err)
	}
	_ = os.RemoveAll(n.Dir)
}
