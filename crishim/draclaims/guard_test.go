package draclaims

import (
	"context"
	"errors"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
)

type fakeKubelet struct {
	pods []*podresourcesapi.PodResources
	err  error
	asks int
}

func (f *fakeKubelet) List(context.Context) ([]*podresourcesapi.PodResources, error) {
	f.asks++
	return f.pods, f.err
}

func slice(name, driver, node, device, uuid string) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.ResourceSliceSpec{
		Driver: driver, NodeName: &node, Pool: resourceapi.ResourcePool{Name: node},
		Devices: []resourceapi.Device{{Name: device, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {StringValue: &uuid}}}}}}
}

func claimOf(ns, pod, claim, driver, pool, device, cdi string) *podresourcesapi.PodResources {
	return &podresourcesapi.PodResources{Namespace: ns, Name: pod, Containers: []*podresourcesapi.ContainerResources{{
		Name: "main", DynamicResources: []*podresourcesapi.DynamicResource{{ClaimName: claim, ClaimNamespace: ns,
			ClaimResources: []*podresourcesapi.ClaimResource{{DriverName: driver, PoolName: pool, DeviceName: device,
				CdiDevices: []*podresourcesapi.CDIDevice{{Name: cdi}}}}}}}}}
}

// TestGuard: kubelet is asked only while another driver publishes one of
// the node's GPUs (or the slices are unread); claims of other pods on
// kubegpu GPUs are named, the pod's own are listed with their CDI devices,
// and claims on devices that are no kubegpu GPU are ignored. Not knowing
// is an error, never an empty answer.
func TestGuard(t *testing.T) {
	ctx := context.Background()
	k := &fakeKubelet{}
	g := New("n1", k)
	g.SetInventory(types.Inventory{Devices: []types.Device{{ID: "gpu0", UUID: "GPU-aaa"}, {ID: "gpu1", UUID: "GPU-bbb"}}})
	g.synced = true
	if c, err := g.For(ctx, "ns", "p"); err != nil || len(c.Others)+len(c.Own) != 0 || k.asks != 0 {
		t.Fatalf("no other driver: %+v, %v, %d asks; want nothing, no ask", c, err, k.asks)
	}
	g.update(slice("own", dra.DriverName, "n1", "gpu0", "GPU-aaa"))
	g.update(slice("nic", "nic.example.com", "n1", "nic0", "NIC-1"))
	if _, err := g.For(ctx, "ns", "p"); err != nil || k.asks != 0 {
		t.Fatalf("kubegpu's own and unrelated slices: %v, %d asks", err, k.asks)
	}
	g.update(slice("theirs", "gpu.example.com", "n1", "dev-b", "gpu-BBB"))
	if o, synced := g.Overlaps(); len(o) != 1 || o[0].Device != "gpu1" || o[0].Driver != "gpu.example.com" || !synced {
		t.Fatalf("Overlaps() = %+v, %v", o, synced)
	}
	k.pods = []*podresourcesapi.PodResources{
		claimOf("other", "holder", "c1", "gpu.example.com", "n1", "dev-b", "k8s.gpu.nvidia.com/device=dev-b"),
		claimOf("ns", "p", "mine", "gpu.example.com", "n1", "dev-b", "k8s.gpu.nvidia.com/device=dev-b"),
		claimOf("ns", "p", "nic", "nic.example.com", "n1", "nic0", "nic.example.com/nic=nic0"),
	}
	c, err := g.For(ctx, "ns", "p")
	if err != nil {
		t.Fatal(err)
	}
	if h, ok := c.Others["gpu1"]; !ok || h.Pod != "other/holder" || h.Claim != "other/c1" || len(c.Others) != 1 {
		t.Errorf("Others = %+v", c.Others)
	}
	if len(c.Own) != 1 || c.Own[0] != "gpu1" || len(c.CDI) != 2 {
		t.Errorf("Own = %v, CDI = %v", c.Own, c.CDI)
	}
	k.err = errors.New("connection refused")
	if _, err := g.For(ctx, "ns", "p"); !errors.Is(err, ErrUnknown) {
		t.Errorf("kubelet not answering: %v, want ErrUnknown", err)
	}
	// Slices not read yet: GPU claims of other drivers cannot be
	// resolved; a NIC's can be passed over.
	k.err = nil
	g2 := New("n1", k)
	g2.SetInventory(types.Inventory{Devices: []types.Device{{ID: "gpu0", UUID: "GPU-aaa"}}})
	if _, err := g2.For(ctx, "ns", "q"); !errors.Is(err, ErrUnknown) {
		t.Errorf("slices not read, claims of other drivers: %v, want ErrUnknown", err)
	}
	k.pods = k.pods[2:] // the NIC's claim
	if _, err := g2.For(ctx, "ns", "q"); err != nil {
		t.Errorf("slices not read, a NIC's claim: %v", err)
	}
	k.pods = nil
	if _, err := g2.For(ctx, "ns", "q"); err != nil {
		t.Errorf("slices not read, no claims: %v", err)
	}
	// Without kubelet's API: an error only once a conflict is known.
	g3 := New("n1", nil)
	g3.SetInventory(types.Inventory{Devices: []types.Device{{ID: "gpu1", UUID: "GPU-bbb"}}})
	if _, err := g3.For(ctx, "ns", "p"); err != nil {
		t.Errorf("no kubelet API, slices unread: %v", err)
	}
	g3.synced = true
	g3.update(slice("theirs", "gpu.example.com", "n1", "dev-b", "GPU-bbb"))
	if _, err := g3.For(ctx, "ns", "p"); !errors.Is(err, ErrUnknown) {
		t.Errorf("no kubelet API, conflict known: %v, want ErrUnknown", err)
	}
	// A claim on a GPU holds its MIG partitions too.
	g4 := New("n1", &fakeKubelet{pods: []*podresourcesapi.PodResources{claimOf("other", "holder", "c1", "gpu.example.com", "n1", "dev-b", "x")}})
	g4.SetInventory(types.Inventory{Devices: []types.Device{{ID: "gpu1", UUID: "GPU-bbb"}, {ID: "gpu1-mig0", UUID: "MIG-1", Parent: "gpu1"}}})
	g4.synced = true
	g4.update(slice("theirs", "gpu.example.com", "n1", "dev-b", "GPU-bbb"))
	if c, err := g4.For(ctx, "ns", "p"); err != nil || len(c.Others) != 2 {
		t.Errorf("claim on a GPU with a MIG partition: %+v, %v; want both held", c.Others, err)
	}
}
