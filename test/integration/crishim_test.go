package integration

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// startAdvertiser runs kubegpu-crishim for node with a simgpu preset,
// advertising through the admin kubeconfig; the CRI side points at a
// runtime that is not there (calls would fail with Unavailable).
func startAdvertiser(ctx context.Context, t *testing.T, node, preset string) *localcluster.Process {
	t.Helper()
	dir := t.TempDir()
	pub := filepath.Join(dir, "key.pem")
	if err := os.WriteFile(pub, mustRead(t, keyFile), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := localcluster.StartProcess(filepath.Join(workDir, "kubegpu-crishim-"+node+".log"), filepath.Join(binDir, "kubegpu-crishim"),
		"--node-name="+node, "--plugin-dir="+pluginDir, "--plugin-option=simgpu.preset="+preset,
		"--listen="+filepath.Join(dir, "crishim.sock"), "--runtime-endpoint=unix://"+filepath.Join(dir, "none.sock"),
		"--allocation-key="+pub, "--kubeconfig="+cluster.Kubeconfig, "--interval=2s", "--v=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	return p
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAdvertiserPublishesAndRecovers: the advertiser publishes the node's
// inventory, extended-resource capacity (status subresource) and heartbeat;
// with kube-apiserver down for 30 s it keeps running and renews the
// heartbeat once the API server is back.
func TestAdvertiserPublishesAndRecovers(t *testing.T) {
	ctx := context.Background()
	const node = "adv-0"
	if _, err := cluster.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	p := startAdvertiser(ctx, t, node, "dgx1")

	var renewed time.Time
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		inv, err := objects.NodeInventory(n)
		if err != nil || len(inv.Devices) != 8 {
			return false, nil
		}
		gpus := n.Status.Capacity[kubeinterface.ResourceGPU]
		cores := n.Status.Allocatable[kubeinterface.ResourceGPUCores]
		if gpus.Value() != 800 || cores.Value() != 800 {
			return false, nil
		}
		l, err := cluster.Client.CoordinationV1().Leases(kubeinterface.LeaseNamespace).Get(ctx, kubeinterface.LeaseName(node), metav1.GetOptions{})
		if err != nil || l.Spec.RenewTime == nil {
			return false, nil
		}
		renewed = l.Spec.RenewTime.Time
		return true, nil
	}); err != nil {
		t.Fatalf("inventory, capacity and Lease of %s did not appear; see %s", node, p.Log)
	}

	if err := cluster.KillAPIServer(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Second)
	if err := cluster.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	if p.Exited() {
		t.Fatalf("kubegpu-crishim exited during the API server's outage; see %s", p.Log)
	}
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cluster.Client.CoordinationV1().Leases(kubeinterface.LeaseNamespace).Get(ctx, kubeinterface.LeaseName(node), metav1.GetOptions{})
		return err == nil && l.Spec.RenewTime != nil && l.Spec.RenewTime.After(renewed.Add(30*time.Second)), nil
	}); err != nil {
		t.Fatalf("heartbeat not renewed after the API server came back; see %s", p.Log)
	}
}
