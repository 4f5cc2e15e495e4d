package integration

import (
	"context"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubegpu/kubegpu/internal/keyfiles"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// TestKeyRotationWithRunningPods follows the documented rotation of the
// allocation signing key on a real kubelet → kubegpu-crishim → containerd
// node whose GPU pods restart their containers every few seconds, each
// restart a CreateContainer the shim verifies:
//
//  1. nodes get the new public key beside the old one;
//  2. the scheduler signs with the new key and still counts the old key's
//     allocations;
//  3. once no pod carries the old key, nodes drop it.
//
// Throughout, every restart succeeds and no GPU is given twice.
func TestKeyRotationWithRunningPods(t *testing.T) {
	ctx := context.Background()
	n := startNode(ctx, t)
	const nodeName = "rotation-node"
	newKey, newPriv, newPub, err := writeKeys(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	oldKey := signingKey
	both := filepath.Join(t.TempDir(), "allocation-keys.pub.pem")
	oldPEM, _ := os.ReadFile(pubFile)
	newPEM, _ := os.ReadFile(newPub)
	if err := os.WriteFile(both, append(append(oldPEM, "# being retired\n"...), newPEM...), 0o644); err != nil {
		t.Fatal(err)
	}
	nodeID, err := cluster.NodeIdentity(nodeName)
	if err != nil {
		t.Fatal(err)
	}
	shimArgs := func(keys string) []string {
		return []string{"--plugin-option=simgpu.preset=t4x4", "--kubeconfig=" + nodeID.Kubeconfig, "--interval=1s", "--allocation-key=" + keys}
	}
	shim, sock := startShim(ctx, t, n, nodeName, shimArgs(pubFile)...)
	k := startKubelet(ctx, t, n, nodeName, sock, time.Second)
	restartShim := func(keys string) {
		t.Helper()
		if err := shim.Stop(); err != nil {
			t.Fatal(err)
		}
		shim, _ = startShim(ctx, t, n, nodeName, shimArgs(keys)...)
	}
	ns := namespace(ctx, t, "rotation")
	// A pod whose container exits and is restarted at once, again and again.
	restarting := func(name string, gpus int) *corev1.Pod {
		p := gpuPod(name, gpus, 0, 0, nil)
		p.Spec.Containers[0].Image = busyboxImage
		p.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
		p.Spec.Containers[0].Command = []string{"sh", "-c", "env; sleep 1"}
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}
		return p
	}
	// keepsRestarting waits for n more restarts of the pod's container,
	// failing at once if the shim refused one.
	keepsRestarting := func(name string, more int32) {
		t.Helper()
		var from int32 = -1
		var last *corev1.Pod
		err := wait.PollUntilContextTimeout(ctx, 300*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
			p, err := viewer.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || len(p.Status.ContainerStatuses) == 0 {
				return false, nil
			}
			last = p
			st := p.Status.ContainerStatuses[0]
			if w := st.State.Waiting; w != nil && (w.Reason == "CreateContainerError" || strings.Contains(w.Message, "kubegpu-crishim")) {
				return false, fmt.Errorf("container of %s refused: %s: %s", name, w.Reason, w.Message)
			}
			if from < 0 {
				from = st.RestartCount
			}
			return st.RestartCount >= from+more, nil
		})
		if err != nil {
			t.Fatalf("pod %s: %v; status %+v; shim log %s, kubelet log %s", name, err, last.Status.ContainerStatuses, shim.Log, k.Log)
		}
	}
	allocation := func(name string) kubeinterface.Allocation {
		t.Helper()
		p, err := viewer.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		a, err := kubeinterface.DecodeAllocation(p.Annotations[kubeinterface.AnnotationAllocation])
		if err != nil {
			t.Fatalf("pod %s: %v", name, err)
		}
		return a
	}
	gpusOf := func(a kubeinterface.Allocation) []string {
		var ids []string
		for _, d := range a.Containers[0].Devices {
			ids = append(ids, d.ID)
		}
		return ids
	}

	// Before: the scheduler signs with the old key, nodes hold it.
	sched := startScheduler(ctx, t)
	createPods(ctx, t, ns, restarting("old", 2))
	keepsRestarting("old", 2)
	if id := kubeinterface.SignatureKeyID(allocation("old").Signature); id != oldKey.ID() {
		t.Fatalf("first pod signed with key %s, want the old key %s", id, oldKey.ID())
	}

	// 1. Nodes accept both keys.
	restartShim(both)
	keepsRestarting("old", 2)

	// 2. The scheduler signs with the new key and counts the old key's
	// allocations: the new pod gets the two other GPUs, a third pod none.
	if err := sched.Stop(); err != nil {
		t.Fatal(err)
	}
	startSchedulerSigning(ctx, t, newPriv, "verificationKeysFile: "+pubFile)
	createPods(ctx, t, ns, restarting("new", 2))
	keepsRestarting("new", 2)
	keepsRestarting("old", 1)
	oldGPUs, newGPUs := gpusOf(allocation("old")), gpusOf(allocation("new"))
	if id := kubeinterface.SignatureKeyID(allocation("new").Signature); id != newKey.ID() {
		t.Errorf("second pod signed with key %s, want the new key %s", id, newKey.ID())
	}
	for _, g := range newGPUs {
		if slices.Contains(oldGPUs, g) {
			t.Fatalf("GPU %s given to both pods: old %v, new %v", g, oldGPUs, newGPUs)
		}
	}
	createPods(ctx, t, ns, restarting("waiting", 1))
	if p := judged(ctx, t, ns, "waiting"); p.Spec.NodeName != "" {
		t.Fatalf("a third pod was placed on the full node: %v", gpusOfPod(t, p))
	}

	// 3. No pod carries the old key once the old pod is gone: nodes drop it.
	if err := tenant(t, ns).CoreV1().Pods(ns).Delete(ctx, "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 300*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := viewer.Client.CoreV1().Pods(ns).Get(ctx, "old", metav1.GetOptions{})
		return err != nil, nil
	}); err != nil {
		t.Fatal("the old pod was not deleted")
	}
	restartShim(newPub)
	keepsRestarting("new", 2)
	keepsRestarting("waiting", 2)
	if id := kubeinterface.SignatureKeyID(allocation("waiting").Signature); id != newKey.ID() {
		t.Errorf("third pod signed with key %s, want the new key %s", id, newKey.ID())
	}
}

