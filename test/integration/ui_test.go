package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubegpu/kubegpu/crishim/advertiser"
	"github.com/kubegpu/kubegpu/internal/browser"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

// hostileModel is a GPU model a compromised node publishes.
const hostileModel = `<img src=x onerror="window.pwned=1">`

// startUI runs `kubegpu ui` with kubeconfig until the test ends and
// returns the URL it printed.
func startUI(t *testing.T, kubeconfig string, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "kubegpu"), append([]string{"ui", "--kubeconfig", kubeconfig,
		"--allocation-key", pubFile, "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	first := make(chan string, 1)
	go func() {
		r := bufio.NewReader(out)
		line, _ := r.ReadString('\n')
		first <- line
		_, _ = r.WriteTo(os.Stdout) // nothing more is expected
	}()
	select {
	case line := <-first:
		url, ok := strings.CutPrefix(strings.TrimSpace(line), "kubegpu ui: open ")
		if !ok {
			t.Fatalf("kubegpu ui printed %q, want its URL", line)
		}
		return url
	case <-time.After(2 * time.Minute):
		t.Fatal("kubegpu ui printed no URL within 2 minutes")
	}
	return ""
}

// TestUI: `kubegpu ui`, run as the kubegpu-viewer user against the
// cluster, in headless Chromium: the page shows each node's GPUs and the
// pods on them, a pod bound after it loaded within 2 s of its binding, a
// pending pod with the scheduler's reason and explain's, the namespace's
// GPU quota, and a model a hostile node published as text. It saves a
// screenshot as _output/ui.png.
func TestUI(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t)
	nodes := addNodes(ctx, t, "ui-dgx", "dgx1", 1)
	nodes.add(ctx, t, "ui-t4", "t4x4", 1)
	nodes.add(ctx, t, "ui-evil", "t4x4", 1)
	// The hostile node republishes its inventory with its own credentials.
	inv := nodes.invs["ui-evil-0"]
	for i := range inv.Devices {
		inv.Devices[i].Model = hostileModel
	}
	evil, err := advertiser.NewClient(nodes.kubelets["ui-evil-0"].Identity.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := advertiser.PublishInventory(ctx, evil, "ui-evil-0", inv, advertiser.Capacity(inv, advertiser.DefaultSlicesPerDevice)); err != nil {
		t.Fatal(err)
	}
	ns := namespace(ctx, t, "ui")
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "gpus"}, Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{
		corev1.ResourceName("requests." + kubeinterface.ResourceGPUShare): resource.MustParse("4000")}}}
	if _, err := cluster.Client.CoreV1().ResourceQuotas(ns).Create(ctx, quota, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	quad := gpuPod("quad", 4, 0, 0, nil)
	quad.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "ui-dgx-0"}
	createPods(ctx, t, ns, quad)
	settle(ctx, t, ns, time.Second, time.Minute)

	url := startUI(t, viewer.Kubeconfig)
	b := browser.New(t)
	if err := chromedp.Do(b, chromedp.Navigate(url), chromedp.SendKeys(chromedp.CSS("#filter"), "ui-")); err != nil {
		t.Fatal(err)
	}
	browser.Wait(b, t, time.Minute, `document.querySelectorAll("#nodes .row").length === 3`)
	browser.Wait(b, t, time.Second, `document.querySelectorAll('.row[data-node="ui-dgx-0"] .cell').length === 8 && document.querySelectorAll('.row[data-node="ui-dgx-0"] .cell.full').length === 4`)
	if err := chromedp.Do(b, chromedp.Click(chromedp.CSS(`.row[data-node="ui-dgx-0"]`))); err != nil {
		t.Fatal(err)
	}
	browser.Wait(b, t, time.Second, fmt.Sprintf(`document.getElementById("panel-node").innerText.includes(%q)`, ns+"/quad"))

	// A pod bound while the page is open shows within 2 s of its binding.
	if err := chromedp.Do(b, chromedp.Click(chromedp.CSS(`.row[data-node="ui-t4-0"]`))); err != nil {
		t.Fatal(err)
	}
	pair := gpuPod("pair", 2, 0, 0, nil)
	pair.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "ui-t4-0"}
	createPods(ctx, t, ns, pair)
	waitPod(ctx, t, ns, "pair", "bound", func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
	browser.Wait(b, t, 2*time.Second, fmt.Sprintf(`document.getElementById("panel-node").innerText.includes(%q) && document.querySelectorAll('.row[data-node="ui-t4-0"] .cell.full').length === 2`, ns+"/pair"))

	// A pod that fits nowhere: the scheduler's reason, then explain's.
	createPods(ctx, t, ns, gpuPod("too-big", 16, 0, 0, nil))
	waitPod(ctx, t, ns, "too-big", "marked unschedulable", unschedulable)
	if err := chromedp.Do(b, chromedp.Click(chromedp.CSS("#tab-pending"))); err != nil {
		t.Fatal(err)
	}
	row := fmt.Sprintf(`tr[data-pod="%s/too-big"]`, ns)
	browser.Wait(b, t, 2*time.Second, fmt.Sprintf(`(document.querySelector(%q) || {innerText: ""}).innerText.includes("nodes are available")`, row))
	if err := chromedp.Do(b, chromedp.Click(chromedp.CSS(row+" button.why"))); err != nil {
		t.Fatal(err)
	}
	browser.Wait(b, t, time.Minute, `(document.getElementById("explanation") || {innerText: ""}).innerText.includes("Fits on 0 of")`)
	browser.Wait(b, t, time.Second, `document.getElementById("explanation").innerText.includes("16 needed")`)

	// The namespace's quota.
	if err := chromedp.Do(b, chromedp.Click(chromedp.CSS("#tab-quotas"))); err != nil {
		t.Fatal(err)
	}
	browser.Wait(b, t, 2*time.Second, fmt.Sprintf(`document.getElementById("panel-quotas").innerText.includes(%q) && document.getElementById("panel-quotas").innerText.includes("2200 / 4000")`, ns))

	// The hostile node's model is text.
	if err := chromedp.Do(b, chromedp.Click(chromedp.CSS(`.row[data-node="ui-evil-0"]`))); err != nil {
		t.Fatal(err)
	}
	browser.Wait(b, t, 2*time.Second, fmt.Sprintf(`document.getElementById("panel-node").innerText.includes(%q)`, hostileModel))
	browser.Wait(b, t, time.Second, `document.querySelectorAll("img").length === 0 && window.pwned === undefined`)

	// The screenshot: the DGX-1 with the quad's GPUs marked.
	if err := chromedp.Do(b, chromedp.Click(chromedp.CSS(`.row[data-node="ui-dgx-0"]`)), chromedp.Click(chromedp.CSS("button.pod"))); err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(b, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(repoRoot, "_output")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ui.png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestUITenant: a tenant bound only to its namespace's edit role may not
// open the cluster's page, and gets its namespace's view: `kubegpu pods`
// and `kubegpu ui --tenant` show its pods, the GPUs they hold, why one
// waits, and the cluster's GPUs as the scheduler publishes them for every
// authenticated user, and nothing of another namespace's pods.
func TestUITenant(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t)
	addNodes(ctx, t, "ten-dgx", "dgx1", 1)
	ns, other := namespace(ctx, t, "ten"), namespace(ctx, t, "ten-other")
	pair, secret := gpuPod("pair", 2, 0, 0, nil), gpuPod("secret-job", 2, 0, 0, nil)
	for _, p := range []*corev1.Pod{pair, secret} {
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "ten-dgx-0"}
	}
	createPods(ctx, t, ns, pair, gpuPod("too-big", 16, 0, 0, nil))
	createPods(ctx, t, other, secret)
	settle(ctx, t, ns, time.Second, time.Minute)
	settle(ctx, t, other, time.Second, time.Minute)
	tenantsMu.Lock()
	id := tenants[ns]
	tenantsMu.Unlock()
	as := func(args ...string) (string, error) {
		out, err := exec.Command(filepath.Join(binDir, "kubegpu"), append([]string{"--kubeconfig", id.Kubeconfig, "--allocation-key", pubFile, "-n", ns}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := as("ui", "--listen", "127.0.0.1:0"); err == nil || !strings.Contains(out, "kubegpu-viewer") {
		t.Errorf("the cluster's page for a tenant: %v\n%s", err, out)
	}
	// The scheduler publishes the capacity within two of its intervals
	// (a change is written once two computations agree on it).
	var out string
	if err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
		var err error
		if out, err = as("pods"); err != nil {
			return false, fmt.Errorf("kubegpu pods: %w\n%s", err, out)
		}
		return strings.Contains(out, "Tesla V100-SXM2-16GB (nvidia.com/gpu): "), nil
	}); err != nil {
		t.Fatalf("kubegpu pods shows no capacity of the node within a minute (%v):\n%s", err, out)
	}
	for _, want := range []string{"pair", "ten-dgx-0", "main=gpu", "waiting: 0/", "The cluster: "} {
		if !strings.Contains(out, want) {
			t.Errorf("kubegpu pods lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "secret-job") {
		t.Errorf("kubegpu pods shows another namespace's pod:\n%s", out)
	}

	url := startUI(t, id.Kubeconfig, "--tenant", "-n", ns)
	b := browser.New(t)
	if err := chromedp.Do(b, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	browser.Wait(b, t, time.Minute, `document.querySelectorAll("#nodes .row").length === 1 && document.querySelectorAll('.row[data-node="ten-dgx-0"] .cell.full').length === 2`)
	browser.Wait(b, t, 30*time.Second, `document.getElementById("totals").innerText.includes("GPU nodes") && !document.getElementById("totals").innerText.startsWith("0")`)
	if err := chromedp.Do(b, chromedp.Click(chromedp.CSS("#tab-pending"))); err != nil {
		t.Fatal(err)
	}
	browser.Wait(b, t, 2*time.Second, fmt.Sprintf(`(document.querySelector('tr[data-pod="%s/too-big"]') || {innerText: ""}).innerText.includes("nodes are available") && document.querySelectorAll("button.why").length === 0`, ns))
	browser.Wait(b, t, time.Second, `!document.body.innerText.includes("secret-job")`)
}
