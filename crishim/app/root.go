package app

import (
	"context"
	"flag"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/utils/version"
)

// NewCommand returns the kubegpu-crishim root command. Only main exits.
func NewCommand(ctx context.Context) *cobra.Command {
	o := &serveOptions{}
	cmd := &cobra.Command{
		Use:   "kubegpu-crishim",
		Short: "Device-aware CRI shim and device advertiser for kubegpu nodes",
		Long: `kubegpu-crishim serves CRI on --listen for kubelet and forwards every call to
the container runtime, giving each container exactly the devices the
scheduler allocated to it; it also publishes the node's devices and capacity
on its Node, with the node's own credentials. Point kubelet at it with
--container-runtime-endpoint=unix:///run/kubegpu/crishim.sock.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: false,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context())
		},
	}
	o.addFlags(cmd)
	cmd.SetContext(ctx)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	cmd.PersistentFlags().AddGoFlagSet(klogFlags)

	cmd.AddCommand(newDevicesCommand(), newUnpublishCommand(), version.NewCommand("kubegpu-crishim"))
	return cmd
}

// defaultNodeName is the host name, lower-cased as Kubernetes node names are.
func defaultNodeName() string {
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return strings.ToLower(h)
}