// gpusOfPod describes the pod's allocation, for failures.
func gpusOfPod(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	if p == nil {
		return "no pod"
	}
	a, err := objects.PodAllocation(p)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("node %s, %+v", p.Spec.NodeName, a.Containers)
}

// TestShimRefusesWrongKeys: kubegpu-crishim does not start with a key file
// that is not a set of public keys, and says what is wrong and what to do.
func TestShimRefusesWrongKeys(t *testing.T) {
	dir := t.TempDir()
	priv, _ := os.ReadFile(keyFile)
	pubPEM, _ := os.ReadFile(pubFile)
	kubeconfig, _ := os.ReadFile(viewer.Kubeconfig)
	block, _ := pem.Decode(pubPEM)
	der := block.Bytes
	for _, tt := range []struct {
		name string
		data []byte
		want string
	}{
		{"private key", priv, "holds a private key"},
		{"bare secret", []byte(strings.Repeat("s", 64)), "a bare HMAC secret is no longer accepted"},
		{"DER public key", der, "not a PEM key file"},
		{"kubeconfig", kubeconfig, "not a PEM key file"},
		{"empty", nil, "the file is empty"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-"))
			if err := os.WriteFile(path, tt.data, 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, filepath.Join(binDir, "kubegpu-crishim"), "--node-name=n", "--plugin-dir="+pluginDir,
				"--listen="+filepath.Join(dir, "shim.sock"), "--advertise=false", "--allocation-key="+path).CombinedOutput()
			if err == nil || ctx.Err() != nil || !strings.Contains(string(out), tt.want) || !strings.Contains(string(out), path) {
				t.Errorf("shim with a %s: %v\n%s\nwant it to stop saying %q about %s", tt.name, err, out, tt.want, path)
			}
		})
	}
}

// TestSchedulerSkipsNodesRefusingItsKey: a node whose shim was given
// another public key than the scheduler's says so in its inventory, and
// the scheduler sends it no GPU pods (their containers would be refused
// their allocations there, one after another) with a reason that names
// the fix; kubegpu explain says the same. Nodes of older shims, which
// name no key, are taken to accept it (TestNodeRefusingTheKey).
func TestSchedulerSkipsNodesRefusingItsKey(t *testing.T) {
	ctx := context.Background()
	_, otherPub, err := keyfiles.WriteEd25519(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	n := startNode(ctx, t)
	const nodeName = "wrong-key"
	nodeID, err := cluster.NodeIdentity(nodeName)
	if err != nil {
		t.Fatal(err)
	}
	_, sock := startShim(ctx, t, n, nodeName, "--plugin-option=simgpu.preset=t4x4", "--kubeconfig="+nodeID.Kubeconfig, "--interval=1s",
		"--allocation-key="+otherPub)
	startKubelet(ctx, t, n, nodeName, sock, 0)
	startScheduler(ctx, t)
	ns := namespace(ctx, t, "wrong-key")
	p := gpuPod("pinned", 1, 0, 0, nil)
	p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: nodeName}
	createPods(ctx, t, ns, p)
	const why = "node's kubegpu-crishim does not accept this scheduler's signing key"
	// The pod's condition says why (events of quick retries may be
	// merged).
	var got *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err = viewer.Client.CoreV1().Pods(ns).Get(ctx, "pinned", metav1.GetOptions{})
		return err == nil && slices.ContainsFunc(got.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodScheduled && strings.Contains(c.Message, why)
		}), nil
	}); err != nil {
		t.Fatalf("the pod's PodScheduled condition does not say %q: %v; status %+v", why, err, got.Status)
	}
	if got.Spec.NodeName != "" {
		t.Errorf("the pod was bound to %q by a scheduler the node refuses", got.Spec.NodeName)
	}
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "kubegpu"), "--kubeconfig", viewer.Kubeconfig, "--allocation-key", pubFile,
		"-n", ns, "explain", "pinned").CombinedOutput()
	// explain refuses the node with the scheduler's own reason.
	if err != nil || !strings.Contains(string(out), why) {
		t.Errorf("kubegpu explain: %v\n%s", err, out)
	}
}
