// Command kubegpu-sim replays GPU cluster traces through kubegpu's
// allocation engine and the published baselines. See device-scheduler/README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kubegpu/kubegpu/cli/sim/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := app.NewCommand(ctx).Execute()
	stop()
	if err != nil {
		os.Exit(1)
	}
}
