package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/internal/localnode"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// TestDRADriverBesideKubegpu: a DRA driver publishes, on a real kubelet
// node, the GPUs that kubegpu serves there, while a kubegpu pod runs on one
// of them; the stock DynamicResources plugin runs in kubegpu-scheduler's
// profile. Attacked from every side, no GPU is held by two running
// containers, and every refused pod says why:
//   - kubegpu-scheduler places no new GPU pod on the node, naming the
//     driver (FailedScheduling, `kubegpu explain`, `kubegpu gpus`), and the
//     shim sets the Node condition kubegpu.io/DRAConflict;
//   - a pod whose ResourceClaim DRA's allocator gave the GPU the kubegpu
//     pod holds is refused its container by the node (the race);
//   - a pod with a claim on a free GPU runs with its CDI device, and a
//     kubegpu allocation of that GPU (signed, straight to the shim) is
//     refused, naming the claim;
//   - a DeviceClass mapping nvidia.com/gpu, created while kubegpu pods run,
//     changes nothing for them;
//   - the driver removed again, a kubegpu pod given the GPU that the DRA
//     pod's container still holds is refused until that pod is gone, and
//     then runs.
func TestDRADriverBesideKubegpu(t *testing.T) {
	ctx := context.Background()
	const nodeName = "dra-node"
	n := startNode(ctx, t)
	nodeID, err := cluster.NodeIdentity(nodeName)
	if err != nil {
		t.Fatal(err)
	}
	podResources := "unix://" + filepath.Join(n.Dir, "kubelet", "pod-resources", "kubelet.sock")
	shim, sock := startShim(ctx, t, n, nodeName, "--plugin-option=simgpu.preset=t4x4", "--kubeconfig="+nodeID.Kubeconfig,
		"--interval=1s", "--pod-resources-endpoint="+podResources)
	k := startKubelet(ctx, t, n, nodeName, sock, 10*time.Second)
	startScheduler(ctx, t)
	ns := namespace(ctx, t, "dra")

	holder := onNode(sleeper(gpuPod("holder", 1, 0, 0, nil)), nodeName)
	createPods(ctx, t, ns, holder)
	running := waitRunning(ctx, t, ns, "holder", k)
	held := allocatedGPU(t, running)

	driver := startExampleDriver(ctx, t, n, nodeName, nodeID.Client, 4)
	if _, err := cluster.Client.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: exampleDriverName},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", exampleDriverName)}}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.ResourceV1().DeviceClasses().Delete(context.Background(), exampleDriverName, metav1.DeleteOptions{})
	})
	waitCondition(ctx, t, nodeName, "True", exampleDriverName, shim)

	// kubegpu-scheduler leaves the node to DRA.
	createPods(ctx, t, ns, onNode(sleeper(gpuPod("kubegpu-refused", 1, 0, 0, nil)), nodeName))
	waitFailedScheduling(ctx, t, ns, "kubegpu-refused", "DRA driver "+exampleDriverName)
	if out := kubegpu(t, "explain", "-n", ns, "kubegpu-refused"); !strings.Contains(out, "published by DRA driver "+exampleDriverName) {
		t.Errorf("kubegpu explain does not name the DRA driver:\n%s", out)
	}
	if out := kubegpu(t, "gpus"); !strings.Contains(out, "Published by other DRA drivers") || !strings.Contains(out, "driver "+exampleDriverName) {
		t.Errorf("kubegpu gpus does not say which GPUs DRA drivers publish:\n%s", out)
	}

	// The race: DRA's allocator gives a claim the GPU the kubegpu pod
	// holds (it cannot know); the node refuses the claim's container.
	racer := claimPod(ctx, t, ns, nodeName, "racer", fmt.Sprintf("device.attributes[%q].uuid == %q", exampleDriverName, held.UUID))
	waitContainerRefused(ctx, t, ns, racer, "held by another pod", k)
	checkNoGPUTwice(ctx, t, n, sock, ns)
	if p, err := viewer.Client.CoreV1().Pods(ns).Get(ctx, "holder", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodRunning {
		t.Fatalf("the kubegpu pod is no longer running: %v %v", err, p.Status.Phase)
	}

	// A claim on a free GPU runs, with the CDI device its claim brings.
	other := claimPod(ctx, t, ns, nodeName, "dra-user", fmt.Sprintf("device.attributes[%q].uuid != %q", exampleDriverName, held.UUID))
	waitRunning(ctx, t, ns, other, k)
	draGPU := claimedGPU(ctx, t, ns, other)
	if out := containerEnv(ctx, t, n, sock, other); !strings.Contains(out, "DRA_GPU_") {
		t.Errorf("the DRA pod's container lost its claim's CDI device:\n%s", out)
	}
	// A kubegpu allocation of that GPU, signed, straight to the shim.
	alloc := &types.PodAllocation{Node: nodeName, Containers: []types.ContainerAllocation{{Name: "main",
		Devices: []types.DeviceShare{{ID: draGPU, UUID: simUUID(t, nodeName, gpuIndex(t, draGPU)), Exclusive: true}}}}}
	dir := t.TempDir()
	if out, err := runEnv(ctx, t, n, sock, sandboxConfig(t, dir, "steal", nodeName, alloc, signingKey), containerConfig(t, dir, "steal")); err == nil ||
		!strings.Contains(err.Error(), "ResourceClaim "+ns+"/dra-user") {
		t.Errorf("a kubegpu container for the GPU a DRA claim holds: %v\n%s\nwant a refusal naming the claim", err, out)
	}

	// A DeviceClass mapping nvidia.com/gpu, made while kubegpu pods run.
	if _, err := cluster.Client.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu-extended"},
		Spec: resourceapi.DeviceClassSpec{ExtendedResourceName: ptr.To(kubeinterface.ResourceGPU), Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", exampleDriverName)}}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.ResourceV1().DeviceClasses().Delete(context.Background(), "gpu-extended", metav1.DeleteOptions{})
	})
	if out := kubegpu(t, "gpus"); !strings.Contains(out, "DeviceClass gpu-extended maps nvidia.com/gpu to DRA") {
		t.Errorf("kubegpu gpus does not name the class that maps nvidia.com/gpu:\n%s", out)
	}
	if p, err := viewer.Client.CoreV1().Pods(ns).Get(ctx, "holder", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodRunning {
		t.Fatalf("the kubegpu pod stopped once nvidia.com/gpu was mapped: %v %v", err, p.Status.Phase)
	}
	if err := cluster.Client.ResourceV1().DeviceClasses().Delete(ctx, "gpu-extended", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// The driver goes; its claim's container still holds its GPU.
	deletePod(ctx, t, ns, racer, false)
	deletePod(ctx, t, ns, "kubegpu-refused", false)
	driver.stop()
	waitCondition(ctx, t, nodeName, "False", "", shim)
	all := onNode(sleeper(gpuPod("after", 3, 0, 0, nil)), nodeName) // every GPU the holder does not hold
	createPods(ctx, t, ns, all)
	waitContainerRefused(ctx, t, ns, "after", "held by another pod", k)
	checkNoGPUTwice(ctx, t, n, sock, ns)
	deletePod(ctx, t, ns, other, true) // its driver is gone: kubelet cannot unprepare its claim
	waitRunning(ctx, t, ns, "after", k)
	checkNoGPUTwice(ctx, t, n, sock, ns)
}

// sleeper makes p run busybox's sleep on the node's image.
func sleeper(p *corev1.Pod) *corev1.Pod {
	p.Spec.Containers[0].Image = busyboxImage
	p.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
	p.Spec.Containers[0].Command = []string{"sleep", "3600"}
	p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](1)
	p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}
	return p
}

