// Command kubegpu shows a kubegpu cluster's GPUs and explains why pods fit
// where they do. Installed on PATH as kubectl-kubegpu it also runs as
// `kubectl kubegpu`. See cli/README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kubegpu/kubegpu/cli/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := app.NewCommand(ctx, os.Stdout, os.Stderr).Execute()
	stop()
	if err != nil {
		os.Exit(1)
	}
}
