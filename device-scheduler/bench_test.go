package devicescheduler

import (
	"fmt"
	"testing"

	"github.com/kubegpu/kubegpu/types"
)

// benchWorkload is a mix shaped like the openb trace: mostly single-GPU
// slices of a few sizes, some whole GPUs, a few multi-GPU jobs.
func benchWorkload(b *testing.B) *Workload {
	var tts []TaskType
	for i, milli := range []int32{100, 160, 220, 250, 320, 370, 460, 470, 500, 550, 590, 650, 810} {
		tts = append(tts, TaskType{Count: 1, Milli: milli, Host: Host{CPUMilli: int64(4000 + 1000*i)}, Weight: float64(20 - i)})
	}
	for _, k := range []int{1, 2, 4, 8} {
		tts = append(tts, TaskType{Count: k, Exclusive: true, Host: Host{CPUMilli: int64(8000 * k)}, Weight: float64(16 / k)})
	}
	w, err := NewWorkload(tts)
	if err != nil {
		b.Fatal(err)
	}
	return w
}

// BenchmarkEvaluate measures fit + choice + score of one pod on one 8-GPU
// node (a DGX-1 with some pods on it), for each policy and request shape.
func BenchmarkEvaluate(b *testing.B) {
	shapes := []struct {
		name string
		req  types.ContainerRequest
	}{
		{"slice", slice(30, 4096)},
		{"whole1", whole(1)},
		{"whole2", whole(2)},
		{"whole4", whole(4)},
	}
	// Named policy=.../req=... so that benchstat -col /policy sets the
	// policies side by side, with binpack (the cheapest) as the baseline.
	// kubegpu-host is the kubegpu policy with the node's host resources
	// given per evaluation, as kubegpu-scheduler gives them.
	for _, policy := range []string{PolicyBinpack, PolicyKubegpu, "kubegpu-host"} {
		for _, shape := range shapes {
			b.Run(fmt.Sprintf("policy=%s/req=%s", policy, shape.name), func(b *testing.B) {
				evaluate := func(e *Engine, n *Node, r *Request, p *Placement) error { return e.Evaluate(n, r, p) }
				engPolicy := policy
				if policy == "kubegpu-host" {
					engPolicy = PolicyKubegpu
					capacity, free := Host{CPUMilli: 96000, MemoryMiB: 512 << 10}, Host{CPUMilli: 40000, MemoryMiB: 300 << 10}
					evaluate = func(e *Engine, n *Node, r *Request, p *Placement) error {
						return e.EvaluateHost(n, r, capacity, free, p)
					}
				}
				e := newEngine(b, engPolicy)
				if engPolicy == PolicyKubegpu {
					e.useWorkload(benchWorkload(b))
				}
				n := simNode(b, e, "dgx1")
				place(b, e, n, "busy1", request(b, e, whole(1)))
				place(b, e, n, "busy2", request(b, e, slice(50, 2048)))
				r := request(b, e, shape.req)
				r.Host = Host{CPUMilli: 8000, MemoryMiB: 32 << 10}
				var p Placement
				if err := evaluate(e, n, r, &p); err != nil { // warm the caches
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := evaluate(e, n, r, &p); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