// onNode pins p to node.
func onNode(p *corev1.Pod, node string) *corev1.Pod {
	p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	return p
}

// claimPod creates, as the tenant, a ResourceClaim for one GPU of the DRA
// driver that cel selects and a pod using it; it returns the pod's name.
func claimPod(ctx context.Context, t *testing.T, ns, node, name, cel string) string {
	t.Helper()
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: exampleDriverName,
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: cel}}}}}}}}}
	if _, err := tenant(t, ns).ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := sleeper(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeSelector: map[string]string{corev1.LabelHostname: node},
		ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name)}},
		Containers:     []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}}}})
	p.Spec.Containers[0].Command = []string{"sh", "-c", "env; sleep 3600"}
	createPods(ctx, t, ns, p)
	return name
}

func waitRunning(ctx context.Context, t *testing.T, ns, name string, k *localcluster.Kubelet) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	var err error
	if werr := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err = viewer.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	}); werr != nil {
		t.Fatalf("pod %s/%s not running: %v %v; status %+v; kubelet log %s", ns, name, werr, err, p.Status, k.Log)
	}
	return p
}

// waitContainerRefused waits until the pod's container is refused by the
// node with a message containing want.
func waitContainerRefused(ctx context.Context, t *testing.T, ns, name, want string, k *localcluster.Kubelet) {
	t.Helper()
	var last string
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := viewer.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if p.Status.Phase == corev1.PodRunning {
			return false, fmt.Errorf("pod %s runs", name)
		}
		for _, s := range p.Status.ContainerStatuses {
			if w := s.State.Waiting; w != nil {
				last = w.Reason + ": " + w.Message
				if strings.Contains(w.Message, want) {
					return true, nil
				}
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("pod %s/%s: %v; last waiting state %q, want one saying %q; kubelet log %s", ns, name, err, last, want, k.Log)
	}
}

func waitFailedScheduling(ctx context.Context, t *testing.T, ns, name, want string) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, m := range failedScheduling(ctx, t, ns, name) {
			if strings.Contains(m, want) {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("pod %s/%s: no FailedScheduling event saying %q: %v", ns, name, want, failedScheduling(ctx, t, ns, name))
	}
}

// waitCondition waits until the Node's kubegpu.io/DRAConflict condition has
// status, its message containing want.
func waitCondition(ctx context.Context, t *testing.T, node, status, want string, shim *localcluster.Process) {
	t.Helper()
	var last *corev1.NodeCondition
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := viewer.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for i, c := range n.Status.Conditions {
			if c.Type == kubeinterface.ConditionDRAConflict {
				last = &n.Status.Conditions[i]
				return string(c.Status) == status && strings.Contains(c.Message, want), nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("node %s: condition %s is %+v, want %s saying %q; shim log %s", node, kubeinterface.ConditionDRAConflict, last, status, want, shim.Log)
	}
}

// deletePod deletes a pod and waits until it is gone: as the tenant would,
// or, force, at once (kubelet still stops its containers).
func deletePod(ctx context.Context, t *testing.T, ns, name string, force bool) {
	t.Helper()
	opts := metav1.DeleteOptions{}
	if force {
		opts.GracePeriodSeconds = ptr.To[int64](0)
	}
	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, name, opts); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return err != nil, nil
	}); err != nil {
		t.Fatalf("pod %s/%s not gone: %v", ns, name, err)
	}
}

