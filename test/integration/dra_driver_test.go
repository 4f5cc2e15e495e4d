package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/internal/localnode"
)

// The DRA driver beside kubegpu in the tests: a kubelet plugin built from
// k8s.io/dynamic-resource-allocation/kubeletplugin, as a real DRA driver
// is, registered with the real kubelet and publishing, with the node's
// credentials, the same (simulated) GPUs that kubegpu's module finds: by
// their UUIDs and PCI bus IDs, with no taint. It prepares a claim by
// naming one CDI device per allocated device, of the kind NVIDIA's DRA
// driver uses, whose spec (written into containerd's CDI directory) sets
// an environment variable naming the GPU.
const (
	exampleDriverName = "gpu.nvidia.com"
	exampleCDIKind    = "k8s.gpu.nvidia.com/device"
)

type exampleDriver struct {
	t      *testing.T
	helper *kubeletplugin.Helper
}

// startExampleDriver registers the driver with the kubelet on n (its root
// directory under n.Dir) and publishes count GPUs of node, named gpu-I.
func startExampleDriver(ctx context.Context, t *testing.T, n *localnode.Node, node string, client kubernetes.Interface, count int) *exampleDriver {
	t.Helper()
	var cdi []map[string]any
	var devices []resourceapi.Device
	for i := range count {
		uuid, pci := simUUID(t, node, i), fmt.Sprintf("0000:%02x:00.0", 0x10+i)
		name := fmt.Sprintf("gpu-%d", i)
		devices = append(devices, resourceapi.Device{Name: name, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"uuid":                            {StringValue: ptr.To(uuid)},
			"resource.kubernetes.io/pciBusID": {StringValue: ptr.To(pci)},
		}})
		cdi = append(cdi, map[string]any{"name": name, "containerEdits": map[string]any{"env": []string{"DRA_GPU_" + fmt.Sprint(i) + "=" + uuid}}})
	}
	writeJSON(t, filepath.Join(n.CDISpecDir, "example-dra.json"), map[string]any{"cdiVersion": "0.6.0", "kind": exampleCDIKind, "devices": cdi})
	root := filepath.Join(n.Dir, "kubelet")
	for _, dir := range []string{filepath.Join(root, "plugins_registry"), filepath.Join(root, "plugins", exampleDriverName)} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	d := &exampleDriver{t: t}
	h, err := kubeletplugin.Start(ctx, d, kubeletplugin.DriverName(exampleDriverName), kubeletplugin.NodeName(node),
		kubeletplugin.KubeClient(client), kubeletplugin.RegistrarDirectoryPath(filepath.Join(root, "plugins_registry")),
		kubeletplugin.PluginDataDirectoryPath(filepath.Join(root, "plugins", exampleDriverName)), kubeletplugin.HealthService(false))
	if err != nil {
		t.Fatal(err)
	}
	d.helper = h
	t.Cleanup(d.stop)
	if err := h.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		node: {Slices: []resourceslice.Slice{{Devices: devices}}}}}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		s := h.RegistrationStatus()
		return s != nil && s.PluginRegistered, nil
	}); err != nil {
		t.Fatalf("the DRA driver was not registered with kubelet: %v (status %+v)", err, h.RegistrationStatus())
	}
	return d
}

// stop stops the driver and removes its slices, as uninstalling it does.
func (d *exampleDriver) stop() {
	if d.helper == nil {
		return
	}
	d.helper.Stop()
	d.helper = nil
	err := cluster.Client.ResourceV1().ResourceSlices().DeleteCollection(context.Background(), metav1.DeleteOptions{},
		metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + exampleDriverName})
	if err != nil {
		d.t.Errorf("remove the DRA driver's slices: %v", err)
	}
}

func (d *exampleDriver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[ktypes.UID]kubeletplugin.PrepareResult, error) {
	out := map[ktypes.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		var res kubeletplugin.PrepareResult
		if c.Status.Allocation != nil {
			for _, r := range c.Status.Allocation.Devices.Results {
				if r.Driver == exampleDriverName {
					res.Devices = append(res.Devices, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
						CDIDeviceIDs: []string{exampleCDIKind + "=" + r.Device}})
				}
			}
		}
		out[c.UID] = res
	}
	return out, nil
}

func (d *exampleDriver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[ktypes.UID]error, error) {
	out := map[ktypes.UID]error{}
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

func (d *exampleDriver) HandleError(_ context.Context, err error, msg string) {
	d.t.Logf("DRA driver: %s: %v", msg, err)
}

func (d *exampleDriver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
