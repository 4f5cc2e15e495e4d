package integration

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubegpu/kubegpu/kubeinterface"
)

// kubegpu runs the CLI as the user bound only to the shipped read-only role
// kubegpu-viewer, with the nodes' public key.
func kubegpu(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "kubegpu"), append([]string{"--kubeconfig", viewer.Kubeconfig, "--allocation-key", pubFile}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubegpu %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestCLIGPUsAndExplain: `kubegpu gpus` shows every GPU with what its pods
// use; `kubegpu explain` says per node why a pod fits or not.
func TestCLIGPUsAndExplain(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t)
	nodes := addNodes(ctx, t, "cli-dgx", "dgx1", 1)
	nodes.add(ctx, t, "cli-t4", "t4x4", 1)
	ns := namespace(ctx, t, "cli")
	quad := gpuPod("quad", 4, 0, 0, nil)
	quad.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "cli-dgx-0"}
	createPods(ctx, t, ns,
		quad,
		gpuPod("half", 1, 50, 0, map[string]string{kubeinterface.AnnotationModelInclude: "Tesla T4"}),
	)
	settle(ctx, t, ns, time.Second, time.Minute)
	// Fits on no node now: the DGX-1 has 4 GPUs free, the T4 box 4 in all.
	createPods(ctx, t, ns, gpuPod("too-big", 6, 0, 0, nil))
	pods := settle(ctx, t, ns, time.Second, time.Minute)
	allocs := checkAllocations(t, pods, nodes.invs)

	var rows []struct {
		Node      string   `json:"node"`
		ID        string   `json:"id"`
		UsedCores int      `json:"usedCoresPercent"`
		Exclusive bool     `json:"exclusive"`
		Pods      []string `json:"pods"`
	}
	if err := json.Unmarshal([]byte(kubegpu(t, "gpus", "-o", "json")), &rows); err != nil {
		t.Fatal(err)
	}
	used := map[string]int{}
	for _, r := range rows {
		if strings.HasPrefix(r.Node, "cli-") {
			used[strings.Join(r.Pods, ",")] += r.UsedCores
		}
	}
	if used["cli/quad"] != 400 || used["cli/half"] != 50 {
		t.Errorf("gpus -o json: cores used by pod %v, want cli/quad 400 and cli/half 50", used)
	}
	table := kubegpu(t, "gpus")
	for _, want := range []string{"NODE", "MEMORY USED/TOTAL", "cli-dgx-0", "Tesla T4", "50%", "cli/half"} {
		if !strings.Contains(table, want) {
			t.Errorf("gpus table lacks %q:\n%s", want, table)
		}
	}
	if !strings.Contains(kubegpu(t, "gpus", "-o", "wide"), allocs["quad"].Containers[0].Devices[0].UUID) {
		t.Error("gpus -o wide does not show the UUIDs")
	}
	if !strings.Contains(kubegpu(t, "gpus", "-o", "yaml"), "usedCoresPercent: 50") {
		t.Error("gpus -o yaml does not show the slice")
	}

	explain := kubegpu(t, "explain", "-n", ns, "too-big")
	for _, want := range []string{
		`container "main": 6 whole GPU(s)`,
		"cli-dgx-0  no",
		`container "main": 4 whole devices free, 6 needed`,
		`container "main": 4 healthy devices, 6 needed`,
	} {
		if !strings.Contains(explain, want) {
			t.Errorf("explain too-big lacks %q:\n%s", want, explain)
		}
	}
	fits := kubegpu(t, "explain", "-n", ns, "quad")
	if !strings.Contains(fits, "It is bound to cli-dgx-0") || !strings.Contains(fits, "yes") {
		t.Errorf("explain quad:\n%s", fits)
	}
	if !strings.HasPrefix(kubegpu(t, "version"), "kubegpu v") {
		t.Error("kubegpu version")
	}
}