// allocatedGPU is the one GPU of a kubegpu pod's allocation.
func allocatedGPU(t *testing.T, p *corev1.Pod) types.DeviceShare {
	t.Helper()
	a, err := objects.PodAllocation(p)
	if err != nil || len(a.Containers) != 1 || len(a.Containers[0].Devices) != 1 {
		t.Fatalf("allocation of %s: %+v, %v", p.Name, a, err)
	}
	return a.Containers[0].Devices[0]
}

// claimedGPU is the kubegpu ID ("gpuI") of the device the pod's claim got.
func claimedGPU(ctx context.Context, t *testing.T, ns, name string) string {
	t.Helper()
	c, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil || c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s/%s: %v %+v", ns, name, err, c.Status)
	}
	return "gpu" + strings.TrimPrefix(c.Status.Allocation.Devices.Results[0].Device, "gpu-")
}

func gpuIndex(t *testing.T, id string) int {
	t.Helper()
	var i int
	if _, err := fmt.Sscanf(id, "gpu%d", &i); err != nil {
		t.Fatal(err)
	}
	return i
}

// containerEnv is what the pod's container printed.
func containerEnv(ctx context.Context, t *testing.T, n *localnode.Node, sock, pod string) string {
	t.Helper()
	ids, err := crictl(ctx, n, sock, "ps", "-q", "--label", "io.kubernetes.pod.name="+pod)
	if err != nil || ids == "" {
		t.Fatalf("find the container of %s: %v %q", pod, err, ids)
	}
	var logs string
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		logs, err = crictl(ctx, n, sock, "logs", strings.Fields(ids)[0])
		return err == nil && strings.Contains(logs, "PATH="), nil
	})
	return logs
}

