package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/crishim/advertiser"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/plugins/simgpu"
	"github.com/kubegpu/kubegpu/types"
)

// nodeSlices are node's ResourceSlices of kubegpu's driver, read as an
// administrator.
func nodeSlices(ctx context.Context, node string) ([]resourceapi.ResourceSlice, error) {
	list, err := cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: dra.NodeSelector(node)})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// TestShimPublishesResourceSlices: kubegpu-crishim on a real kubelet node
// publishes the node's simulated GPUs as ResourceSlices of driver
// gpu.kubegpu.io with its own credentials, owned by the Node, every device
// tainted for kubegpu; a GPU that turns unhealthy gets the unhealthy taint
// within a few advertise intervals; the node's credentials cannot create,
// change, list or delete another node's slices; a Node deleted and
// registered again gets its slices anew; and `kubegpu-crishim unpublish`
// removes them.
func TestShimPublishesResourceSlices(t *testing.T) {
	ctx := context.Background()
	const nodeName = "slices-node"
	n := startNode(ctx, t)
	nodeID, err := cluster.NodeIdentity(nodeName)
	if err != nil {
		t.Fatal(err)
	}
	health := filepath.Join(t.TempDir(), "unhealthy")
	shim, sock := startShim(ctx, t, n, nodeName, "--plugin-option=simgpu.preset=t4x4", "--plugin-option=simgpu.health-file="+health,
		"--kubeconfig="+nodeID.Kubeconfig, "--interval=1s")
	k := startKubelet(ctx, t, n, nodeName, sock, 0)
	topo, err := simgpu.Preset("t4x4")
	if err != nil {
		t.Fatal(err)
	}
	inv := simgpu.Inventory(topo, nodeName)

	// devicesOf polls until the node's slices hold len(inv.Devices)
	// devices and check accepts them.
	devicesOf := func(what string, check func(map[string]resourceapi.Device) error) []resourceapi.ResourceSlice {
		t.Helper()
		var got []resourceapi.ResourceSlice
		var last error
		if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			got, last = nodeSlices(ctx, nodeName)
			if last != nil {
				return false, nil
			}
			devs := map[string]resourceapi.Device{}
			for _, s := range got {
				for _, d := range s.Spec.Devices {
					devs[d.Name] = d
				}
			}
			if len(devs) != len(inv.Devices) {
				last = fmt.Errorf("%d devices in %d slices, want %d", len(devs), len(got), len(inv.Devices))
				return false, nil
			}
			last = check(devs)
			return last == nil, nil
		}); err != nil {
			t.Fatalf("%s: %v (last: %v); shim log %s", what, err, last, shim.Log)
		}
		return got
	}
	slicesNow := devicesOf("published", func(devs map[string]resourceapi.Device) error {
		for _, want := range inv.Devices {
			d, ok := devs[want.ID]
			if !ok {
				return fmt.Errorf("no device %s", want.ID)
			}
			if uuid := d.Attributes[dra.AttributeUUID].StringValue; uuid == nil || *uuid != want.UUID {
				return fmt.Errorf("%s: uuid %v, want %s", want.ID, uuid, want.UUID)
			}
			if model := d.Attributes[dra.AttributeModel].StringValue; model == nil || *model != want.Model {
				return fmt.Errorf("%s: model %v, want %s", want.ID, model, want.Model)
			}
			if m := d.Capacity[dra.CapacityMemory].Value; m.Value() != want.MemoryMiB<<20 {
				return fmt.Errorf("%s: memory %s, want %d MiB", want.ID, m.String(), want.MemoryMiB)
			}
			// Consumable capacity (beta in the pinned version): stored as
			// written, so the API server validated and kept it.
			if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations || d.Capacity[dra.CapacityCores].RequestPolicy == nil ||
				d.Capacity[dra.CapacityMemory].RequestPolicy == nil {
				return fmt.Errorf("%s: allowMultipleAllocations %v, capacity %+v: want consumable memory and cores", want.ID, d.AllowMultipleAllocations, d.Capacity)
			}
			if !slices.ContainsFunc(d.Taints, func(tn resourceapi.DeviceTaint) bool {
				return tn.Key == dra.TaintManaged && tn.Effect == resourceapi.DeviceTaintEffectNoSchedule
			}) {
				return fmt.Errorf("%s: taints %v, want %s", want.ID, d.Taints, dra.TaintManaged)
			}
		}
		return nil
	})
	node, err := cluster.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slicesNow {
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Kind != "Node" || s.OwnerReferences[0].Name != nodeName || s.OwnerReferences[0].UID != node.UID {
			t.Errorf("slice %s is owned by %v, want the Node %s of UID %s (so that it goes with the Node)", s.Name, s.OwnerReferences, nodeName, node.UID)
		}
		if s.Spec.Pool.Name != nodeName || ptr.Deref(s.Spec.NodeName, "") != nodeName {
			t.Errorf("slice %s: pool %q, node %v; want both %s", s.Name, s.Spec.Pool.Name, s.Spec.NodeName, nodeName)
		}
	}
	t.Logf("%s's GPUs in %d ResourceSlice(s) of driver %s", nodeName, len(slicesNow), dra.DriverName)

	// A GPU turns unhealthy: its device gets the unhealthy taint.
	if err := os.WriteFile(health, []byte("2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	devicesOf("GPU 2 unhealthy", func(devs map[string]resourceapi.Device) error {
		for id, d := range devs {
			tainted := slices.ContainsFunc(d.Taints, func(tn resourceapi.DeviceTaint) bool { return tn.Key == dra.TaintUnhealthy })
			if tainted != (id == inv.Devices[2].ID) {
				return fmt.Errorf("%s: taints %v", id, d.Taints)
			}
		}
		return nil
	})

	// The node's credentials reach no other node's slices.
	other := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "forged-" + nodeName},
		Spec: resourceapi.ResourceSliceSpec{Driver: dra.DriverName, NodeName: ptr.To("other-node"),
			Pool: resourceapi.ResourcePool{Name: "other-node", ResourceSliceCount: 1}, Devices: []resourceapi.Device{{Name: "gpu0"}}},
	}
	if _, err := nodeID.Client.ResourceV1().ResourceSlices().Create(ctx, other, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the node created a slice of another node: %v", err)
	}
	other.Name = "other-node-slice"
	if _, err := cluster.Client.ResourceV1().ResourceSlices().Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.ResourceV1().ResourceSlices().Delete(context.Background(), other.Name, metav1.DeleteOptions{})
	})
	forged := other.DeepCopy()
	forged.Spec.Devices = []resourceapi.Device{{Name: "gpu9"}}
	if _, err := nodeID.Client.ResourceV1().ResourceSlices().Update(ctx, forged, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the node changed another node's slice: %v", err)
	}
	if err := nodeID.Client.ResourceV1().ResourceSlices().Delete(ctx, other.Name, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the node deleted another node's slice: %v", err)
	}
	if _, err := nodeID.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the node listed every node's slices: %v", err)
	}

	// The Node is deleted: its slices go with it (the garbage collector;
	// the shim stops publishing while it finds no Node).
	if err := cluster.Client.CoreV1().Nodes().Delete(ctx, nodeName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := nodeSlices(ctx, nodeName)
		return err == nil && len(got) == 0, nil
	}); err != nil {
		t.Fatalf("the deleted Node's slices stayed: %v; shim log %s", err, shim.Log)
	}
	// Its kubelet restarts and registers it again: the shim publishes
	// slices owned by the new Node.
	if err := k.Stop(); err != nil {
		t.Fatal(err)
	}
	startKubelet(ctx, t, n, nodeName, sock, 0)
	var last string
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil || n.UID == node.UID {
			last = fmt.Sprintf("node: %v", err)
			return false, nil
		}
		got, err := nodeSlices(ctx, nodeName)
		if err != nil || len(got) == 0 {
			last = fmt.Sprintf("%d slices: %v", len(got), err)
			return false, nil
		}
		for _, s := range got {
			if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != n.UID {
				last = fmt.Sprintf("slice %s owned by %v, want the new Node %s", s.Name, s.OwnerReferences, n.UID)
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("after the Node was registered again: %v (last: %s); shim log %s", err, last, shim.Log)
	}

	// Uninstall: the shim stops, and unpublish removes its slices.
	if err := shim.Stop(); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "kubegpu-crishim"), "unpublish", "--kubeconfig="+nodeID.Kubeconfig, "--node-name="+nodeName).CombinedOutput()
	if err != nil {
		t.Fatalf("unpublish: %v\n%s", err, out)
	}
	left, err := nodeSlices(ctx, nodeName)
	if err != nil || len(left) != 0 {
		t.Errorf("after unpublish: %d slices left, %v\n%s", len(left), err, out)
	}
	if !strings.Contains(string(out), "Removed the node's ResourceSlices") {
		t.Errorf("unpublish said:\n%s", out)
	}
	if _, err := cluster.Client.ResourceV1().ResourceSlices().Get(ctx, other.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("unpublish touched another node's slice: %v", err)
	}
	// And the Node advertises no GPU kubegpu served: another allocator
	// (a DRA driver) can serve the node.
	after, err := cluster.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := after.Annotations[kubeinterface.AnnotationInventory]; ok {
		t.Errorf("after unpublish the Node keeps its %s annotation", kubeinterface.AnnotationInventory)
	}
	for _, r := range []corev1.ResourceName{kubeinterface.ResourceGPU, kubeinterface.ResourceGPUShare, kubeinterface.ResourceGPUs} {
		if q, ok := after.Status.Allocatable[r]; ok {
			t.Errorf("after unpublish the Node advertises %s: %s", r, q.String())
		}
	}
	for _, c := range after.Status.Conditions {
		if c.Type == kubeinterface.ConditionDevicesReady || c.Type == kubeinterface.ConditionDRAConflict {
			t.Errorf("after unpublish the Node keeps condition %s", c.Type)
		}
	}
	if !slices.ContainsFunc(after.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == corev1.NodeReady }) {
		t.Errorf("unpublish removed kubelet's conditions: %+v", after.Status.Conditions)
	}
}

