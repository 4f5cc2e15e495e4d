// Command kubegpu-crishim runs on every GPU node: a CRI proxy between kubelet
// and containerd that gives containers their allocated devices, and the
// advertiser that publishes the node's devices. See crishim/README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/crishim/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := app.NewCommand(ctx).Execute()
	stop()
	klog.Flush()
	if err != nil {
		os.Exit(1)
	}
}
