// Command kubegpu-scheduler is upstream kube-scheduler with the kubegpu
// framework plugins registered: KubeGPU, and DynamicResourcesFacade (the
// stock DynamicResources plugin with kubegpu's ResourceClaims hidden from
// it). It takes every kube-scheduler flag; enable the plugins in a
// KubeSchedulerConfiguration (see kube-scheduler/config/).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json, as upstream
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/kubegpu/kubegpu/kube-scheduler/plugin"
)

func main() {
	command := app.NewSchedulerCommand(
		app.WithPlugin(plugin.Name, plugin.NewFactory().New),
		app.WithPlugin(plugin.FacadeName, plugin.NewFacade),
	)
	os.Exit(cli.Run(command))
}
