package claimplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	resourceapi "k8s.io/api/resource/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/kubeinterface/dra"
)

// Plugin serves Store to kubelet as the DRA driver dra.DriverName.
type Plugin struct {
	store  *Store
	helper *kubeletplugin.Helper
}

var _ kubeletplugin.DRAPlugin = (*Plugin)(nil)

// Options say where kubelet is and who the node is.
type Options struct {
	// KubeletRootDir is kubelet's --root-dir (/var/lib/kubelet): the
	// plugin registers in its plugins_registry and serves from
	// plugins/gpu.kubegpu.io.
	KubeletRootDir string
	// Client carries the node's credentials: kubelet's helper reads the
	// claims with it.
	Client kubernetes.Interface
}

// Start registers the plugin with kubelet and serves until Stop.
func Start(ctx context.Context, store *Store, opts Options) (*Plugin, error) {
	registry := filepath.Join(opts.KubeletRootDir, "plugins_registry")
	data := filepath.Join(opts.KubeletRootDir, "plugins", dra.DriverName)
	for _, dir := range []string{registry, data} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("DRA kubelet plugin: %w", err)
		}
	}
	p := &Plugin{store: store}
	h, err := kubeletplugin.Start(ctx, p, kubeletplugin.DriverName(dra.DriverName), kubeletplugin.NodeName(store.Node),
		kubeletplugin.KubeClient(opts.Client), kubeletplugin.RegistrarDirectoryPath(registry),
		kubeletplugin.PluginDataDirectoryPath(data), kubeletplugin.HealthService(false))
	if err != nil {
		return nil, fmt.Errorf("DRA kubelet plugin: %w", err)
	}
	p.helper = h
	return p, nil
}

// Stop stops serving kubelet.
func (p *Plugin) Stop() {
	if p != nil && p.helper != nil {
		p.helper.Stop()
	}
}

// PrepareResourceClaims verifies each claim's signed allocation and writes
// its spec file; a claim that fails gets its own error, which kubelet
// shows on the pod and retries.
func (p *Plugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[ktypes.UID]kubeletplugin.PrepareResult, error) {
	logger := klog.FromContext(ctx)
	out := make(map[ktypes.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		res, err := p.prepare(c)
		if err != nil {
			logger.Error(err, "Refused to prepare a kubegpu ResourceClaim", "claim", klog.KObj(c))
			out[c.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		logger.V(2).Info("Prepared kubegpu ResourceClaim", "claim", klog.KObj(c), "devices", len(res.Devices))
		out[c.UID] = res
	}
	return out, nil
}

func (p *Plugin) prepare(c *resourceapi.ResourceClaim) (kubeletplugin.PrepareResult, error) {
	if c.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{}, fmt.Errorf("%w %s: not allocated", ErrInvalid, klog.KObj(c))
	}
	pr, err := p.store.verify(c.UID, c.Namespace, c.Name, c.Status.Allocation)
	if err != nil {
		return kubeletplugin.PrepareResult{}, err
	}
	if err := p.store.write(c.UID, pr); err != nil {
		return kubeletplugin.PrepareResult{}, fmt.Errorf("claim %s: write its CDI spec: %w", klog.KObj(c), err)
	}
	var res kubeletplugin.PrepareResult
	for i, r := range pr.results {
		res.Devices = append(res.Devices, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			CDIDeviceIDs: []string{CDIKind + "=" + pr.names[i]}})
	}
	return res, nil
}

// UnprepareResourceClaims removes the claims' spec files.
func (p *Plugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[ktypes.UID]error, error) {
	out := make(map[ktypes.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = p.store.remove(c.UID)
		klog.FromContext(ctx).V(2).Info("Unprepared kubegpu ResourceClaim", "claim", c.NamespacedName, "err", out[c.UID])
	}
	return out, nil
}

// HandleError logs the helper's background errors.
func (p *Plugin) HandleError(ctx context.Context, err error, msg string) {
	if errors.Is(err, context.Canceled) {
		return
	}
	klog.FromContext(ctx).Error(err, "DRA kubelet plugin: "+msg)
}

// WatchHealthStatus is not supported: device health is published on the
// node's ResourceSlices (taint dra.TaintUnhealthy), not streamed to
// kubelet.
func (p *Plugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