// checkNoGPUTwice checks, on the node's running containers, that no GPU is
// held by two pods: from the ledger's labels and annotations, which the
// shim gives every container that holds a GPU, through kubegpu or a DRA
// claim.
func checkNoGPUTwice(ctx context.Context, t *testing.T, n *localnode.Node, sock, ns string) {
	t.Helper()
	checkNoGPUTwiceInAPI(ctx, t, ns)
	held, err := ledgerHeld(ctx, n, sock)
	if err != nil {
		t.Fatal(err)
	}
	for id, pods := range held {
		if len(pods) > 1 {
			t.Errorf("GPU %s is held by the running containers of pods %v", id, pods)
		}
	}
}

// checkNoGPUTwiceInAPI checks, in the API, that no GPU is held by two
// running pods of ns: through kubegpu's allocation or through a claim of
// the example DRA driver (its device gpu-I is kubegpu's gpuI).
func checkNoGPUTwiceInAPI(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	holders := map[string][]string{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase != corev1.PodRunning {
			continue
		}
		if a, err := objects.PodAllocation(p); err == nil {
			for _, c := range a.Containers {
				for _, d := range c.Devices {
					holders[d.ID] = append(holders[d.ID], p.Name)
				}
			}
		}
		for _, rc := range p.Spec.ResourceClaims {
			if rc.ResourceClaimName == nil {
				continue
			}
			c, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, *rc.ResourceClaimName, metav1.GetOptions{})
			if err != nil || c.Status.Allocation == nil {
				continue
			}
			for _, r := range c.Status.Allocation.Devices.Results {
				if r.Driver == exampleDriverName {
					id := "gpu" + strings.TrimPrefix(r.Device, "gpu-")
					holders[id] = append(holders[id], p.Name)
				}
			}
		}
	}
	for id, pods := range holders {
		if len(pods) > 1 {
			t.Errorf("GPU %s is held by the running pods %v (API)", id, pods)
		}
	}
}

// ledgerHeld maps each GPU to the pods whose running containers hold it,
// read from the containers' ledger labels through crictl.
func ledgerHeld(ctx context.Context, n *localnode.Node, sock string) (map[string][]string, error) {
	out, err := crictl(ctx, n, sock, "ps", "-o", "json", "--label", kubeinterface.LabelContainerLedger+"="+kubeinterface.LedgerVersion)
	if err != nil {
		return nil, fmt.Errorf("crictl ps: %w: %s", err, out)
	}
	var list struct {
		Containers []struct {
			State       string            `json:"state"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"containers"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("crictl ps: %w: %s", err, out)
	}
	held := map[string][]string{}
	for _, c := range list.Containers {
		if c.State != "CONTAINER_RUNNING" {
			continue
		}
		for _, key := range []string{kubeinterface.AnnotationContainerHeld, kubeinterface.AnnotationContainerDRAHeld} {
			v, ok := c.Annotations[key]
			if !ok {
				continue
			}
			devices, err := kubeinterface.DecodeHeld(v)
			if err != nil {
				return nil, err
			}
			for _, d := range devices {
				if key == kubeinterface.AnnotationContainerHeld && d.Claim != "" && d.Exclusive {
					continue // a claim's whole GPU: in dra-held too, as the ledger counts it
				}
				held[d.ID] = append(held[d.ID], c.Labels[kubeinterface.LabelContainerPodUID])
			}
		}
	}
	return held, nil
}
