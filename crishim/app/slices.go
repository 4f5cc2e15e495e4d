package app

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/crishim/advertiser"
	"github.com/kubegpu/kubegpu/crishim/draclaims"
	"github.com/kubegpu/kubegpu/crishim/metrics"
	"github.com/kubegpu/kubegpu/crishim/proxy"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
)

// newSlices is the node's ResourceSlice publisher, with the PCIe root of
// each GPU read from this machine's sysfs.
func newSlices(cs kubernetes.Interface, node string, m *metrics.Shim) *advertiser.Slices {
	return advertiser.NewSlices(cs, node, dra.Options{PCIeRoot: pcieRoot}, m)
}

// newGuard is the node's guard against GPUs that other DRA drivers' claims
// hold, asking kubelet's PodResources API at endpoint (empty: not asked).
func newGuard(node, endpoint string) (*draclaims.Guard, error) {
	if endpoint == "" {
		return draclaims.New(node, nil), nil
	}
	k, err := draclaims.DialKubelet(endpoint)
	if err != nil {
		return nil, err
	}
	return draclaims.New(node, k), nil
}

// draClaims is g for CreateContainer; nil without one (a nil *Guard in
// the interface would not be nil).
func draClaims(g *draclaims.Guard) proxy.DRAClaims {
	if g == nil {
		return nil
	}
	return g
}

// unpublishInBackground removes the node's ResourceSlices that an earlier
// shim published, now that publishing is off: retried every interval until
// it succeeds or ctx ends. It returns a function that waits for it.
func unpublishInBackground(ctx context.Context, cfg *rest.Config, node string, interval time.Duration) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		logger := klog.FromContext(ctx)
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			logger.Error(err, "Cannot remove the node's ResourceSlices")
			return
		}
		for {
			n, err := advertiser.DeleteSlices(ctx, cs, node)
			if err == nil {
				if n > 0 {
					logger.Info("Publishing ResourceSlices is off: removed the node's", "slices", n)
				}
				return
			}
			logger.Error(err, "Cannot remove the node's ResourceSlices (publishing is off); retrying", "in", interval)
			select {
			case <-ctx.Done():
				return
			case <-time.After(interval):
			}
		}
	}()
	return func() { <-done }
}

// pcieRoot is the PCIe root complex of a PCI bus ID, from sysfs.
func pcieRoot(pciBusID string) (string, error) {
	a, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(pciBusID)
	if err != nil {
		return "", err
	}
	if a.Value.StringValue == nil {
		return "", fmt.Errorf("no PCIe root for %s", pciBusID)
	}
	return *a.Value.StringValue, nil
}

// newUnpublishCommand removes the node's ResourceSlices, for an uninstall:
// a running shim would publish them again.
func newUnpublishCommand() *cobra.Command {
	var kubeconfig, node string
	cmd := &cobra.Command{
		Use:   "unpublish",
		Short: "Remove what the shim published for the node: its ResourceSlices of driver " + dra.DriverName + ", and its GPUs on the Node (run when uninstalling the shim)",
		Long: `unpublish deletes the ResourceSlices that kubegpu-crishim published for this
node, and removes from the Node the inventory annotation, the extended
resources (nvidia.com/gpu and kubegpu.io/*, capacity and allocatable) and
the conditions kubegpu.io/DevicesReady and kubegpu.io/DRAConflict: a node
whose shim is gone advertises no GPUs that kubegpu served, so that another
allocator (a DRA driver) can serve them. Run it after the shim has stopped,
with the node's credentials: the Node authorizer lets a node delete only
its own slices. Deleting the Node removes the slices as well (the Node owns
them).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if node == "" {
				return fmt.Errorf("--node-name is required (the host name could not be read)")
			}
			cfg, err := restConfig(kubeconfig)
			if err != nil {
				return err
			}
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			n, err := advertiser.DeleteSlices(cmd.Context(), cs, node)
			if err != nil {
				return err
			}
			klog.FromContext(cmd.Context()).Info("Removed the node's ResourceSlices", "node", node, "driver", dra.DriverName, "slices", n)
			client, err := advertiser.NewClient(cfg)
			if err != nil {
				return err
			}
			if err := advertiser.Withdraw(cmd.Context(), client, node); err != nil {
				return err
			}
			klog.FromContext(cmd.Context()).Info("Removed the node's GPU inventory, capacity and conditions", "node", node)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig with the node's credentials (default: in-cluster configuration)")
	f.StringVar(&node, "node-name", defaultNodeName(), "the node's name")
	return cmd
}
