package plugin

import (
	"fmt"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
)

// BenchmarkCacheMemory reports the device cache's heap per node: 1000 nodes
// with heartbeats and four 1-GPU pods bound on each.
func BenchmarkCacheMemory(b *testing.B) {
	const nodes = 1000
	for _, preset := range []string{"dgx1", "dgx-h100", "t4x4"} {
		b.Run(preset, func(b *testing.B) {
			var perNode float64
			for i := 0; i < b.N; i++ {
				objs := make([]*corev1.Node, nodes)
				for j := range objs {
					objs[j] = testNode(&testing.T{}, fmt.Sprintf("node-%04d", j), preset)
				}
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				c, _ := testCache(&testing.T{})
				logger := klog.Background()
				r := wholeRequest(&testing.T{}, c, 1)
				for j, n := range objs {
					c.updateNode(logger, n)
					c.updateLease(testLease(n.Name, testNow), false)
					for k := 0; k < 4; k++ {
						if _, err := c.reserve(testPod(fmt.Sprintf("%d-%d", j, k)), n.Name, r, noHost, noHost); err != nil {
							b.Fatal(err)
						}
					}
				}
				var pl devicescheduler.Placement
				in := c.evalInput(shapeKey{1}, wholeRequest(&testing.T{}, c, 1))
				for _, n := range objs {
					_, _ = c.evaluate(n.Name, &in, noHost, noHost, &pl)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perNode = float64(after.HeapAlloc-before.HeapAlloc) / nodes
				runtime.KeepAlive(c)
			}
			b.ReportMetric(perNode, "B/node")
		})
	}
}
