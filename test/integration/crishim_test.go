package integration

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// startAdvertiser runs kubegpu-crishim for node with a simgpu preset,
// publishing with the node's own credentials; the CRI side points at a
// runtime that is not there (calls would fail with Unavailable).
func startAdvertiser(ctx context.Context, t *testing.T, node, preset string) *localcluster.Process {
	t.Helper()
	id, err := cluster.NodeIdentity(node)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p, err := localcluster.StartProcess(filepath.Join(workDir, "kubegpu-crishim-"+node+".log"), filepath.Join(binDir, "kubegpu-crishim"),
		"--node-name="+node, "--plugin-dir="+pluginDir, "--plugin-option=simgpu.preset="+preset,
		"--listen="+filepath.Join(dir, "crishim.sock"), "--runtime-endpoint=unix://"+filepath.Join(dir, "none.sock"),
		"--allocation-key="+pubFile, "--kubeconfig="+id.Kubeconfig, "--interval=1s", "--v=2",
		"--kubelet-root-dir="+filepath.Join(dir, "kubelet"), "--claims-dir="+filepath.Join(dir, "claims"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	return p
}

// published reports whether node carries its dgx1 inventory and capacity.
func published(ctx context.Context, node string) bool {
	n, err := viewer.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return false
	}
	inv, err := objects.NodeInventory(n)
	if err != nil || len(inv.Devices) != 8 {
		return false
	}
	gpus := n.Status.Capacity[kubeinterface.ResourceGPU]
	cores := n.Status.Allocatable[kubeinterface.ResourceGPUCores]
	return gpus.Value() == 800 && cores.Value() == 800
}

// TestAdvertiserPublishesAndRecovers: with the node's own credentials, the
// advertiser publishes the node's inventory and extended-resource capacity
// (status subresource); with kube-apiserver down it keeps running; and
// whatever resets or removes them is undone within an interval.
func TestAdvertiserPublishesAndRecovers(t *testing.T) {
	ctx := context.Background()
	const node = "adv-0"
	k, err := cluster.StartSimKubelet(ctx, localcluster.SimKubeletOptions{Node: node, Capacity: localcluster.NodeCapacity("8", "32Gi", 110)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		k.Pause()
		_ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{})
	})
	p := startAdvertiser(ctx, t, node, "dgx1")
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return published(ctx, node), nil
	}); err != nil {
		t.Fatalf("inventory and capacity of %s did not appear; see %s", node, p.Log)
	}

	if err := cluster.KillAPIServer(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(8 * time.Second)
	if err := cluster.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	if p.Exited() {
		t.Fatalf("kubegpu-crishim exited during the API server's outage; see %s", p.Log)
	}
	// Something (kubelet on some restarts, a careless operator) resets the
	// capacity and removes the inventory: the advertiser restores both.
	patch := []byte(`{"metadata":{"annotations":{"kubegpu.io/inventory":null}}}`)
	if _, err := cluster.Client.CoreV1().Nodes().Patch(ctx, node, ktypes.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Capacity[kubeinterface.ResourceGPU] = resource.MustParse("0")
	n.Status.Allocatable[kubeinterface.ResourceGPU] = resource.MustParse("0")
	if _, err := cluster.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return published(ctx, node), nil
	}); err != nil {
		t.Fatalf("inventory and capacity of %s not restored; see %s", node, p.Log)
	}
}
