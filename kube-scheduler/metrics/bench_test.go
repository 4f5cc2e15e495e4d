package metrics

import (
	"fmt"
	"testing"

	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/klog/v2"
)

// BenchmarkGPUMetricsScrape is a registry's Gather of the GPU metrics of
// 5,000 DGX-1 nodes (40,000 GPUs, five series each with gpuMetrics: PerGPU,
// none with PerModel), what a Prometheus scrape of the scheduler costs
// beside the upstream metrics.
func BenchmarkGPUMetricsScrape(b *testing.B) {
	c, _ := testCache(&testing.T{})
	logger := klog.Background()
	r := wholeRequest(&testing.T{}, c, 1)
	for i := range 5000 {
		n := testNode(&testing.T{}, fmt.Sprintf("kubegpu-perf-%05x", i*7919), "dgx1")
		c.UpdateNode(logger, n)
		c.UpdateLease(testLease(n.Name, testNow), false)
		if _, err := c.Reserve(testPod(fmt.Sprint(i)), n.Name, r, noHost, noHost, nil); err != nil {
			b.Fatal(err)
		}
	}
	for _, mode := range []string{"PerGPU", "PerModel"} {
		b.Run(mode, func(b *testing.B) {
			g := &gpuCollector{}
			g.report(c, mode == "PerModel")
			reg := k8smetrics.NewKubeRegistry()
			reg.CustomMustRegister(g)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := reg.Gather(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