// TestShimServesWithoutTheAPIServer: a shim whose API server cannot be
// reached still serves CRI: publishing (which waits for the node's slices
// to be listed) runs beside the CRI server, not in front of it.
func TestShimServesWithoutTheAPIServer(t *testing.T) {
	ctx := context.Background()
	n := startNode(ctx, t)
	kubeconfig := filepath.Join(t.TempDir(), "unreachable.kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: none}
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	// startShim waits until crictl reaches the shim's CRI socket.
	startShim(ctx, t, n, "no-api-node", "--plugin-option=simgpu.preset=t4x4", "--kubeconfig="+kubeconfig, "--interval=1s")
}

// TestResourceSlicesOfPartitionedGPUs: a node with a GPU in MIG mode
// publishes, with its own credentials, its partitions as partitionable
// devices: the GPU's counters (memory, multiprocessors) in a slice of
// their own, the GPU consuming all of them and each partition its share,
// and a whole GPU beside it with consumable capacity; the API server
// (DRAPartitionableDevices and DRAConsumableCapacity on, as by default in
// the pinned version) keeps every field.
func TestResourceSlicesOfPartitionedGPUs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const nodeName = "mig-slices"
	sn := addNodes(ctx, t, nodeName, "", 1)
	node, err := cluster.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(sn.kubelets[nodeName].Identity.Config)
	if err != nil {
		t.Fatal(err)
	}
	inv := types.Inventory{Devices: []types.Device{
		{ID: "gpu0", UUID: "GPU-mig-test-0", Vendor: "nvidia.com", Model: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, ComputeUnits: 108, Health: types.Healthy, NUMANode: -1},
		{ID: "gpu1", UUID: "GPU-mig-test-1", Vendor: "nvidia.com", Model: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, ComputeUnits: 108, Health: types.Healthy, NUMANode: -1},
		{ID: "gpu1-mig0", UUID: "MIG-mig-test-a", Vendor: "nvidia.com", Model: "NVIDIA A100-SXM4-40GB MIG 3g.20gb", MemoryMiB: 19968, ComputeUnits: 42, Health: types.Healthy, NUMANode: -1, Parent: "gpu1"},
		{ID: "gpu1-mig1", UUID: "MIG-mig-test-b", Vendor: "nvidia.com", Model: "NVIDIA A100-SXM4-40GB MIG 1g.5gb", MemoryMiB: 4864, ComputeUnits: 14, Health: types.Healthy, NUMANode: -1, Parent: "gpu1"},
	}}
	if err := inv.Validate(); err != nil {
		t.Fatal(err)
	}
	s := advertiser.NewSlices(cs, nodeName, dra.Options{}, nil)
	go s.Run(ctx)
	s.Update(ctx, inv, node.UID)
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := nodeSlices(ctx, nodeName)
		if err != nil {
			last = err
			return false, nil
		}
		var counters []resourceapi.CounterSet
		devices := map[string]resourceapi.Device{}
		for _, sl := range list {
			counters = append(counters, sl.Spec.SharedCounters...)
			for _, d := range sl.Spec.Devices {
				devices[d.Name] = d
			}
		}
		switch {
		case len(counters) != 1 || counters[0].Name != "gpu1" || len(counters[0].Counters) != 2:
			last = fmt.Errorf("counter sets %+v, want gpu1's memory and multiprocessors", counters)
		case len(devices) != 4:
			last = fmt.Errorf("%d devices, want 4", len(devices))
		case len(devices["gpu1"].ConsumesCounters) != 1 || len(devices["gpu1-mig1"].ConsumesCounters) != 1 || devices["gpu1-mig1"].ConsumesCounters[0].CounterSet != "gpu1":
			last = fmt.Errorf("consumption dropped or wrong: gpu1 %+v, gpu1-mig1 %+v", devices["gpu1"].ConsumesCounters, devices["gpu1-mig1"].ConsumesCounters)
		case devices["gpu0"].AllowMultipleAllocations == nil || len(devices["gpu0"].ConsumesCounters) != 0:
			last = fmt.Errorf("whole GPU: %+v", devices["gpu0"])
		default:
			return true, nil
		}
		return false, nil
	}); err != nil {
		t.Fatalf("partitionable devices not published as written: %v (last: %v)", err, last)
	}
}
