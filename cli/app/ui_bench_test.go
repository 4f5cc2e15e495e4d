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
// Chromium: build-ms is the server's rebuild of the view from the
// watched objects; first-paint-ms the page's first frame with every node,
// from navigation start; update-ms how long after the server published a
// change (one node's new pod) the page painted it.
func BenchmarkPage(b *testing.B) {
	for _, nodes := range []int{50, 5000} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) { benchPage(b, nodes) })
	}
}

func benchPage(b *testing.B, count int) {
	presets := make([]string, count)
	for i := range presets {
		presets[i] = "dgx-h100"
	}
	c := newUICluster(b, presets...)
	l := &listed{claimsRead: true}
	for _, o := range c.objs {
		switch o := o.(type) {
		case *corev1.Node:
			l.nodes = append(l.nodes, o)
		}
	}
	for i := 0; i < count; i += 2 {
		l.pods = append(l.pods, c.bind(b, fmt.Sprintf("job-%d", i), fmt.Sprintf("node-%d", i), 4))
	}
	verify := kubeinterface.NewKeySet(c.key).Verify
	build := func() ui.View { return uiView(l.state(verify), l.pods, nil) }
	srv, err := ui.New(ui.Config{NoToken: true})
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	b.Cleanup(hs.Close) // after the browser's end: cleanups run last first
	b.Cleanup(srv.Close)
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
		browser.Wait(b, ctx, time.Minute, fmt.Sprintf(`window.kubegpu.updates >= 1 && document.getElementById("list-count").innerText === "%d nodes"`, count))
		v, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`window.kubegpu.firstRender`))
		if err != nil {
			b.Fatal(err)
		}
		first += v
		// One more pod on node-1, then the view published again.
		l.pods = append(l.pods, c.bind(b, fmt.Sprintf("more-%d", i), "node-1", 1))
		if err := srv.Publish(build()); err != nil {
			b.Fatal(err)
		}
		browser.Wait(b, ctx, time.Minute, `window.kubegpu.updates >= 2`)
		if v, err = chromedp.Run(ctx, chromedp.Evaluate[float64](`window.kubegpu.lastLatency`)); err != nil {
			b.Fatal(err)
		}
		update += v
	}
	b.StopTimer()
	b.ReportMetric(float64(buildTime.Milliseconds()), "build-ms")
	b.ReportMetric(first/float64(b.N), "first-paint-ms")
	b.ReportMetric(update/float64(b.N), "update-ms")
}
