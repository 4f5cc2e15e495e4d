package app

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestPlacementJSON replays a small trace under a baseline and both kubegpu
// policies, which run the engine over the simulated GPUs the command gives
// the simulator, and reads back a JSON line per policy.
func TestPlacementJSON(t *testing.T) {
	dir := t.TempDir()
	nodes, pods := filepath.Join(dir, "nodes.csv"), filepath.Join(dir, "pods.csv")
	writeFile(t, nodes, "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,8,G2\nn1,32000,131072,4,T4\nn2,32000,131072,0,\n")
	writeFile(t, pods, "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"+
		"p0,4000,8192,1,500,\np1,8000,16384,1,1000,G2\np2,16000,32768,4,1000,\np3,2000,4096,1,250,T4\np4,1000,1024,0,0,\n")
	var out, errOut bytes.Buffer
	cmd := NewCommand(context.Background())
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"placement", "--nodes", nodes, "--pods", pods, "--policies", "fgd,kubegpu,kubegpu-online",
		"--seeds", "2", "--json", "--progress", "never", "--plot", filepath.Join(dir, "alloc.png")})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("placement: %v (stderr: %s)", err, errOut.String())
	}
	dec := json.NewDecoder(&out)
	var got []string
	for dec.More() {
		var p policyJSON
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if len(p.Seeds) != 2 || p.Seeds[0].Placed == 0 || p.Seeds[1].Placed == 0 {
			t.Errorf("%s: seeds %+v, want 2 that placed pods", p.Policy, p.Seeds)
		}
		got = append(got, p.Policy)
	}
	if want := []string{"fgd", "kubegpu", "kubegpu-online"}; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("policies %v, want %v", got, want)
	}
	if png, err := os.ReadFile(filepath.Join(dir, "alloc.png")); err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Errorf("plot: %v, not a PNG", err)
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}
