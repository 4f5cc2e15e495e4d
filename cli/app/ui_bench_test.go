package app

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubegpu/kubegpu/cli/ui"
	"github.com/kubegpu/kubegpu/internal/browser"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

// BenchmarkPage measures `kubegpu ui` at 50 and at 5,000 simulated DGX
// H100 nodes (8 GPUs each, a 4-GPU pod on every other node), in headless
// Chromium: rebuild-ms is the server's rebuild and publication of the
// view from the watched objects (inventories decoded before);
// first-paint-ms the page's first frame with every node,
// from navigation start; update-ms how long after the server published a
// change (one node's new pod) the page painted it.
func BenchmarkPage(b *testing.B) {
	for _, nodes := range []int{50, 5000} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) { benchPage(b, nodes) })
	}
}

// benchCluster is count DGX H100 nodes with a 4-GPU pod on every other
// one, as the watches would list them.
func benchCluster(b *testing.B, count int) (*listed, func(kubeinterface.Allocation) error) {
	presets := make([]string, count)
	for i := range presets {
		presets[i] = "dgx-h100"
	}
	c := newUICluster(b, presets...)
	l := &listed{claimsRead: true, inventories: &inventoryCache{}}
	for _, o := range c.objs {
		if n, ok := o.(*corev1.Node); ok {
			l.nodes = append(l.nodes, n)
		}
	}
	for i := 0; i < count; i += 2 {
		l.pods = append(l.pods, c.bind(b, fmt.Sprintf("job-%d", i), fmt.Sprintf("node-%d", i), 4))
	}
	benchBind = c.bind
	return l, kubeinterface.NewKeySet(c.key).Verify
}

// benchBind binds one more pod in the last benchCluster.
var benchBind func(t testing.TB, name, node string, count int64) *corev1.Pod

func benchPage(b *testing.B, count int) {
	l, verify := benchCluster(b, count)
	build := func() ui.View { return uiView(l.state(verify), l.pods, nil) }
	srv, err := ui.New(ui.Config{NoToken: true})
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	b.Cleanup(hs.Close) // after the browser's end: cleanups run last first
	b.Cleanup(srv.Close)
	build() // the inventories decoded once, as by the first rebuild
	start := time.Now()
	if err := srv.Publish(build()); err != nil {
		b.Fatal(err)
	}
	buildTime := time.Since(start)
	ctx := browser.New(b)
	var first, update float64
	b.ResetTimer()
	for i := range b.N {
		if _, err := chromedp.Run(ctx, chromedp.NavigateResponse(hs.URL+"/")); err != nil {
			b.Fatal(err)
		}
		browser.Wait(ctx, b, time.Minute, fmt.Sprintf(`window.kubegpu.updates >= 1 && document.getElementById("list-count").innerText === "%d nodes"`, count))
		v, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`window.kubegpu.firstRender`))
		if err != nil {
			b.Fatal(err)
		}
		first += v
		// One more pod on node-1, then the view published again.
		l.pods = append(l.pods, benchBind(b, fmt.Sprintf("more-%d", i), "node-1", 1))
		if err := srv.Publish(build()); err != nil {
			b.Fatal(err)
		}
		browser.Wait(ctx, b, time.Minute, `window.kubegpu.updates >= 2`)
		if v, err = chromedp.Run(ctx, chromedp.Evaluate[float64](`window.kubegpu.lastLatency`)); err != nil {
			b.Fatal(err)
		}
		update += v
	}
	b.StopTimer()
	b.ReportMetric(float64(buildTime.Milliseconds()), "rebuild-ms")
	b.ReportMetric(first/float64(b.N), "first-paint-ms")
	b.ReportMetric(update/float64(b.N), "update-ms")
}

// BenchmarkView measures one rebuild of the page's view from the watched
// objects at 5,000 DGX H100 nodes, a 4-GPU pod on every other node, the
// nodes' inventories decoded before (as after the first rebuild).
func BenchmarkView(b *testing.B) {
	l, verify := benchCluster(b, 5000)
	l.state(verify)
	b.ResetTimer()
	for range b.N {
		v := uiView(l.state(verify), l.pods, nil)
		if len(v.Nodes) != 5000 {
			b.Fatal(len(v.Nodes))
		}
	}
}
