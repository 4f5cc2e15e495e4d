package app

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/internal/browser"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache/cachetest"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// hostileModel is what a compromised node may publish as a GPU's model.
const hostileModel = `<img src=x onerror="window.pwned=1">`

// uiCluster is a small cluster: nodes of the presets given, each with a
// bound pod on its first GPUs, and the key that signed their allocations.
type uiCluster struct {
	objs  []runtime.Object
	nodes []*corev1.Node
	key   *kubeinterface.Key
	cache *devicecache.Cache
}

func newUICluster(t testing.TB, presets ...string) *uiCluster {
	t.Helper()
	c := &uiCluster{key: cachetest.Key(t)}
	c.cache = devicecache.New(devicecache.Config{Engine: cachetest.Engine(t), Keys: kubeinterface.NewKeySet(c.key), Staleness: time.Hour})
	for i, preset := range presets {
		n := cachetest.Node(t, fmt.Sprintf("node-%d", i), preset)
		c.cache.UpdateNode(klog.Background(), n)
		c.cache.UpdateLease(cachetest.Lease(n.Name, time.Now()), false)
		c.nodes = append(c.nodes, n)
		c.objs = append(c.objs, n, cachetest.Lease(n.Name, time.Now()))
	}
	return c
}

// bind places a pod asking for count GPUs on node, as the scheduler
// would, and returns it bound with its signed allocation.
func (c *uiCluster) bind(t testing.TB, name, node string, count int64) *corev1.Pod {
	t.Helper()
	p := cachetest.GPUPod(name, count, 0, time.Now())
	req, err := objects.PodRequest(p)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.cache.Engine().NewRequest(req, devicescheduler.Host{})
	if err != nil {
		t.Fatal(err)
	}
	alloc, err := c.cache.Reserve(p, node, r, devicescheduler.Host{}, devicescheduler.Host{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := cachetest.BoundWith(t, c.key, p, alloc)
	b.Status.Phase = corev1.PodRunning
	return b
}

// serveUI runs `kubegpu ui` over client until the test ends and returns
// the URL it printed.
func serveUI(t *testing.T, client *fake.Clientset, key *kubeinterface.Key) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	cmd := &cobra.Command{}
	cmd.SetContext(ctx)
	cmd.SetOut(&out)
	o := uiOptions{listen: "127.0.0.1:0", explain: explainOptions{key: kubeinterface.NewKeySet(key)}}
	done := make(chan error, 1)
	go func() { done <- o.run(cmd, client) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("kubegpu ui: %v", err)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if line, ok := strings.CutPrefix(out.String(), "kubegpu ui: open "); ok {
			return strings.TrimSpace(line)
		}
		select {
		case err := <-done:
			t.Fatalf("kubegpu ui ended: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal("kubegpu ui printed no URL within 30s")
	return ""
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestPageInBrowser: `kubegpu ui`'s page, in headless Chromium, shows each
// node's GPUs and their pods, shows a pod bound after it loaded within
// 2 s, lists a pending pod with the scheduler's message and explain's
// reasons, shows a model a hostile node published as text, and is driven
// by the keyboard.
func TestPageInBrowser(t *testing.T) {
	c := newUICluster(t, "dgx1", "t4x4", "t4x4")
	inv, err := objects.NodeInventory(c.nodes[2])
	if err != nil {
		t.Fatal(err)
	}
	for i := range inv.Devices {
		inv.Devices[i].Model = hostileModel
	}
	if err := objects.SetNodeInventory(c.nodes[2], inv); err != nil {
		t.Fatal(err)
	}
	quad := c.bind(t, "quad", "node-0", 4)
	pending := cachetest.GPUPod("too-big", 16, 0, time.Now())
	pending.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: corev1.PodReasonUnschedulable, Message: "0/3 nodes are available: 3 GPUs: not enough GPUs."}}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}
	client := fake.NewClientset(append(c.objs, quad, pending, ns)...)
	url := serveUI(t, client, c.key)
	ctx := browser.New(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	browser.Wait(ctx, t, 30*time.Second, `document.querySelectorAll("#nodes .row").length === 3`)
	browser.Wait(ctx, t, time.Second, `document.querySelectorAll('.row[data-node="node-0"] .cell').length === 8 && document.querySelectorAll('.row[data-node="node-0"] .cell.full').length === 4`)

	// The keyboard: the list takes the focus, arrows choose nodes.
	if err := chromedp.Do(ctx, chromedp.Focus(chromedp.CSS("#nodes")), chromedp.KeyEvent(kb.ArrowDown)); err != nil {
		t.Fatal(err)
	}
	browser.Wait(ctx, t, time.Second, `document.querySelector('.row[data-node="node-0"]').getAttribute("aria-selected") === "true" && document.getElementById("panel-node").innerText.includes("ns/quad")`)

	// A hostile model is text: no element made of it, no script run.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`.row[data-node="node-2"]`))); err != nil {
		t.Fatal(err)
	}
	browser.Wait(ctx, t, time.Second, fmt.Sprintf(`document.getElementById("panel-node").innerText.includes(%q)`, hostileModel))
	browser.Wait(ctx, t, time.Second, `document.querySelectorAll("img").length === 0 && window.pwned === undefined`)

	// A pod bound now shows within 2 s.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`.row[data-node="node-1"]`))); err != nil {
		t.Fatal(err)
	}
	half := c.bind(t, "pair", "node-1", 2)
	if _, err := client.CoreV1().Pods("ns").Create(context.Background(), half, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	browser.Wait(ctx, t, 2*time.Second, `document.getElementById("panel-node").innerText.includes("ns/pair") && document.querySelectorAll('.row[data-node="node-1"] .cell.full').length === 2`)

	// The pending pod, what the scheduler said, and explain's reasons.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#tab-pending"))); err != nil {
		t.Fatal(err)
	}
	browser.Wait(ctx, t, time.Second, `document.getElementById("panel-pending").innerText.includes("ns/too-big") && document.getElementById("panel-pending").innerText.includes("not enough GPUs")`)
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`tr[data-pod="ns/too-big"] button.why`))); err != nil {
		t.Fatal(err)
	}
	browser.Wait(ctx, t, 30*time.Second, `(document.getElementById("explanation") || {innerText: ""}).innerText.includes("Fits on 0 of 3 nodes")`)
	browser.Wait(ctx, t, time.Second, `document.getElementById("explanation").innerText.includes("16 needed")`)
	if dir := os.Getenv("KUBEGPU_SCREENSHOT_DIR"); dir != "" {
		if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`.row[data-node="node-0"]`)), chromedp.Click(chromedp.CSS(`button.pod`))); err != nil {
			t.Fatal(err)
		}
		png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "ui-unit.png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
