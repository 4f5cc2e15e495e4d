package app

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/utils/version"
)

// NewCommand returns the kubegpu root command. Only main exits.
func NewCommand(ctx context.Context, out, errOut io.Writer) *cobra.Command {
	flags := genericclioptions.NewConfigFlags(true)
	cmd := &cobra.Command{
		Use:   "kubegpu",
		Short: "Show a kubegpu cluster's GPUs and why pods fit where they do",
		Long: `kubegpu reads the devices kubegpu-crishim publishes on the nodes and the
allocations kubegpu-scheduler writes on the pods. It takes kubectl's
kubeconfig flags, and runs as "kubectl kubegpu" when installed on PATH as
kubectl-kubegpu.`,
		SilenceUsage: true,
		RunE:         func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.SetContext(ctx)
	cmd.SetOut(out)
	cmd.SetErr(errOut)
	flags.AddFlags(cmd.PersistentFlags())
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	cmd.PersistentFlags().AddGoFlag(klogFlags.Lookup("v"))
	client := func() (kubernetes.Interface, error) {
		cfg, err := flags.ToRESTConfig()
		if err != nil {
			return nil, fmt.Errorf("kubeconfig: %w", err)
		}
		cfg.UserAgent = "kubegpu/" + version.Get().GitVersion
		return kubernetes.NewForConfig(cfg)
	}
	namespace := func() string {
		ns, _, err := flags.ToRawKubeConfigLoader().Namespace()
		if err != nil || ns == "" {
			return "default"
		}
		return ns
	}
	var keyFile string
	cmd.PersistentFlags().StringVar(&keyFile, "allocation-key", "",
		"the scheduler's public keys (PEM, as the nodes hold them): count only allocations signed by one of them; without it, allocations are checked against the pod (UID included) and node they name only")
	key := func() (*kubeinterface.KeySet, error) {
		if keyFile == "" {
			return nil, nil
		}
		return kubeinterface.LoadVerifyKeys(keyFile)
	}
	cmd.AddCommand(newGPUsCommand(client, key), newUICommand(client, namespace, key), newPodsCommand(client, namespace, key), newExplainCommand(client, namespace, key), newKeysCommand(), version.NewCommand("kubegpu"))
	return cmd
}
